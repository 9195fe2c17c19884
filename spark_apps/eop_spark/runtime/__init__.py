"""The runtime: one runner process from start to stop, and what it needs around the query.

* :mod:`.runner`: ``run`` and :class:`~.runner.PipelineRun`, the life of a run
  (checks, Spark, the query, a graceful stop);
* :mod:`.query_start`: the six steps that start the query, in their order;
* :mod:`.batch_gate`: the foreachBatch entry point a graceful stop waits on;
* :mod:`.session`: the SparkSession (jars, logs, loopback, the worker daemon);
* :mod:`.metrics` and :mod:`.batch_log`: counters, ``/metrics``, one log line per batch;
* :mod:`.jars`: where the connector jars are;
* :mod:`.executor`: ``eop executor``, what an executor pod runs;
* :mod:`.checkpoint_delete`: ``eop checkpoint delete``;
* :mod:`.class_archive_training`: building the JVM class archive.

The runtime is where the speed-ups (:mod:`eop_spark.speedups`) are plugged in.
"""
