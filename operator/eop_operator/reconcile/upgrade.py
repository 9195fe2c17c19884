"""Pure lifecycle decisions: (status, spec settings, observed driver, now) -> the next action.

One function, :func:`decide`, covers creation, upgrades, rollback, fallback,
checkpoint recovery, suspend and resume.  The status is the write-ahead log
of an upgrade in flight (``status.upgrade``): the handler writes the status
patch of a decision *before* acting on it, so an operator that dies between
any two API calls repeats the same step when it comes back.

An upgrade has two steps:

``Stopping``
    the StatefulSet is scaled to zero (SIGTERM: the batch in flight commits);
    the step ends when no driver pod exists any more;
``Starting``
    the new ConfigMap and pod template are applied with one replica; the
    upgrade completes when a pod of the new spec hash is Ready, and fails
    (rollback, when enabled) when none is within ``readinessTimeout``.

Because the new template is applied only once no pod exists, two drivers of
one pipeline never run at the same time.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eop_operator.api.models import (
    ExactlyOncePipeline,
    FailoverSpec,
    FailoverStatus,
    PipelineSpec,
    PipelineStatus,
    UpgradeMode,
    UpgradeSpec,
    UpgradeStatus,
    UpgradeStep,
)
from eop_operator.reconcile.failover import (
    CHECKPOINT_REASONS,
    HOPELESS,
    Failure,
    backoff_seconds,
    count_failures,
    crash_looping,
    parse_stamp,
    stamp,
)
from eop_operator.reconcile.observe import ClaimState, DriverState
from eop_operator.render import spec_hash
from eop_spark.reasons import FailureReason
from eop_spark.spec import duration_ms

#: How often to look again while waiting for pods to go or to get Ready.
POLL_SECONDS = 2.0

# Why an upgrade runs (status.upgrade.reason and the events).
SPEC_CHANGED = "SpecChanged"
RESTART_NONCE = "RestartNonce"
ROLLED_BACK = "RolledBack"
FELL_BACK = "FellBack"
CHECKPOINT_RECOVERY = "CheckpointRecovery"
CHECKPOINT_LOST = "CheckpointLost"


class Action(StrEnum):
    """What the handler does after writing the decision's status patch."""

    #: Apply every child of the spec being run at (generation, resetProgress), with replicas.
    APPLY = "apply"
    #: Scale the StatefulSet to zero, keeping its pod template (graceful stop).
    STOP = "stop"
    #: Nothing to do until something changes or ``requeue_after`` passes.
    WAIT = "wait"


