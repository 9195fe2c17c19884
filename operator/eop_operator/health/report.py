"""What a health check reports in the status: the lag and its reading of ``G`` (pure).

``status.progress`` holds the health monitor's last reading of the progress
group against the source (lag, worst partitions, when ``G`` last advanced,
the input rate, the partitions ``G`` has held, why a reading failed);
``status.lag`` repeats the total for ``kubectl get``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from eop_operator.api.models import PartitionLag, ProgressStatus
from eop_operator.api.status_patch import HealthPatch
from eop_operator.health.stall import Health, Reading


def stamp(epoch: float) -> str:
    """An epoch time in the status' format (RFC 3339, seconds)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def ready_since(pod: Mapping[str, Any] | None) -> float | None:
    """When the driver pod became Ready (epoch seconds); None if it is not Ready now."""
    if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            at = condition.get("lastTransitionTime")
            return _epoch(at) if at else 0.0
    return None


def health_patch(
    health: Health,
    *,
    checked_at: float,
    held: Mapping[str, list[int]] | None = None,
    message: str | None = None,
) -> HealthPatch:
    """The status a check writes: the lag and ``progress`` (``held``: only when it grew)."""
    progress = ProgressStatus(
        lag=health.lag,
        worst_partitions=[
            PartitionLag(
                topic=p.topic, partition=p.partition, committed=p.committed, end=p.end, lag=p.lag
            )
            for p in health.worst
        ],
        last_commit_time=stamp(health.last_advance) if health.last_advance else None,
        input_rate=None if health.input_rate is None else round(health.input_rate, 3),
        checked_at=stamp(checked_at),
        message=message,
    )
    if held is not None:
        progress.held_partitions = dict(held)
    return HealthPatch(lag=health.lag, progress=progress)


def problem_patch(message: str, *, checked_at: float) -> HealthPatch:
    """The status of a check that could not read ``G``: why, and when it tried."""
    return HealthPatch(progress=ProgressStatus(message=message, checked_at=stamp(checked_at)))


def held_partitions(
    previous: Mapping[str, list[int]], reading: Reading
) -> dict[str, list[int]] | None:
    """``previous`` plus the partitions ``G`` holds now, per topic; None when nothing is new."""
    held = {topic: set(partitions) for topic, partitions in previous.items()}
    for topic, partition in reading.committed():
        held.setdefault(topic, set()).add(partition)
    merged = {topic: sorted(partitions) for topic, partitions in sorted(held.items())}
    return None if merged == {t: sorted(p) for t, p in previous.items()} else merged


def lost_progress(held: Mapping[str, list[int]], reading: Reading, group: str) -> str | None:
    """A status message when ``G`` lacks a partition it held before (expired or deleted)."""
    lost = [
        f"{p.topic}-{p.partition}"
        for p in reading.partitions
        if p.committed is None and p.partition in held.get(p.topic, ())
    ]
    if not lost:
        return None
    return (
        f"progress group {group} has no committed offset for {', '.join(lost)}, which it held "
        "before (expired after the broker's offsets.retention.minutes, or deleted): a new "
        "checkpoint generation would stop; restore the offsets with kafka-consumer-groups "
        f"--reset-offsets --group {group}"
    )
