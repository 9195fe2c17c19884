"""Speed-ups: nothing about exactly-once depends on them, each only makes a run cheaper.

* :mod:`.worker_daemon`: the daemon Spark forks its Python workers from;
* :mod:`.producer_hub`: one process per executor that keeps the partitioned
  sink's producers, whichever worker runs a task;
* :mod:`.native_produce`: Arrow columns into librdkafka with one call per batch;
* :mod:`.malloc_tuning`: glibc keeps freed memory for the next batch;
* :mod:`.class_archive`: a class-data-sharing archive a restarted JVM maps.

The runtime plugs them in; they import the core (the hub runs the partitioned
tasks' steps) and never the runtime.
"""
