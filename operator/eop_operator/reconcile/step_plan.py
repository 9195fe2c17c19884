"""What one lifecycle step does once it has decided: the step's plan, a pure function.

:func:`eop_operator.reconcile.upgrade.decide` says what the pipeline needs (apply, stop,
wait) and what to record; :func:`plan_step` turns that decision, the children the watches
show and what the lifecycle remembers into the step's plan: which children to apply
(healing what was changed or deleted by hand, at most every ``HEAL_SECONDS``; every child
every ``VERIFY_SECONDS``), whether the status is written before acting (the decision's record
is the write-ahead log of an upgrade) or only the apply is done, whether to wait a moment for
the StatefulSet controller's word, whether a stalled driver is restarted (the health
monitor only reports a :class:`Stall`, see ``controller.stall_reports``), and when to look
again.  ``controller.step`` carries the plan out; nothing here does I/O, and time is a value
(``clock``: the event loop's seconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from eop_operator.api.models import PipelineStatus, UpgradeStatus, UpgradeStep
from eop_operator.api.status_patch import merge_patch
from eop_operator.reconcile.cadence import (
    CONTROLLER_SECONDS,
    HEAL_SECONDS,
    LOOK_SECONDS,
    SETTLED_SECONDS,
    next_look,
)
from eop_operator.reconcile.children import (
    ChildRef,
    Version,
    plan_sync,
    stamp_rendered_hash,
)
from eop_operator.reconcile.decision import Action, Decision, Event
from eop_operator.reconcile.observe import ClaimState
from eop_operator.render import RenderedPipeline

#: Renders the pipeline's children at (checkpoint generation, resetProgress).
RenderAt = Callable[[int, bool], RenderedPipeline]


#: The reason of the event of a stall restart.
RESTART_STALLED = "RestartStalled"


@dataclass(frozen=True, kw_only=True)
class Stall:
    """What a health check found: a Ready driver, input waiting, ``G`` standing still."""

    #: Seconds ``G`` has not advanced while input waits and the driver is Ready.
    idle_seconds: float
    #: Records waiting.
    lag: int
    #: The driver pod the check saw (the one a restart deletes).
    pod: str


@dataclass(frozen=True, kw_only=True)
class Restart:
    """Restarting a stalled driver: the event to post, the pod to delete (the StatefulSet
    recreates it)."""

    pod: str
    event: Event


@dataclass(frozen=True, kw_only=True)
class Applied:
    """What the lifecycle remembers of its applies to one pipeline (``controller.step.Memory``)."""

    #: Each child's version as the operator last applied it or found it in sync.
    versions: Mapping[ChildRef, Version] = field(default_factory=dict)
    #: When children were last applied (event-loop seconds).
    at: float = -math.inf
    #: When every child is applied again whatever it looks like (None: never).
    verify_at: float | None = None
    #: What the API server refused at the last apply.
    refused: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StepInput:
    """What a step knows once it has decided, besides the decision."""

    decision: Decision
    #: The status as stored (before the decision's record).
    status: PipelineStatus
    #: The stored status as JSON (what the record is merged into).
    stored_status: Mapping[str, Any]
    claim: ClaimState
    #: The pipeline's children as the watches show them.
    children: Mapping[ChildRef, Mapping[str, Any]]
    #: The driver's StatefulSet among them (None: there is none).
    statefulset: Mapping[str, Any] | None
    render_at: RenderAt
    applied: Applied
    #: Whether the driver runs the spec in status, Ready and not just restarted.
    steady: bool
    #: Seconds until a driver restarted a moment ago counts as running (inf: none did).
    recovers_in: float
    clock: float
    #: A stall the health monitor reported since the last step (None: none).
    stall: Stall | None = None


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """What the step does, in the order ``controller.step.take_step`` does it."""

    #: The children to apply (rendered, replicas set, hash stamped); empty: none.
    apply: tuple[dict[str, Any], ...] = ()
    #: Children found in sync the lifecycle did not know yet: remember, never apply.
    verified: Mapping[ChildRef, Version] = field(default_factory=dict)
    #: Whether the pipeline's Spark RPC key Secret must exist before the apply.
    needs_rpc_key: bool = False
    #: Apply only, and write the status at the next step: nothing but the apply changes.
    apply_only: bool = False
    #: Seconds to wait for the StatefulSet controller's word before writing the status
    #: (None: write it now).
    await_controller: float | None = None
    #: Write the decision's record (and the conditions) to the status.
    write_status: bool = True
    #: Scale the driver's StatefulSet to zero (after the status and the events).
    stop_driver: bool = False
    #: Restart the stalled driver (after the status and the decision's events).
    restart_stalled: Restart | None = None
    #: When to look again if the step applies and stops nothing (seconds; inf: only on events).
    look_again: float = math.inf
    #: When children out of sync may be healed again (seconds from now; inf: not waiting).
    heal_in: float = math.inf


def upgrade_after(decision: Decision, status: PipelineStatus) -> UpgradeStatus | None:
    """The upgrade in flight after the decision (the write-ahead log): what the decision
    records, else what is stored."""
    record = decision.record
    return record.upgrade if "upgrade" in record.model_fields_set else status.upgrade


def restart_for(stall: Stall | None, decision: Decision, status: PipelineStatus) -> Restart | None:
    """The restart of a stalled driver, or None: no stall, or the lifecycle acts on the
    driver itself this step (an apply, a stop) or has an upgrade in flight."""
    if stall is None or decision.action is not Action.WAIT:
        return None
    if upgrade_after(decision, status) is not None:
        return None
    message = (
        f"the progress group has not advanced for {stall.idle_seconds:.0f}s "
        f"with {stall.lag} records waiting; restarting driver pod {stall.pod}"
    )
    event = Event(type="Warning", reason=RESTART_STALLED, message=message)
    return Restart(pod=stall.pod, event=event)


def heals(decision: Decision, status: PipelineStatus, claim: ClaimState) -> bool:
    """Whether a waiting step applies the children out of sync (healing what was changed).

    Never while an old driver stops (its StatefulSet must keep zero replicas), while a
    restart waits for its slot, before anything ran, or while the claim is being deleted.
    """
    wal = upgrade_after(decision, status)
    return (
        decision.action is Action.WAIT
        and not decision.hold
        and status.spec_hash is not None
        and claim is not ClaimState.DELETING
        and (wal is None or wal.step is UpgradeStep.STARTING)
    )


def _seen_by_controller(statefulset: Mapping[str, Any]) -> bool:
    observed = (statefulset.get("status") or {}).get("observedGeneration")
    return observed is not None and observed >= statefulset["metadata"].get("generation", 0)


def plan_step(step: StepInput) -> StepPlan:
    """The step's plan (see the module docstring)."""
    decision, applied, clock = step.decision, step.applied, step.clock
    todo: list[dict[str, Any]] = []
    verified: Mapping[ChildRef, Version] = {}
    needs_rpc_key = False
    heal_in = math.inf
    if decision.action is Action.APPLY or heals(decision, step.status, step.claim):
        rendered = step.render_at(decision.generation, decision.reset_progress)
        needs_rpc_key = rendered.needs_rpc_secret
        objects = rendered.objects
        for obj in objects:
            if obj["kind"] == "StatefulSet":
                obj["spec"]["replicas"] = decision.replicas
            stamp_rendered_hash(obj)
        verify = applied.verify_at is not None and clock >= applied.verify_at
        sync = plan_sync(objects, step.children, applied.versions)
        verified = sync.verified
        todo = objects if verify else sync.apply
        if todo and decision.action is not Action.APPLY and not verify:
            heal_in = applied.at + HEAL_SECONDS - clock
            if heal_in > 0:
                todo = []  # healed a moment ago: again once HEAL_SECONDS have passed
    base = StepPlan(verified=verified, needs_rpc_key=needs_rpc_key, heal_in=heal_in)
    news = bool(merge_patch(decision.record, step.stored_status))
    # What only the apply changes (no WAL entry) is written after it: the status then says
    # what the step brought about, in one write rather than two. Not while something is
    # refused: the status must say so (the next step, once the apply's answer is known).
    if todo and not news and not decision.events and not applied.refused:
        return replace(base, apply=tuple(todo), apply_only=True, write_status=False)
    unseen = CONTROLLER_SECONDS - (clock - applied.at)
    if (
        unseen > 0
        and step.statefulset is not None
        and not _seen_by_controller(step.statefulset)
        and decision.action is Action.WAIT
        and not (news or decision.events or todo)
    ):
        # The StatefulSet just applied has no word from its controller yet, which answers
        # in moments (an event, and the next step): a status written now would call a
        # driver being created "being replaced", then take it back.
        return replace(base, await_controller=unseen, write_status=False)
    # Nothing else to do: look again when the decision, a driver's recovery, a child out
    # of sync or the periodic apply of every child is due, and at least every `looks`.
    looks = SETTLED_SECONDS if step.steady else LOOK_SECONDS
    verify_in = math.inf if applied.verify_at is None else applied.verify_at - clock
    asked = math.inf if decision.requeue_after is None else decision.requeue_after
    return replace(
        base,
        apply=tuple(todo),
        stop_driver=decision.action is Action.STOP and step.statefulset is not None,
        restart_stalled=restart_for(step.stall, decision, step.status),
        look_again=next_look(asked, looks, heal_in, verify_in, step.recovers_in),
    )
