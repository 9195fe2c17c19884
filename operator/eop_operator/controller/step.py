"""One lifecycle step: read what the watches delivered, decide and plan (pure), act.

:func:`take_step` reads the pipeline once (:class:`Subject`: parsed, its
identity resolved, the spec to run chosen), observes its driver and children
from the watches' view, asks ``reconcile.upgrade.decide`` what the pipeline needs
and ``reconcile.step_plan.plan_step`` what the step does, then carries the plan
out: writes the status (the decision's record *before* acting on it: the
write-ahead log of an upgrade in flight), posts the events, and applies or
stops.  It returns when to look again (see ``reconcile.cadence``);
``controller.lifecycle`` runs the steps.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eop_operator import __version__ as OPERATOR_VERSION
from eop_operator import metrics
from eop_operator.api.models import (
    ExactlyOncePipeline,
)
from eop_operator.api.resolve import Identity
from eop_operator.controller.context import Context
from eop_operator.controller.lifecycle_status import write_status
from eop_operator.controller.subject import Subject
from eop_operator.kube.apply import apply_children, ensure_rpc_secret
from eop_operator.kube.client import KubeError
from eop_operator.kube.events import post_event
from eop_operator.kube.observed import CHILD_KINDS, Observed, Versions
from eop_operator.reconcile.cadence import (
    CONTROLLER_SECONDS,
    VERIFY_SECONDS,
)
from eop_operator.reconcile.causes import diagnose, pod_cause
from eop_operator.reconcile.children import (
    ChildRef,
    Version,
    child_ref,
    version_of,
)
from eop_operator.reconcile.decision import (
    RESTART_NONCE,
    SPEC_CHANGED,
    Action,
    Event,
    Situation,
)
from eop_operator.reconcile.failover import parse_stamp
from eop_operator.reconcile.observe import ClaimState, DriverState
from eop_operator.reconcile.status import STALLED
from eop_operator.reconcile.step_plan import Applied, StepInput, plan_step, upgrade_after
from eop_operator.reconcile.upgrade import decide, holds_restart_slot, spec_fingerprint
from eop_operator.render import RenderedPipeline
from eop_operator.render.naming import (
    RESTART_NONCE_ANNOTATION,
    checkpoint_claim_name,
    driver_name,
    selector_labels,
)

#: Renders the pipeline to run, as whom it runs, at (checkpoint generation, resetProgress).
Renderer = Callable[[ExactlyOncePipeline, Identity, int, bool], RenderedPipeline]


@dataclass
class Memory:
    """What the lifecycle remembers of one pipeline between steps (lost at exit: safe)."""

    #: Each child's version as the operator last applied it or found it in sync.
    applied: dict[ChildRef, Version] = field(default_factory=dict)
    #: When children were last applied (event-loop time).
    applied_at: float = -math.inf
    #: When every child is applied again whatever it looks like.
    verify_at: float | None = None
    #: What the API server refused at the last apply of the pipeline's children.
    refused: tuple[str, ...] = ()
    #: When the timer should look at the pipeline next (0: at its next tick).
    look_at: float = 0.0
    #: The versions of what the last step that waited read (``Observed.versions``).
    seen: Versions = field(default_factory=dict)
    #: What the last warning said the stored object has that this operator let pass:
    #: (fields ignored, rules ratcheted).
    lenient: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    #: The error the last step failed with (``lifecycle_status.step_failure_message``), and
    #: how many steps in a row failed with it.
    failure: tuple[str, int] = ("", 0)


def _template_annotation(statefulset: dict[str, Any] | None, key: str) -> str | None:
    template = (statefulset or {}).get("spec", {}).get("template", {})
    value = (template.get("metadata", {}).get("annotations") or {}).get(key)
    return None if value is None else str(value)


def _selects(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    found = pod.get("metadata", {}).get("labels") or {}
    return all(found.get(k) == v for k, v in labels.items())


def _count(pipeline: ExactlyOncePipeline, events: Sequence[Event], now: datetime.datetime) -> None:
    """Feed the operator's metrics from the events of one decision."""
    namespace, name = pipeline.metadata.namespace, pipeline.metadata.name
    wal = pipeline.status.upgrade
    for event in events:
        if event.reason == "Restarted":
            metrics.record_restart(namespace, name, event.reason)
        elif event.reason == "Upgraded" and wal is not None:
            began = parse_stamp(wal.began_at or wal.started_at) if wal.started_at else now
            seconds = max((now - began).total_seconds(), 0.0)
            metrics.record_upgrade(namespace, name, wal.mode.value, seconds)


