"""Keep the progress of a pipeline whose driver does not run from expiring (invariant 6).

While no driver container runs (suspended, crash-looping, StatefulSet scaled
to zero, pod not scheduled) no runner commits to its progress group ``G``,
and Kafka expires each offset of a member-less group
``offsets.retention.minutes`` after its last commit.  The operator's health
daemon re-commits ``G`` then, as the runner does between batches (see
:mod:`eop_spark.exactly_once.keep_alive`): well within the retention the sink cluster's
brokers report, the same offsets and commit metadata, inside a transaction.

Why it is safe (docs/exactly-once.md, "Failure modes and their guards"):

* it runs only while no container of the driver pod runs (or no pod exists):
  :func:`driver_runs`; a status the kubelet has not updated yet can let it run
  while a runner that just started commits, and the next two points keep ``G``
  where that runner puts it;
* it initialises ``<prefix>.driver`` and then every partition id before it
  reads ``G``: a zombie runner of either commit mode is fenced and its open
  transaction aborted, so the stable read sees settled offsets; each partition
  is re-committed under its own id, and only if ``G`` did not move since it
  was read (``refresh_without_runner``);
* a runner that comes back (resume, or any new driver) initialises every id
  of the pipeline before it reads ``G``, the driver id included: the
  operator's producer is fenced before the runner reads anything, and a
  refresh that did commit before wrote what ``G`` already held.

``G`` is read and re-committed under the names the runner uses
(:mod:`eop_spark.contract.progress_names`); when source and sink are different
clusters, the offsets re-committed also refresh ``G``'s lag view on the source
cluster (a plain commit, see :mod:`eop_spark.exactly_once.cross_cluster`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import Identity
from eop_operator.health.progress import (
    DEFAULT_TIMEOUT_S,
    KafkaAccess,
    ProgressUnavailable,
    group_names,
    read_watermarks,
)
from eop_spark.contract.errors import EopError
from eop_spark.contract.offsets import Offsets
from eop_spark.operator_access import refresh_interval, refresh_lag_view, refresh_progress

log = logging.getLogger(__name__)


def driver_runs(pod: Mapping[str, Any] | None) -> bool:
    """Whether a container of the driver pod runs (or its pod is Ready): then never refresh.

    A pod that exists with no running container (waiting in CrashLoopBackOff,
    terminated, not scheduled or not started yet) does not run a runner.
    """
    if pod is None:
        return False
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return True
    containers = [*(status.get("initContainerStatuses") or [])]
    containers += status.get("containerStatuses") or []
    return any("running" in (c.get("state") or {}) for c in containers)


@dataclass
class RefreshSchedule:
    """When the operator last refreshed a pipeline's progress, and how often it must."""

    interval_s: float | None = None
    refreshed_at: float | None = None

    def due(self, now: float) -> bool:
        """Whether a refresh is due (the first one is due at once)."""
        return (
            self.refreshed_at is None
            or self.interval_s is None
            or now - self.refreshed_at >= self.interval_s
        )


def refresh_suspended_progress(
    access: KafkaAccess,
    pipeline: ExactlyOncePipeline,
    identity: Identity,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Offsets:
    """Re-commit the progress group of ``pipeline`` (blocking), which runs as ``identity``;
    return what was re-committed.

    Call it only while no driver of the pipeline runs (see the module docstring).
    Raises :class:`ProgressUnavailable` with a message safe for the status.
    """
    group = identity.progress_group
    source = read_watermarks(access, pipeline, group, timeout=timeout)
    names = group_names(access, group, source.cluster_id, timeout=timeout)
    try:
        refreshed = refresh_progress(
            names,
            pipeline.spec.sink.kafka,
            access.sink,
            identity.transactional_id_prefix,
            list(source.watermarks),
        )
    except EopError as exc:
        raise ProgressUnavailable(access.redact(exc.message)) from None
    except Exception as exc:  # confluent-kafka's KafkaException, or a client setting refused
        raise ProgressUnavailable(access.redact(f"cannot refresh {group}: {exc}")) from None
    if names.progress_topics and refreshed:
        keep_lag_view(access, group, refreshed)
    return refreshed


def keep_lag_view(access: KafkaAccess, group: str, offsets: Offsets) -> None:
    """Re-commit ``G``'s lag view on the source cluster (a view: a failure is only logged)."""
    try:
        refresh_lag_view(group, offsets, access.source)
    except Exception as exc:  # a view never stops a refresh
        log.warning("the lag view of %s on the source cluster: %s", group, access.redact(str(exc)))


async def keep_progress_alive(
    access: KafkaAccess,
    pipeline: ExactlyOncePipeline,
    identity: Identity,
    schedule: RefreshSchedule,
) -> Offsets | None:
    """Refresh ``pipeline``'s progress group (it runs as ``identity``) when ``schedule`` says
    so; None when not due.

    The sink cluster's retention is asked once per schedule (the first time).
    """
    if schedule.interval_s is None:
        schedule.interval_s = await asyncio.to_thread(refresh_interval, access.sink)
    if not schedule.due(time.time()):
        return None
    refreshed = await asyncio.to_thread(refresh_suspended_progress, access, pipeline, identity)
    schedule.refreshed_at = time.time()
    log.info(
        "pipeline %s without a running driver: progress of %d partitions refreshed",
        pipeline.pipeline_id,
        len(refreshed),
    )
    return refreshed
