"""eop's data plane: the pipeline runner and the exactly-once Kafka sinks.

Rooms, each importing only the ones before it (the import contracts in
``pyproject.toml`` hold this; docs/architecture.md maps them):

1. :mod:`eop_spark.contract`: the definitions the operator shares (spec
   models, run config, errors, termination reasons, offsets, progress names);
2. :mod:`eop_spark.kafka`: the Kafka clients (settings, the transactional
   producer, preflight checks);
3. :mod:`eop_spark.exactly_once`: the progress group and the two sinks;
4. :mod:`eop_spark.query`: the source stream, the transform, the commit mode;
5. :mod:`eop_spark.runtime`: the runner process, its Spark session, logs and
   metrics; it plugs in :mod:`eop_spark.speedups`, which sit beside the
   layers (they may use the core, the core never uses them).

Never imports the operator (``eop_operator``); the operator imports only
:mod:`eop_spark.contract`.
"""
