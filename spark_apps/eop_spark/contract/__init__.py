"""The contract: what the operator may import from the data plane, and what every room builds on.

Pure definitions, no I/O: the pipeline models (:mod:`.spec`, which the
operator's API composes), the settings eop owns in them (:mod:`.owned_settings`),
the resolved run configuration and the pipeline's
identities (:mod:`.run_config`), the errors and exit codes of a runner
(:mod:`.errors`), the reasons in its termination message (:mod:`.termination`),
offset arithmetic (:mod:`.offsets`), the names the progress group keeps its
offsets under (:mod:`.progress_names`) and the redaction of Secret values from
messages (:mod:`.redaction`).

It imports no other room of the data plane.  The operator's door to the data
plane's Kafka code (the progress group read and refreshed, the clusters asked)
is a room of its own, :mod:`eop_spark.operator_access`.
"""
