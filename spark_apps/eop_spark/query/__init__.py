"""The query: the Kafka source stream, the user's transform, and which commit mode it allows.

* :mod:`.source`: Spark's Kafka source, and where a new checkpoint generation
  starts reading (from the progress group);
* :mod:`.transform`: the spec's SQL or Python callable, checked against the
  sink's output contract;
* :mod:`.commit_mode`: partitioned or coordinated, from the SQL, the analysed
  plan and the first batch's physical plan;
* :mod:`.state_guards`: whether the query keeps state, and what that forbids.
"""
