"""The operator's door to the data plane: the progress group read and refreshed, clusters asked.

The operator reads a pipeline's progress group ``G`` (its lag check, its
status), re-commits ``G`` while no driver runs (invariant 6), and asks the
clusters what only they can tell of a spec before a driver starts (the
runner's own preflight refusals).  It does so with the very code the runner
uses, so both read and write ``G`` the same way.  This room is the operator's
one door to that code, a small facade: it takes what the operator has (the
spec's Kafka sections, the client settings made from them and the Secrets,
the pipeline's identity) and builds the data plane's values itself
(:class:`~eop_spark.exactly_once.progress_group.ProgressGroup`,
:class:`~eop_spark.exactly_once.sink_settings.SinkSettings`).

* client settings: :func:`secret_text`, :func:`source_librdkafka_config`,
  :func:`sink_librdkafka_config` (the runner's rules for a Secret's keys);
* where ``G`` keeps its offsets, from the clusters' ids: :func:`ask_progress_names`;
* ``G`` read: :func:`committed_offsets`;
* ``G`` refreshed without a runner: :func:`refresh_progress`,
  :func:`refresh_interval`, :func:`refresh_lag_view`;
* the clusters asked before a driver starts: :func:`check_clusters`.

Every call blocks (the operator runs them in worker threads).  The room sits
above :mod:`eop_spark.kafka` and :mod:`eop_spark.exactly_once`; only the
operator imports it (the import contracts in ``pyproject.toml``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from eop_spark.contract.errors import ConfigError
from eop_spark.contract.offsets import Offsets, TopicPartition
from eop_spark.contract.progress_names import ProgressNames, progress_names
from eop_spark.contract.spec import KafkaSink
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
from eop_spark.kafka.preflight import check_clusters, cluster_id

__all__ = [
    "ask_progress_names",
    "check_clusters",
    "committed_offsets",
    "refresh_interval",
    "refresh_lag_view",
    "refresh_progress",
    "secret_text",
    "sink_librdkafka_config",
    "source_librdkafka_config",
]


def ask_progress_names(
    group: str, source_cluster: str | None, sink_config: Mapping[str, str], timeout: float
) -> ProgressNames:
    """Where ``group`` keeps its offsets, as the runner decides it: from the clusters' ids.

    ``source_cluster``: the source cluster's id (its metadata tells it); the
    sink cluster's is asked here.  Raises ``EnvironmentNotReady`` when the
    sink cluster does not answer.
    """
    return progress_names(group, source_cluster, cluster_id(sink_config, "sink", timeout))


def committed_offsets(
    names: ProgressNames,
    sink_config: Mapping[str, str],
    partitions: Iterable[TopicPartition],
    timeout: float,
) -> Offsets:
    """``G``'s stable committed offsets of ``partitions`` (absent: never committed).

    Raises :class:`ConfigError` when librdkafka refuses ``sink_config``, and
    the reader's ``EopError`` when ``G`` cannot be read within ``timeout``.
    """
    from confluent_kafka import KafkaException

    try:
        progress = ProgressGroup(names, sink_config)
    except KafkaException as exc:
        raise ConfigError(f"invalid sink client settings: {exc}") from None
    try:
        return progress.committed(partitions, timeout=timeout)
    finally:
        progress.close()


def refresh_progress(
    names: ProgressNames,
    sink: KafkaSink,
    sink_config: Mapping[str, str],
    transactional_id_prefix: str,
    partitions: Iterable[TopicPartition],
) -> Offsets:
    """Re-commit what ``G`` holds of ``partitions`` for a pipeline without a runner.

    Every transactional id of the pipeline is fenced first, then each
    partition is re-committed under its own id, only if ``G`` did not move
    since it was read (:func:`~eop_spark.exactly_once.keep_alive.refresh_without_runner`).
    Returns the offsets re-committed.
    """
    progress = ProgressGroup(names, sink_config)
    try:
        settings = SinkSettings(
            topic=sink.topic,
            client_config=dict(sink_config),
            transactional_id_prefix=transactional_id_prefix,
            transaction_timeout=sink.transaction_timeout,
            progress=names,
            group_metadata=progress.group_metadata(),
        )
        return refresh_without_runner(settings, progress, partitions)
    finally:
        progress.close()


def refresh_interval(sink_config: Mapping[str, str]) -> float:
    """Seconds between two refreshes of ``G``, from the sink brokers' offsets retention."""
    return refresh_interval_s(offsets_retention_ms(sink_config))


def refresh_lag_view(group: str, offsets: Offsets, source_config: Mapping[str, str]) -> None:
    """Re-commit ``offsets`` to ``G``'s lag view on the source cluster (a plain commit)."""
    commit_offsets(ProgressNames(group), offsets, source_config)
