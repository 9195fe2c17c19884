"""The contract: what the operator may import from the data plane, and what every room builds on.

Pure definitions, no I/O: the pipeline models (:mod:`.spec`, which the
operator's API composes), the settings eop owns in them (:mod:`.owned_settings`),
the resolved run configuration and the pipeline's
identities (:mod:`.run_config`), the errors and exit codes of a runner
(:mod:`.errors`), the reasons in its termination message (:mod:`.termination`),
offset arithmetic (:mod:`.offsets`), the names the progress group keeps its
offsets under (:mod:`.progress_names`) and the redaction of Secret values from
messages (:mod:`.redaction`).

One module is not pure, on purpose: :mod:`.kafka_access`, the operator's door
to the data plane's Kafka code (reading and refreshing the progress group).
Nothing in the data plane imports it.
"""
