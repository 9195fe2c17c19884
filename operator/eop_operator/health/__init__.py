"""Health from progress: the progress group's offsets against the source's end offsets.

``progress`` reads offsets from Kafka (I/O, in a thread); ``stall`` decides
lag, input rate and whether a pipeline is stalled (pure, unit-tested).
"""
