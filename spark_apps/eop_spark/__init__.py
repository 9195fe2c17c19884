"""eop's data plane: the pipeline runner and the exactly-once Kafka sinks.

Never imports the operator (``eop_operator``); the operator imports the spec
models from here.
"""
