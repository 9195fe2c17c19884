"""How the lifecycle runs in the operator: registration, retries after a failed step, the exit.

A failed step (an API error) is retried by kopf after the handler's backoff;
kopf's default is 60 s, and an upgrade waiting for its own apply gets no event
that would drive it sooner.  At exit, the steps under way finish before the
API client closes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest

from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.lifecycle import Lifecycle
from eop_operator.controller.registration import register
from eop_operator.kube.client import KubeError
from eop_operator.kube.observed import Observed, OwnWrites
from eop_operator.render import render_pipeline


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

    async def scenario() -> bool:
        with pytest.raises(KubeError):
            await lifecycle.drive(observed, ("ns", "p"), render)
        return lifecycle.due(("ns", "p"))

    assert asyncio.run(scenario()), "a failed step waits for its next look"
