"""``eop verify``: recompute a pipeline's output from its committed input and compare.

The check trusts none of eop's own records but one: where the progress group
``G`` says visible output ends (the default end of the input range).  It reads
the source range as a Spark *batch* job, applies the pipeline's transform,
reads the sink topic as a ``read_committed`` reader, and compares the two as
multisets of (key, value).  It never writes to the pipeline's topics or groups.

* :mod:`eop_spark.verify.report`: the tally and the printed report (pure);
* :mod:`eop_spark.verify.ranges`: the input and sink ranges, one consistent cut (Kafka);
* :mod:`eop_spark.verify.recount`: the batch recount and the comparison (Spark).
"""
