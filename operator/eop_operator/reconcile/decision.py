"""What a lifecycle decision looks at and what it returns: typed values, no I/O.

:class:`Situation` is everything :func:`eop_operator.reconcile.upgrade.decide`
reads; :class:`Decision` is what it returns: the action, the status to
record before acting (:class:`~eop_operator.api.status_patch.DecisionRecord`),
the events to post, and when to look again.  :class:`Plan` is the decision
being made: it counts the driver's new failures and gathers the record and the
events.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eop_operator.api.models import (
    FailoverSpec,
    PipelineStatus,
    UpgradeMode,
    UpgradeSpec,
)
from eop_operator.api.status_patch import DecisionRecord
from eop_operator.reconcile.failover import CHECKPOINT_REASONS, Failure, count_failures
from eop_operator.reconcile.observe import ClaimState, DriverState

# Why an upgrade runs (status.upgrade.reason and the events).
SPEC_CHANGED = "SpecChanged"
RESTART_NONCE = "RestartNonce"
ROLLED_BACK = "RolledBack"
FELL_BACK = "FellBack"
CHECKPOINT_RECOVERY = "CheckpointRecovery"
CHECKPOINT_LOST = "CheckpointLost"
#: The operator renders the driver differently for the same spec (a new operator version, a
#: new default image or operator setting): a throttled restart in last-state, whatever
#: ``upgrade.mode`` says.
OPERATOR_UPGRADE = "OperatorUpgrade"


class Action(StrEnum):
    """What the lifecycle does after writing the decision's record."""

    #: Apply every child of the spec being run at (generation, resetProgress), with replicas.
    APPLY = "apply"
    #: Scale the StatefulSet to zero, keeping its pod template (graceful stop).
    STOP = "stop"
    #: Nothing to do until something changes or ``requeue_after`` passes.
    WAIT = "wait"


@dataclass(frozen=True, kw_only=True)
class Event:
    """A Kubernetes event to post about the pipeline."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Degradation:
    """Why the pipeline is Degraded: the Ready condition's reason and message."""

    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The next action, the status to record before it, the events to post, the next look."""

    action: Action
    record: DecisionRecord = field(default_factory=DecisionRecord)
    events: tuple[Event, ...] = ()
    #: The checkpoint generation (and reset flag) the children are rendered at.
    generation: int = 0
    reset_progress: bool = False
    replicas: int = 1
    #: Seconds until the decision should be looked at again, whatever else happens (None:
    #: when something changes); see ``reconcile.cadence``.
    requeue_after: float | None = None
    degraded: Degradation | None = None
    #: The children stay as they are: the new rendering waits for a restart slot (applying
    #: it would have the StatefulSet controller restart the driver at once).
    hold: bool = False


def _always() -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class Situation:
    """Everything :func:`~eop_operator.reconcile.upgrade.decide` looks at."""

    status: PipelineStatus
    #: Fingerprint of the user's spec (any change changes it).
    fingerprint: str
    #: The user's spec as stored in ``lastStableSpec`` once it runs healthily.
    spec_dump: dict[str, Any]
    suspend: bool
    upgrade: UpgradeSpec
    failover: FailoverSpec
    driver: DriverState
    #: The spec hash of the spec being run at a checkpoint generation (and reset flag).
    hash_at: Callable[[int, bool], str]
    now: datetime.datetime
    #: The last stable spec runs instead of the user's (after a rollback).
    running_stable: bool = False
    #: Why a restart would happen now (SpecChanged or RestartNonce).
    restart_reason: str = SPEC_CHANGED
    #: The checkpoint claim (UNKNOWN: the checkpoint lives at a URI, or it was not looked at).
    claim: ClaimState = ClaimState.UNKNOWN
    claim_name: str | None = None
    #: Whether a restart for an operator upgrade may begin now (the operator's throttle);
    #: asked only when one would.
    restart_slot: Callable[[], bool] = _always
    #: The operator's version, recorded with each spec hash it applies (``status.renderedBy``).
    rendered_by: str | None = None


def target_generation(mode: UpgradeMode, generation: int, reset: bool) -> tuple[int, bool]:
    """The checkpoint generation (and reset flag) a restart in ``mode`` runs."""
    if mode is UpgradeMode.LAST_STATE:
        return generation, reset
    return generation + 1, mode is UpgradeMode.STATELESS


def describe(mode: UpgradeMode, generation: int, reset: bool) -> str:
    """What a restart in ``mode`` does to the checkpoint, for messages and events."""
    if mode is UpgradeMode.LAST_STATE:
        return f"resuming checkpoint generation {generation}"
    if reset:
        return f"new checkpoint generation {generation} reprocessing from startingOffsets"
    return f"new checkpoint generation {generation} from the progress group's offsets"


class Plan:
    """One decision being made: the record and events so far, and the failures counted."""

    def __init__(self, s: Situation) -> None:
        self.s = s
        checkpoint = s.status.checkpoint
        self.generation = checkpoint.generation if checkpoint else 0
        self.reset = checkpoint.reset_progress if checkpoint else False
        self.replicas = 0 if s.suspend else 1
        self.record = DecisionRecord()
        self.events: list[Event] = []
        pods = s.driver.pods + s.driver.departed
        counted = count_failures(s.status.failover, pods, now=s.now, spec=s.failover)
        self.failover = counted.status
        self.failures = counted.new
        if counted.status != s.status.failover:
            self.record.failover = counted.status
        for failure in counted.new:
            self.events.append(
                Event(
                    type="Warning",
                    reason="Restarted",
                    message=f"driver {failure.pod} ended ({failure.reason}): {failure.message}",
                )
            )

    def done(
        self,
        action: Action,
        *,
        requeue_after: float | None = None,
        degraded: Degradation | None = None,
        hold: bool = False,
    ) -> Decision:
        """The decision: ``action`` with the record, events and generation gathered."""
        return Decision(
            action=action,
            record=self.record,
            events=tuple(self.events),
            generation=self.generation,
            reset_progress=self.reset,
            replicas=self.replicas,
            requeue_after=requeue_after,
            degraded=degraded,
            hold=hold,
        )

    def checkpoint_failure(self, spec_hash: str | None) -> Failure | None:
        """The last new failure of a driver of ``spec_hash`` that a new generation repairs."""
        found = [
            f for f in self.failures if f.reason in CHECKPOINT_REASONS and f.spec_hash == spec_hash
        ]
        return found[-1] if found else None
