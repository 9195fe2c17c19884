"""A stalled driver: the health monitor only reports it, the lifecycle's step restarts it.

The monitor's check runs against a client that fails the test on any delete: it observes.
Its report wakes the pipeline's lifecycle (``Lifecycle.due``), and a restart the step made
gives the new driver a full window before the monitor reports it again.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from eop_operator.controller import health_monitor
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.health_monitor import HealthMemory, HealthMonitor, kept_pipeline
from eop_operator.controller.lifecycle import Lifecycle
from eop_operator.controller.stall_reports import StallReports
from eop_operator.health.stall import PartitionOffsets, Reading
from eop_operator.reconcile.step_plan import Stall

#: The pipeline's stall timeout (seconds), as the manifest says.
STALL_TIMEOUT = "90s"


class _ObservingClient:
    """Answers status patches; any other write fails the test."""

    async def patch(self, *args: Any, subresource: str | None = None, **_: Any) -> Any:
        assert subresource == "status", f"the monitor wrote {args[:4]}"
        return {"kind": "ExactlyOncePipeline", "metadata": {"namespace": args[2], "name": args[3]}}

    async def delete(self, *args: Any, **_: Any) -> Any:
        raise AssertionError(f"the health monitor deleted {args}")

    async def create(self, *args: Any, **_: Any) -> Any:
        raise AssertionError(f"the health monitor created {args}")


def _ready_pod(since: float) -> dict[str, Any]:
    at = datetime.datetime.fromtimestamp(since, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": "True", "lastTransitionTime": at}
    status = {"conditions": [condition]}
    return {"kind": "Pod", "metadata": {"name": "clean-driver-0"}, "status": status}


def _checks(
    manifest: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    *,
    ready_since: float,
    at: float,
    restarted_at: float | None = None,
) -> StallReports:
    """Two checks of a driver Ready since ``ready_since`` (restarted for a stall at
    ``restarted_at``, if given): input waits, G stands still from ``at - 100`` to ``at``."""
    manifest["spec"].setdefault("health", {})["stallTimeout"] = STALL_TIMEOUT
    kept = kept_pipeline(manifest)
    assert kept is not None
    readings = iter(
        Reading(at=t, partitions=(PartitionOffsets("raw", 0, 5, end=9, start=0),))
        for t in (at - 100, at)
    )

    async def read_progress(*_: Any) -> Reading:
        return next(readings)

    monkeypatch.setattr(health_monitor, "read_progress", read_progress)
    context = Context.of(OperatorOptions(), _ObservingClient())  # type: ignore[arg-type]
    if restarted_at is not None:
        context.stalls.restarted(_key(manifest), restarted_at)
    monitor, memory, pod = HealthMonitor(context), HealthMemory(), _ready_pod(ready_since)

    async def run() -> None:
        for _ in range(2):
            await monitor.check_lag(manifest, kept, memory, pod)

    asyncio.run(run())
    return context.stalls


def _key(manifest: dict[str, Any]) -> tuple[str, str]:
    return manifest["metadata"]["namespace"], manifest["metadata"]["name"]


def test_a_stalled_driver_is_reported_to_the_lifecycle_not_restarted_by_the_monitor(
    manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stalls, key = _checks(manifest, monkeypatch, ready_since=1000.0, at=2000.0), _key(manifest)
    assert stalls.take(key) == Stall(idle_seconds=100.0, lag=4, pod="clean-driver-0")
    assert stalls.take(key) is None  # acted on once


def test_a_reported_stall_wakes_the_pipelines_lifecycle_at_once() -> None:
    lifecycle, key = Lifecycle(Context.of(OperatorOptions(), _ObservingClient())), ("ns", "p")  # type: ignore[arg-type]

    async def due() -> tuple[bool, bool]:
        memory = lifecycle._memory(key, asyncio.get_running_loop().time())
        memory.look_at = float("inf")  # the last step asked for no look
        before = lifecycle.due(key)
        lifecycle.context.stalls.report(key, Stall(idle_seconds=60, lag=1, pod="p-driver-0"))
        return before, lifecycle.due(key)

    assert asyncio.run(due()) == (False, True)


def test_a_driver_restarted_for_a_stall_gets_a_full_window_before_the_next_report(
    manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ready long ago, restarted by the lifecycle 10 s before the check: not stalled.
    checks = {"ready_since": 1000.0, "at": 2000.0}
    assert not _checks(manifest, monkeypatch, **checks, restarted_at=1990.0).pending(_key(manifest))
    # The same checks with no restart on record: reported.
    assert _checks(manifest, monkeypatch, **checks).pending(_key(manifest))


def test_a_suspended_pipeline_forgets_its_stall_and_restart() -> None:
    stalls, key = StallReports(), ("ns", "p")
    stalls.report(key, Stall(idle_seconds=60, lag=1, pod="p-driver-0"))
    stalls.restarted(key, 5.0)
    stalls.forget(key)
    assert not stalls.pending(key) and stalls.restarted_at(key) is None
