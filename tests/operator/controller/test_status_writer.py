"""One writer per status field: who may write what, and what a write sends.

Every status write goes through ``kube.status.StatusWriter``, with the patch
model of its owner: the lifecycle's ``LifecyclePatch`` (its decision's
``DecisionRecord`` among it) or the health monitor's ``HealthPatch``.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from eop_operator.api.load import load_pipeline
from eop_operator.api.models import (
    CheckpointStatus,
    FailoverStatus,
    Phase,
    PipelineStatus,
)
from eop_operator.api.resolve import resolve_identity
from eop_operator.api.status_patch import (
    DecisionRecord,
    HealthPatch,
    LifecyclePatch,
    merge_patch,
)
from eop_operator.controller import health_monitor
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.health_monitor import HealthMemory, HealthMonitor, Kept
from eop_operator.health.stall import PartitionOffsets, Reading
from tests.operator.merge_patch import merged

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "eop_operator"


def fields(model: type[Any]) -> set[str]:
    return set(model.model_fields)


def test_every_status_field_has_exactly_one_writer() -> None:
    lifecycle, health = fields(LifecyclePatch), fields(HealthPatch)
    assert not lifecycle & health, "a status field with two writers"
    assert lifecycle | health == fields(PipelineStatus), "a status field nobody writes"
    assert fields(DecisionRecord) <= lifecycle  # the decision is part of the lifecycle's write


def test_the_health_monitor_cannot_write_the_lifecycle_fields() -> None:
    with pytest.raises(ValidationError, match="phase"):
        HealthPatch(phase=Phase.RUNNING)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="lag"):
        DecisionRecord(lag=3)  # type: ignore[call-arg]


def test_only_the_status_writer_sends_status_patches() -> None:
    senders = [
        path.relative_to(OPERATOR).as_posix()
        for path in OPERATOR.rglob("*.py")
        if re.search(r"subresource\s*=\s*\"status\"", path.read_text())
    ]
    assert senders == ["kube/status.py"]


def test_a_write_sends_what_changes_and_nothing_when_nothing_does() -> None:
    current = {"phase": "Running", "ready": "1/1", "lag": 4}
    assert merge_patch(LifecyclePatch(phase=Phase.RUNNING, ready="1/1"), current) == {}
    assert merge_patch(LifecyclePatch(phase=Phase.DEGRADED, ready="1/1"), current) == {
        "phase": "Degraded"
    }
    # None removes a field; a field not given is left alone (the lag is the monitor's).
    assert merge_patch(LifecyclePatch(ready=None), current) == {"ready": None}


def test_a_nested_status_keeps_what_the_write_does_not_give() -> None:
    current = {"checkpoint": {"generation": 2, "path": "/old/gen-2"}}
    patch = LifecyclePatch(checkpoint=CheckpointStatus(path="/new/gen-2"))
    assert merge_patch(patch, current) == {"checkpoint": {"path": "/new/gen-2"}}


def test_the_last_stable_spec_is_replaced_whole() -> None:
    """A rollback runs the last stable spec as it was, not merged with an older one."""
    older = {"image": "a", "checkpoint": {"uri": "s3a://bucket/x", "retention": "Delete"}}
    newer = {"image": "b", "checkpoint": {"volume": {"size": "2Gi"}}}
    current = {"lastStableSpec": older}
    patch = merge_patch(DecisionRecord(last_stable_spec=newer), current)
    assert merged(current, patch)["lastStableSpec"] == newer


def test_pods_that_are_gone_leave_the_failover_record() -> None:
    current = {"failover": {"restarts": 2, "seen": {"old-pod": 1, "pod": 1}}}
    after = FailoverStatus(restarts=3, seen={"pod": 2})
    patch = merge_patch(DecisionRecord(failover=after), current)
    assert merged(current, patch)["failover"]["seen"] == {"pod": 2}


class _RecordingClient:
    """An API client that answers every status patch with the patched object."""

    def __init__(self) -> None:
        self.status_patches: list[dict[str, Any]] = []

    async def patch(self, *args: Any, subresource: str | None = None, **_: Any) -> Any:
        _, _, namespace, name, body = args
        assert subresource == "status"
        self.status_patches.append(body["status"])
        return {
            "kind": "ExactlyOncePipeline",
            "metadata": {"namespace": namespace, "name": name, "resourceVersion": "2"},
        }


def test_a_health_check_writes_only_the_lag_and_progress(
    manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The health monitor's write, as sent: never a field the lifecycle owns."""
    manifest["status"] = {"phase": "Running", "ready": "1/1", "progressGroup": "eop.ads.clean"}
    pipeline = load_pipeline(manifest)
    reading = Reading(at=100.0, partitions=(PartitionOffsets("raw", 0, 5, end=9, start=0),))

    async def read_progress(*_: Any) -> Reading:
        return reading

    monkeypatch.setattr(health_monitor, "read_progress", read_progress)
    client = _RecordingClient()
    monitor = HealthMonitor(Context.of(OperatorOptions(), client))  # type: ignore[arg-type]
    asyncio.run(
        monitor.check_lag(
            manifest, Kept(pipeline, resolve_identity(pipeline), False), HealthMemory(), None
        )
    )
    (sent,) = client.status_patches
    assert set(sent) == {"lag", "progress"}
    assert sent["lag"] == 4 and sent["progress"]["heldPartitions"] == {"raw": [0]}
