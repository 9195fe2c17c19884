"""The exactly-once core: the progress group ``G``, the two sinks, and what keeps them exact.

Read docs/exactly-once.md first.  The modules, roughly in the order a batch
meets them:

* :mod:`.sink_settings`: what every sink transaction needs (topic, ids, G);
  taking every transactional id over when a run starts;
* :mod:`.progress_group`: reading ``G``'s stable committed offsets (and plain
  commits to a group no member joins);
* :mod:`.offsets_log`: the Spark checkpoint's offsets log (what batch ``N`` reads);
* :mod:`.batch_markers`: the markers ``G``'s offsets carry, telling a replay apart;
* :mod:`.partitioned` and :mod:`.coordinated`: the two commit modes;
* :mod:`.sink_contract`: the output columns and how rows become records;
* :mod:`.retries`: which failures a fresh attempt of a batch may fix;
* :mod:`.batch_result`: what a sink returns for a batch;
* :mod:`.generation_guards` and :mod:`.stateless_reset`: a new checkpoint
  generation (refusals, and the deliberate reprocess);
* :mod:`.keep_alive`: keeping ``G``'s offsets from expiring;
* :mod:`.cross_cluster`: source and sink on different clusters.

The core never imports :mod:`eop_spark.speedups`: the runner plugs those in
(an Arrow path for the producers, the producer hub as the partitioned tasks'
hand-off), and the core works, slower, without them.
"""