async def take_step(
    context: Context,
    observed: Observed,
    subject: Subject,
    render: Renderer,
    memory: Memory,
    departed: list[dict[str, Any]],
) -> float | None:
    """One decision and its action: a float means "look again in that long", None "now"."""
    pipeline, run = subject.pipeline, subject.run
    rendered: dict[tuple[int, bool], RenderedPipeline] = {}

    def render_at(generation: int, reset: bool) -> RenderedPipeline:
        # Each (generation, reset) rendered once per step.
        if (generation, reset) not in rendered:
            rendered[(generation, reset)] = render(run, subject.identity, generation, reset)
        return rendered[(generation, reset)]

    namespace, name = pipeline.metadata.namespace, pipeline.metadata.name
    clock = asyncio.get_running_loop().time()
    children = {
        (kind, child): obj
        for kind in CHILD_KINDS
        for child, obj in observed.objects(namespace, name, kind, clock).items()
    }
    statefulset = children.get(("StatefulSet", driver_name(pipeline)))
    selector = selector_labels(pipeline)
    pods = [
        p for p in observed.objects(namespace, name, "Pod", clock).values() if _selects(p, selector)
    ]
    nonce_changed = (
        statefulset is not None
        and _template_annotation(statefulset, RESTART_NONCE_ANNOTATION) != run.spec.restart_nonce
    )
    now = datetime.datetime.now(datetime.UTC)
    driver = DriverState.from_objects(statefulset, pods, departed)
    status = pipeline.status
    steady = driver.steady_with(status.spec_hash, now)
    claim_name = checkpoint_claim_name(pipeline) if run.spec.checkpoint.claim else None
    claim = ClaimState.UNKNOWN
    if claim_name is not None:
        claim = ClaimState.of(children.get(("PersistentVolumeClaim", claim_name)))
    key = (namespace, name)
    slots = context.slots
    if not slots.seeded:
        slots.seed(
            (k, body)
            for k in list(observed.pipelines)
            if (body := observed.pipeline(*k, clock)) is not None
        )
    decision = decide(
        Situation(
            status=status,
            fingerprint=spec_fingerprint(pipeline.spec),
            spec_dump=pipeline.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            suspend=pipeline.spec.suspend,
            upgrade=pipeline.spec.upgrade,
            failover=pipeline.spec.failover,
            driver=driver,
            hash_at=lambda generation, reset: render_at(generation, reset).spec_hash,
            now=now,
            running_stable=subject.running_stable,
            restart_reason=RESTART_NONCE if nonce_changed else SPEC_CHANGED,
            claim=claim,
            claim_name=claim_name,
            restart_slot=lambda: slots.free(key),
            rendered_by=OPERATOR_VERSION,
        )
    )
    wal = upgrade_after(decision, status)
    # Taken (or given back) before the first await: no other step takes the same slot.
    slots.update(
        key, holds=holds_restart_slot(wal, pipeline.spec.upgrade, now), waits=decision.hold
    )
    plan = plan_step(
        StepInput(
            decision=decision,
            status=status,
            stored_status=subject.body.get("status") or {},
            claim=claim,
            children=children,
            statefulset=statefulset,
            render_at=render_at,
            applied=Applied(
                versions=memory.applied,
                at=memory.applied_at,
                verify_at=memory.verify_at,
                refused=memory.refused,
            ),
            steady=steady,
            recovers_in=driver.recovers_in(now),
            clock=clock,
            stall=context.stalls.take(key),
        )
    )
    memory.applied.update(plan.verified)
    todo = list(plan.apply)
    key_owner = run if plan.needs_rpc_key else None  # a pipeline whose RPC key must exist
    if plan.apply_only:
        return await _apply(context, subject.body, todo, children, memory, clock, key_owner)
    if plan.await_controller is not None:
        return plan.await_controller
    cause = None
    if not steady and not pipeline.spec.suspend:
        cause = pod_cause(driver, now)
        if cause is None:
            cause = diagnose(
                driver,
                claim=claim,
                claim_name=claim_name,
                warnings=await context.warnings.of(context.client, namespace, clock),
                statefulset_uid=(statefulset or {}).get("metadata", {}).get("uid"),
                now=now,
            )
    await write_status(context, subject, decision, statefulset, cause=cause, refused=memory.refused)
    _count(pipeline, decision.events, now)
    restart = plan.restart_stalled
    events = (*decision.events, restart.event) if restart else decision.events
    if todo:
        # The events say what the step does; they need not hold its apply back.
        again, _ = await asyncio.gather(
            _apply(context, subject.body, todo, children, memory, clock, key_owner),
            _post_events(context, subject.body, events),
        )
    else:
        await _post_events(context, subject.body, events)
    if restart is not None:
        await _restart_stalled(context, pipeline, restart.pod)
    if todo:
        return None if decision.action is Action.APPLY else again
    if plan.stop_driver:
        # A merge patch: the pod template stays the old one while the old driver stops.
        stopped = await context.client.patch(
            "apps/v1", "StatefulSet", namespace, driver_name(pipeline), {"spec": {"replicas": 0}}
        )
        context.own_writes.record(stopped, clock)
        memory.applied[child_ref(stopped)] = version_of(stopped)
        return None
    return plan.look_again


