"""Health from progress: the progress group's offsets against the source's end offsets.

``progress`` reads offsets from Kafka (I/O, in a thread); ``stall`` decides
lag, input rate and whether a pipeline is stalled (pure, unit-tested);
``report`` turns a verdict into the status the health monitor writes (pure);
``keep_alive`` re-commits ``G`` while no driver runs.  The daemon that runs
the checks is ``controller.health_monitor``.
"""