@dataclass(frozen=True)
class Event:
    """A Kubernetes event to post about the pipeline."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """The next action, the status patch to write before it, and the events to post."""

    action: Action
    status: dict[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    generation: int = 0
    reset_progress: bool = False
    replicas: int = 1
    requeue_after: float | None = None
    #: (reason, message) when the pipeline is Degraded.
    degraded: tuple[str, str] | None = None


@dataclass(frozen=True)
class Situation:
    """Everything :func:`decide` looks at."""

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


def target_generation(mode: UpgradeMode, generation: int, reset: bool) -> tuple[int, bool]:
    """The checkpoint generation (and reset flag) a restart in ``mode`` runs."""
    if mode is UpgradeMode.LAST_STATE:
        return generation, reset
    return generation + 1, mode is UpgradeMode.STATELESS


def _wal(upgrade: UpgradeStatus) -> dict[str, Any]:
    return upgrade.model_dump(by_alias=True, exclude_none=True, mode="json")


def _failover_patch(before: FailoverStatus, after: FailoverStatus) -> dict[str, Any]:
    patch = after.model_dump(by_alias=True, mode="json")
    # A merge patch keeps map keys it does not mention: drop pods that are gone explicitly.
    patch["seen"] = {**{uid: None for uid in before.seen if uid not in after.seen}, **after.seen}
    return patch


def _describe(mode: UpgradeMode, generation: int, reset: bool) -> str:
    if mode is UpgradeMode.LAST_STATE:
        return f"resuming checkpoint generation {generation}"
    if reset:
        return f"new checkpoint generation {generation} reprocessing from startingOffsets"
    return f"new checkpoint generation {generation} from the progress group's offsets"


class _Planner:
    """One decision: accumulates the status patch and the events."""

    def __init__(self, s: Situation) -> None:
        self.s = s
        checkpoint = s.status.checkpoint
        self.generation = checkpoint.generation if checkpoint else 0
        self.reset = checkpoint.reset_progress if checkpoint else False
        self.replicas = 0 if s.suspend else 1
        self.patch: dict[str, Any] = {}
        self.events: list[Event] = []
        pods = s.driver.pods + s.driver.departed
        counted = count_failures(s.status.failover, pods, now=s.now, spec=s.failover)
        self.failover = counted.status
        self.failures = counted.new
        if counted.status != s.status.failover:
            self.patch["failover"] = _failover_patch(s.status.failover, counted.status)
        for failure in counted.new:
            self.events.append(
                Event(
                    "Warning",
                    "Restarted",
                    f"driver {failure.pod} ended ({failure.reason}): {failure.message}",
                )
            )

    def done(self, action: Action, **kwargs: Any) -> Decision:
        kwargs.setdefault("generation", self.generation)
        kwargs.setdefault("reset_progress", self.reset)
        kwargs.setdefault("replicas", self.replicas)
        return Decision(action, self.patch, tuple(self.events), **kwargs)

    def checkpoint_failure(self, spec_hash: str | None) -> Failure | None:
        """The last new failure of a driver of ``spec_hash`` that a new generation repairs."""
        found = [
            f for f in self.failures if f.reason in CHECKPOINT_REASONS and f.spec_hash == spec_hash
        ]
        return found[-1] if found else None

    def begin(
        self,
        mode: UpgradeMode,
        reason: str,
        *,
        from_hash: str | None,
        delay: float = 0.0,
        event: Event | None = None,
    ) -> Decision:
        """Write the WAL of a new upgrade at step Stopping and stop the old driver."""
        generation, reset = target_generation(mode, self.generation, self.reset)
        to_hash = self.s.hash_at(generation, reset)
        not_before = stamp(self.s.now + datetime.timedelta(seconds=delay)) if delay else None
        wal = UpgradeStatus(
            from_hash=from_hash,
            to_hash=to_hash,
            mode=mode,
            step=UpgradeStep.STOPPING,
            generation=generation,
            reset_progress=reset,
            reason=reason,
            started_at=stamp(self.s.now),
            began_at=stamp(self.s.now),
            not_before=not_before,
        )
        what = _describe(mode, generation, reset)
        self.patch["upgrade"] = _wal(wal)
        self.patch["message"] = f"{reason}: {what}"
        self.events.append(
            event
            or Event("Normal", "Upgrading", f"{reason}: {from_hash} -> {to_hash}, {mode}: {what}")
        )
        return self.done(Action.STOP, requeue_after=POLL_SECONDS)

    def recover(self, failure: Failure, from_hash: str | None) -> Decision | None:
        """A new generation for a checkpoint the driver cannot use, when allowed."""
        upgrade = self.s.upgrade
        if failure.reason == FailureReason.CHECKPOINT_LOST:
            return self.begin(
                UpgradeMode.COMMITTED_OFFSETS,
                CHECKPOINT_LOST,
                from_hash=from_hash,
                event=Event(
                    "Warning",
                    CHECKPOINT_LOST,
                    f"the driver found checkpoint generation {self.generation} lost "
                    f"({failure.message}); generation {self.generation + 1} starts from the "
                    "progress group",
                ),
            )
        if failure.reason == FailureReason.CORRUPT_CHECKPOINT:
            delay = backoff_seconds(self.failover, self.s.failover)
            return self.begin(
                UpgradeMode.COMMITTED_OFFSETS,
                CHECKPOINT_RECOVERY,
                from_hash=from_hash,
                delay=delay,
                event=Event(
                    "Warning",
                    "Restarted",
                    f"checkpoint generation {self.generation} is unreadable ({failure.message}); "
                    f"starting generation {self.generation + 1} from the progress group "
                    f"in {delay:.0f}s",
                ),
            )
        if not upgrade.allow_fallback:
            return None
        return self.begin(
            UpgradeMode.COMMITTED_OFFSETS,
            FELL_BACK,
            from_hash=from_hash,
            event=Event(
                "Warning",
                "FellBack",
                f"checkpoint generation {self.generation} is incompatible with the new query "
                f"({failure.message}); falling back to committed-offsets: generation "
                f"{self.generation + 1} starts from the progress group",
            ),
        )

    def degraded(self) -> tuple[str, str] | None:
        """Why the pipeline is Degraded now, if it is."""
        status, spec = self.failover, self.s.failover
        steady = self.s.driver.steady_with(self.s.status.spec_hash, self.s.now)
        if steady or status.last_reason is None:
            return None
        if crash_looping(status, spec):
            return (
                "CrashLoop",
                f"{len(status.recent)} driver restarts within {spec.window} "
                f"(maxRestarts {spec.max_restarts}); last: [{status.last_reason}] "
                f"{status.last_message}",
            )
        if status.last_reason in {r.value for r in HOPELESS} and status.recent:
            return (status.last_reason, f"restarting does not help: {status.last_message}")
        if status.last_reason == FailureReason.INCOMPATIBLE_CHECKPOINT.value and status.recent:
            return (
                "IncompatibleCheckpoint",
                f"{status.last_message}; upgrade.allowFallback is false: change the spec "
                "or use upgrade.mode committed-offsets",
            )
        return None


def decide(s: Situation) -> Decision:
    """The next lifecycle action for a pipeline (see the module docstring)."""
    plan = _Planner(s)
    status, wal = s.status, s.status.upgrade
    if status.spec_hash is None and wal is None and s.claim is ClaimState.DELETING:
        # A claim of an earlier pipeline of the same name is still going: applying now
        # would patch the claim that is being deleted, and the driver would wait for it.
        plan.patch["message"] = f"waiting for the earlier claim {s.claim_name} to be deleted"
        return plan.done(Action.WAIT, requeue_after=POLL_SECONDS)
    if status.spec_hash is None and wal is None and not s.driver.exists:
        spec_hash = s.hash_at(plan.generation, plan.reset)
        plan.patch.update(
            specHash=spec_hash,
            appliedFingerprint=s.fingerprint,
            checkpoint={"generation": plan.generation, "resetProgress": plan.reset},
            message="submitted",
        )
        plan.events.append(
            Event(
                "Normal",
                "Submitted",
                f"driver at spec hash {spec_hash}, checkpoint generation {plan.generation}",
            )
        )
        return plan.done(Action.APPLY)
    if wal is not None and wal.step is UpgradeStep.STOPPING:
        return _stopping(plan, wal)
    if wal is not None and wal.step is UpgradeStep.STARTING:
        decision = _starting(plan, wal)
        if decision is not None:
            return decision
    return _steady(plan)


def _stopping(plan: _Planner, wal: UpgradeStatus) -> Decision:
    s = plan.s
    target = s.hash_at(wal.generation, wal.reset_progress)
    if target != wal.to_hash:
        # The spec changed again before the new driver started: start that one instead.
        wal = wal.model_copy(update={"to_hash": target})
        plan.patch["upgrade"] = _wal(wal)
    if s.driver.replicas != 0:
        return plan.done(Action.STOP, requeue_after=POLL_SECONDS)
    if s.driver.pods or s.claim is ClaimState.DELETING:
        # A deleted claim goes once no pod uses it; a new one is made only after that.
        return plan.done(Action.WAIT, requeue_after=POLL_SECONDS)
    if wal.not_before and s.now < parse_stamp(wal.not_before):
        wait = (parse_stamp(wal.not_before) - s.now).total_seconds()
        return plan.done(Action.WAIT, requeue_after=max(POLL_SECONDS, wait))
    # The old driver is gone: write the next step, then apply the new driver.
    started = wal.model_copy(update={"step": UpgradeStep.STARTING, "started_at": stamp(s.now)})
    plan.patch.update(
        upgrade=_wal(started),
        specHash=target,
        appliedFingerprint=s.fingerprint,
        checkpoint={"generation": wal.generation, "resetProgress": wal.reset_progress},
    )
    plan.generation, plan.reset = wal.generation, wal.reset_progress
    return plan.done(Action.APPLY, requeue_after=POLL_SECONDS)


def _starting(plan: _Planner, wal: UpgradeStatus) -> Decision | None:
    """The new driver was applied: wait for it to be Ready; None means "done, go steady"."""
    s = plan.s
    if s.hash_at(wal.generation, wal.reset_progress) != wal.to_hash:
        plan.patch["upgrade"] = None
        return None  # superseded by a newer spec: the steady state starts the next upgrade
    if (
        s.driver.template_hash != wal.to_hash
        or s.driver.replicas != plan.replicas
        or s.claim is ClaimState.MISSING
    ):
        return plan.done(Action.APPLY, requeue_after=POLL_SECONDS)  # an apply was lost
    what = _describe(wal.mode, wal.generation, wal.reset_progress)
    if s.suspend or s.driver.ready_with(wal.to_hash):
        plan.patch.update(upgrade=None, message=f"{wal.reason}: {what}, done")
        kind = "Warning" if wal.reason == ROLLED_BACK else "Normal"
        plan.events.append(
            Event(kind, "Upgraded", f"{wal.reason}: driver at spec hash {wal.to_hash}, {what}")
        )
        return None
    failure = plan.checkpoint_failure(wal.to_hash)
    if failure is not None and not (
        failure.reason == FailureReason.INCOMPATIBLE_CHECKPOINT
        and wal.mode is not UpgradeMode.LAST_STATE
    ):
        decision = plan.recover(failure, wal.to_hash)
        if decision is not None:
            return decision
    timeout = datetime.timedelta(milliseconds=duration_ms(s.upgrade.readiness_timeout))
    started = parse_stamp(wal.started_at) if wal.started_at else s.now
    if s.now - started < timeout:
        left = (started + timeout - s.now).total_seconds()
        return plan.done(
            Action.WAIT, requeue_after=min(max(left, POLL_SECONDS), 30.0), degraded=plan.degraded()
        )
    stable = s.status.last_stable_fingerprint
    if s.upgrade.rollback and stable and not s.running_stable and stable != s.fingerprint:
        plan.patch["rolledBackFingerprint"] = s.fingerprint
        plan.generation, plan.reset = wal.generation, wal.reset_progress
        # The rolled-back spec's hash is known once the handler renders the stable spec:
        # the Stopping step refreshes toHash then.
        return plan.begin(
            UpgradeMode.COMMITTED_OFFSETS,
            ROLLED_BACK,
            from_hash=wal.to_hash,
            event=Event(
                "Warning",
                "RolledBack",
                f"driver at spec hash {wal.to_hash} not Ready within "
                f"{s.upgrade.readiness_timeout}; "
                "rolling back to the last stable spec as a new checkpoint generation "
                "from the progress group",
            ),
        )
    return plan.done(
        Action.WAIT,
        requeue_after=30.0,
        degraded=plan.degraded()
        or (
            "UpgradeNotReady",
            f"driver at spec hash {wal.to_hash} not Ready within {s.upgrade.readiness_timeout}",
        ),
    )


def _steady(plan: _Planner) -> Decision:
    s = plan.s
    status = s.status
    applied = plan.patch.get("specHash", status.spec_hash)
    if s.claim.gone and applied is not None:
        return _checkpoint_lost(plan, applied)
    failure = plan.checkpoint_failure(applied)
    if failure is not None:
        decision = plan.recover(failure, applied)
        if decision is not None:
            return decision
    if s.hash_at(plan.generation, plan.reset) != applied:
        reason = ROLLED_BACK if s.running_stable else s.restart_reason
        return plan.begin(s.upgrade.mode, reason, from_hash=applied)
    action = Action.WAIT
    if (
        not s.driver.exists
        or s.driver.replicas != plan.replicas
        or status.applied_fingerprint != s.fingerprint
    ):
        action = Action.APPLY
        plan.patch["appliedFingerprint"] = s.fingerprint
        if s.driver.exists and s.driver.replicas != plan.replicas:
            if s.suspend:
                plan.events.append(
                    Event("Normal", "Suspended", "stopping the driver gracefully; state is kept")
                )
                plan.patch["message"] = "suspended"
            else:
                plan.events.append(
                    Event(
                        "Normal",
                        "Resumed",
                        f"driver resumes checkpoint generation {plan.generation}",
                    )
                )
                plan.patch["message"] = "resumed"
    if (
        s.driver.steady_with(applied, s.now)
        and not s.running_stable
        and status.last_stable_fingerprint != s.fingerprint
    ):
        plan.patch.update(lastStableSpec=s.spec_dump, lastStableFingerprint=s.fingerprint)
    return plan.done(action, degraded=plan.degraded())


def _checkpoint_lost(plan: _Planner, applied: str) -> Decision:
    """The checkpoint claim is gone: the next generation starts from the progress group.

    The old driver stops first (a deleted claim stays until no pod uses it);
    the Starting step makes a new claim.
    """
    s = plan.s
    state = "missing" if s.claim is ClaimState.MISSING else "being deleted"
    return plan.begin(
        UpgradeMode.COMMITTED_OFFSETS,
        CHECKPOINT_LOST,
        from_hash=applied,
        event=Event(
            "Warning",
            CHECKPOINT_LOST,
            f"checkpoint claim {s.claim_name} is {state}: checkpoint generation "
            f"{plan.generation} is lost; generation {plan.generation + 1} starts from the "
            "progress group on a new claim",
        ),
    )


def spec_fingerprint(spec: PipelineSpec) -> str:
    """A short hash of the whole user spec: any edit changes it."""
    return spec_hash(spec.model_dump(mode="json", by_alias=True, exclude_none=True))


def spec_to_run(pipeline: ExactlyOncePipeline) -> tuple[ExactlyOncePipeline, bool]:
    """The pipeline to render: the user's, or the last stable spec after a rollback.

    A rolled-back spec is not retried until the user changes it (its
    fingerprint then differs).  Suspension always follows the user's spec.
    """
    status = pipeline.status
    if (
        status.rolled_back_fingerprint is None
        or status.last_stable_spec is None
        or status.rolled_back_fingerprint != spec_fingerprint(pipeline.spec)
    ):
        return pipeline, False
    stable = PipelineSpec.model_validate(status.last_stable_spec)
    stable = stable.model_copy(update={"suspend": pipeline.spec.suspend})
    return pipeline.model_copy(update={"spec": stable}), True