async def _restart_stalled(context: Context, pipeline: ExactlyOncePipeline, pod: str) -> None:
    """Delete the stalled driver's pod (the StatefulSet recreates it); count it, and tell the
    health monitor when (it counts the new driver's readiness from then)."""
    namespace, name = pipeline.metadata.namespace, pipeline.metadata.name
    try:
        await context.client.delete("v1", "Pod", namespace, pod)
    except KubeError as exc:
        if exc.status != 404:  # gone already: restarted all the same
            raise
    metrics.record_restart(namespace, name, STALLED)
    context.stalls.restarted((namespace, name), time.time())


async def warn_lenient(context: Context, subject: Subject, memory: Memory) -> None:
    """Say once (per operator run and change) what the stored pipeline has that was let pass.

    ``SpecNoLongerValid``: the unchanged spec breaks rules it passed when it was accepted;
    it keeps running (the status has a condition of that type too).  ``UnknownFields``:
    fields this operator does not know (written for a newer one) are ignored.
    """
    said = (subject.ignored, subject.ratcheted)
    if said == memory.lenient:
        return
    memory.lenient = said
    events = []
    if subject.ratcheted:
        passed = "; ".join(subject.ratcheted)
        message = f"the spec runs as accepted; a changed spec must pass: {passed}"
        events.append(Event(type="Warning", reason="SpecNoLongerValid", message=message))
    if subject.ignored:
        ignored = ", ".join(subject.ignored)
        message = f"fields this operator version does not know are ignored: {ignored}"
        events.append(Event(type="Warning", reason="UnknownFields", message=message))
    await _post_events(context, subject.body, events)


async def _post_events(context: Context, body: dict[str, Any], events: Sequence[Event]) -> None:
    for event in events:
        await post_event(
            context.client, body, type=event.type, reason=event.reason, message=event.message
        )


async def _apply(
    context: Context,
    body: dict[str, Any],
    todo: list[dict[str, Any]],
    live: Mapping[ChildRef, Mapping[str, Any]],
    memory: Memory,
    clock: float,
    key_owner: ExactlyOncePipeline | None = None,
) -> float | None:
    """Apply ``todo`` and remember the answers; return when to look again.

    ``live``: the pipeline's children the watches show (an object they do not show is read
    before it is applied: what eop did not create is never taken over).
    ``key_owner``: a pipeline whose Spark RPC key Secret is created first, if missing.

    None ("now") when what the API server refuses changed (the status says so), else
    the moments its controllers take to answer: their events are the next look.
    """
    client = context.client
    # The key first: a driver pod waits for every Secret it mounts.
    refused_key = await ensure_rpc_secret(client, key_owner) if key_owner is not None else ()
    applied, refused = await apply_children(client, todo, live, refused_key)
    for ref, answer in applied.items():
        context.own_writes.record(answer, clock)
        memory.applied[ref] = version_of(answer)
    memory.applied_at = clock
    if memory.verify_at is not None and clock >= memory.verify_at:
        memory.verify_at = clock + VERIFY_SECONDS
    before, memory.refused = memory.refused, refused
    if refused and refused != before:
        await post_event(
            client, body, type="Warning", reason="ApplyRefused", message="; ".join(refused)
        )
    return None if refused != before else CONTROLLER_SECONDS
