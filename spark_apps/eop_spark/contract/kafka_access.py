"""The operator's Kafka access: what its health checks read and refresh, in the data plane's code.

The operator reads a pipeline's progress group ``G`` (its lag check, its
status), asks the clusters for their ids (where ``G`` keeps its offsets),
re-commits ``G`` while no driver runs (invariant 6), and asks the clusters
what only they can tell of a spec before a driver starts (the runner's own
preflight refusals: a sink topic the source reads, a transaction timeout above
the sink brokers' maximum).  It does so with the very
code the runner uses, so both read and write ``G`` the same way; this module is
the one door to that code: every name here is defined in the Kafka room or in
the exactly-once core, and the operator imports them from here only.

Unlike the rest of :mod:`eop_spark.contract`, this module is not pure: it sits
on top of :mod:`eop_spark.kafka` and :mod:`eop_spark.exactly_once` (the import
contracts in ``pyproject.toml`` allow it, and nothing in the data plane imports
it).
"""

from __future__ import annotations

from eop_spark.exactly_once.keep_alive import (
    offsets_retention_ms,
    refresh_interval_s,
    refresh_without_runner,
)
from eop_spark.exactly_once.progress_group import ProgressGroup, commit_offsets
from eop_spark.exactly_once.sink_settings import SinkSettings
from eop_spark.kafka.client_config import (
    secret_text,
    sink_librdkafka_config,
    source_librdkafka_config,
)
from eop_spark.kafka.preflight import (
    cluster,
    cluster_id,
    refuse_long_transactions,
    refuse_own_output,
)

__all__ = [
    "ProgressGroup",
    "SinkSettings",
    "cluster",
    "cluster_id",
    "commit_offsets",
    "offsets_retention_ms",
    "refresh_interval_s",
    "refresh_without_runner",
    "refuse_long_transactions",
    "refuse_own_output",
    "secret_text",
    "sink_librdkafka_config",
    "source_librdkafka_config",
]
