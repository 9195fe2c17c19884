"""How the lifecycle runs in the operator: registration, retries after a failed step, the exit.

A failed step (an API error) is retried by kopf after the handler's backoff;
kopf's default is 60 s, and an upgrade waiting for its own apply gets no event
that would drive it sooner.  At exit, the steps under way finish before the
API client closes.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import kopf
import pytest

from eop_operator.api.load import load_pipeline
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.lifecycle import Lifecycle
from eop_operator.controller.registration import register
from eop_operator.kube.client import KubeError
from eop_operator.kube.observed import Observed, OwnWrites
from eop_operator.reconcile.children import stamp_rendered_hash
from eop_operator.reconcile.failover import stamp
from eop_operator.render import render_pipeline
from tests.operator.scrape import scrape, value


class _NoCalls:
    """An API client (or view of the watches) that must not be used."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API was used after the exit began ({name})")


def _lifecycle(client: Any) -> Lifecycle:
    """A lifecycle whose API requests go to ``client``."""
    return Lifecycle(Context.of(OperatorOptions(), client))


def _render(*_: Any) -> Any:
    raise AssertionError("nothing is rendered after the exit began")


def test_exit_waits_for_the_step_under_way_then_takes_no_new_step() -> None:
    lifecycle = _lifecycle(_NoCalls())

    async def scenario() -> None:
        lock = lifecycle.locks.setdefault(("ns", "under-way"), asyncio.Lock())
        await lock.acquire()  # a step of pipeline ns/under-way is talking to the API server
        exiting = asyncio.create_task(lifecycle.quiesce(5.0))
        await asyncio.sleep(0.1)
        assert not exiting.done(), "the exit did not wait for the step under way"
        lock.release()
        assert await exiting is True
        # A trigger that arrives during the exit (a timer, a pod event) does nothing.
        assert await lifecycle.drive(_NoCalls(), ("ns", "other"), _render) is None  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_exit_gives_up_on_a_step_that_outlasts_the_timeout() -> None:
    lifecycle = _lifecycle(_NoCalls())

    async def scenario() -> bool:
        lock = lifecycle.locks.setdefault(("ns", "stuck"), asyncio.Lock())
        await lock.acquire()
        return await lifecycle.quiesce(0.2)

    assert asyncio.run(scenario()) is False


class _Unavailable:
    """An API server that answers every request with 503."""

    def __getattr__(self, name: str) -> Any:
        async def refuse(*_: Any, **__: Any) -> Any:
            raise KubeError(503, "the server is currently unable to handle the request")

        return refuse


def test_a_failed_lifecycle_step_is_tried_again_at_the_next_timer_tick() -> None:
    """kopf does not retry an event handler: the timer looks again within seconds."""
    registry = kopf.OperatorRegistry()
    register(registry)
    (timer,) = [h for h in registry._spawning.get_all_handlers() if h.id == "lifecycle_timer"]
    assert timer.interval is not None and timer.interval <= 10
    assert timer.backoff is not None and timer.backoff <= 10
    body = {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "source": {"kafka": {"bootstrapServers": "kafka:9092", "topics": ["in"]}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "kafka:9092", "topic": "out"}},
        },
    }
    lifecycle = _lifecycle(_Unavailable())
    observed = Observed(pipelines={("ns", "p"): [body]}, children={}, own=OwnWrites())

    def render(pipeline: Any, identity: Any, generation: int, reset: bool) -> Any:
        return render_pipeline(
            pipeline, default_image="eop:test", generation=generation, reset_progress=reset
        )

    failures = {"namespace": "ns", "pipeline": "p", "error": "KubeError"}

    async def scenario() -> tuple[bool, float, float]:
        before = value(await scrape(), "eop_reconcile_failures_total", **failures) or 0.0
        with pytest.raises(KubeError):
            await lifecycle.drive(observed, ("ns", "p"), render)
        after = value(await scrape(), "eop_reconcile_failures_total", **failures)
        assert after is not None, "the failure is not in /metrics"
        return lifecycle.due(("ns", "p")), before, after

    due, before, after = asyncio.run(scenario())
    assert due, "a failed step waits for its next look"
    assert after == before + 1, "the failed step is counted in /metrics"


class _Answering:
    """An API server that accepts every write and lists no Warning events."""

    def __init__(self) -> None:
        self.requests: list[str] = []

    async def patch(self, api_version: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        self.requests.append(f"patch {kind} {kwargs.get('subresource') or ''}".strip())
        namespace, name = args[0], args[1]
        return {"kind": kind, "metadata": {"namespace": namespace, "name": name}}

    async def list_objects(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        self.requests.append("list events")
        return []

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(f"create {obj['kind']}")
        return obj

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError(f"nothing is out of sync, yet {obj['kind']} was applied")


def test_an_upgrade_waiting_for_its_driver_is_looked_at_when_its_readiness_timeout_ends(
    manifest: dict[str, Any],
) -> None:
    """The requeue the decision asks for is when the lifecycle looks again (the timer's due)."""
    body = manifest
    body["spec"]["upgrade"] = {"readinessTimeout": "1m"}
    spec_hash = render_pipeline(
        load_pipeline(body), default_image="eop:test", generation=0
    ).spec_hash
    started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=55)
    body["status"] = {
        "specHash": spec_hash,
        "checkpoint": {"generation": 0},
        "upgrade": {
            "fromHash": "old",
            "toHash": spec_hash,
            "mode": "last-state",
            "step": "Starting",
            "generation": 0,
            "reason": "SpecChanged",
            "startedAt": stamp(started),
        },
    }
    rendered = render_pipeline(load_pipeline(body), default_image="eop:test", generation=0)
    children = []
    for obj in rendered.objects:  # everything applied already, as the watches show it
        stamp_rendered_hash(obj)
        obj["metadata"].update(uid=f"uid-{obj['kind']}", resourceVersion="1", generation=1)
        if obj["kind"] == "PersistentVolumeClaim":
            obj["status"] = {"phase": "Bound"}
        children.append(obj)
    (statefulset,) = [obj for obj in children if obj["kind"] == "StatefulSet"]
    template = statefulset["spec"]["template"]["metadata"]
    children.append(  # the new driver, not Ready yet
        {
            "kind": "Pod",
            "metadata": {
                "name": "clean-driver-0",
                "uid": "pod",
                "resourceVersion": "1",
                "labels": template["labels"],
                "annotations": template["annotations"],
            },
            "status": {"phase": "Running"},
        }
    )
    observed = Observed(
        pipelines={("ads", "clean"): [body]},
        children={("ads", "clean"): children},
        own=OwnWrites(),
    )
    client = _Answering()
    lifecycle = _lifecycle(client)

    def render(pipeline: Any, identity: Any, generation: int, reset: bool) -> Any:
        return render_pipeline(
            pipeline, default_image="eop:test", generation=generation, reset_progress=reset
        )

    async def scenario() -> tuple[float | None, bool]:
        wait = await lifecycle.drive(observed, ("ads", "clean"), render)
        return wait, lifecycle.due(("ads", "clean"))

    wait, due = asyncio.run(scenario())
    # 60 s of readiness timeout, 55 (and a fraction) gone: the rest, not the 10 s of a look.
    assert wait is not None and 3.5 < wait <= 5.0
    assert not due, "the timer would look before the decision asked"


class _Recording:
    """An API server that accepts every write and keeps what was written."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []

    async def patch(self, api_version: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        namespace, name, body = args[0], args[1], args[2]
        self.statuses.append(body["status"])
        return {"kind": kind, "metadata": {"namespace": namespace, "name": name}}

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.events.append(obj)
        return obj


def test_a_step_that_keeps_failing_with_the_same_error_says_so_in_status_and_an_event(
    manifest: dict[str, Any],
) -> None:
    """An error no retry cures (here: rendering fails) makes the pipeline Degraded with
    reason ReconcileFailed and the error, from its second time in a row, once; the API
    server's passing trouble does not."""
    client = _Recording()
    lifecycle = _lifecycle(client)
    body = manifest
    observed = Observed(pipelines={("ads", "clean"): [body]}, children={}, own=OwnWrites())
    errors = [KubeError(503, "unavailable"), KubeError(503, "unavailable")]
    errors += [ValueError("invalid Spark memory '512 mb'")] * 3

    def render(*_: Any) -> Any:
        raise errors.pop(0)

    async def step() -> None:
        with pytest.raises((KubeError, ValueError)):
            await lifecycle.drive(observed, ("ads", "clean"), render)

    async def scenario() -> list[int]:
        written = []
        for _ in range(5):
            await step()
            written.append(len(client.statuses))
        return written

    written = asyncio.run(scenario())
    # Two 503s: nothing said. The render error: said from its second time, and only once
    # (the fake API server does not update the body the lifecycle reads: it says it again
    # each time it fails, at most once per look).
    assert written[:3] == [0, 0, 0]
    assert written[3] == 1
    (status, *_) = client.statuses
    assert status["phase"] == "Degraded"
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] == "ReconcileFailed"
    assert "ValueError: invalid Spark memory '512 mb'" in ready["message"]
    (event, *_) = client.events
    assert (event["type"], event["reason"]) == ("Warning", "ReconcileFailed")
    assert "invalid Spark memory" in event["message"]
    # Once the status says it, the next failure with the same error writes nothing.
    body["status"] = status
    errors.append(ValueError("invalid Spark memory '512 mb'"))
    before = len(client.statuses), len(client.events)
    asyncio.run(step())
    assert (len(client.statuses), len(client.events)) == before
