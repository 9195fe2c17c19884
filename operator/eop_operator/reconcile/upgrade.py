"""Pure lifecycle decisions: (status, spec settings, observed driver, now) -> the next action.

One function, :func:`decide`, covers creation, upgrades, rollback, fallback,
checkpoint recovery, suspend and resume.  The status is the write-ahead log
of an upgrade in flight (``status.upgrade``): the lifecycle writes a
decision's record (``Decision.record``) *before* acting on it, so an operator
that dies between any two API calls repeats the same step when it comes back.
The types it takes and returns are in ``reconcile.decision``.

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

A new spec hash for the spec last applied (``status.appliedFingerprint``) is
the operator rendering that spec differently: a new operator version, a new
default image or operator setting.  The driver then restarts in ``last-state``
whatever ``upgrade.mode`` says (reason ``OperatorUpgrade``): the same
checkpoint generation, as when the StatefulSet restarts a driver that died, so
a ``stateless`` pipeline does not reprocess and a ``committed-offsets`` one
keeps its state.  At most the operator's number of such restarts run at once
(:attr:`Situation.restart_slot`); the others wait with their children as they
are (:attr:`Decision.hold`).
"""

from __future__ import annotations

import datetime

from eop_operator.api.load import validate_lenient
from eop_operator.api.models import (
    CheckpointStatus,
    ExactlyOncePipeline,
    PipelineSpec,
    UpgradeMode,
    UpgradeSpec,
    UpgradeStatus,
    UpgradeStep,
)
from eop_operator.reconcile.cadence import POLL_SECONDS, UPGRADE_WAIT_SECONDS
from eop_operator.reconcile.decision import (
    CHECKPOINT_LOST,
    CHECKPOINT_RECOVERY,
    FELL_BACK,
    OPERATOR_UPGRADE,
    ROLLED_BACK,
    Action,
    Decision,
    Degradation,
    Event,
    Plan,
    Situation,
    describe,
    target_generation,
)
from eop_operator.reconcile.failover import (
    HOPELESS,
    Failure,
    backoff_seconds,
    crash_looping,
    parse_stamp,
    stamp,
)
from eop_operator.reconcile.observe import ClaimState
from eop_operator.render import spec_hash
from eop_spark.contract.termination import FailureReason


def begin(
    plan: Plan,
    mode: UpgradeMode,
    reason: str,
    *,
    from_hash: str | None,
    delay: float = 0.0,
    event: Event | None = None,
) -> Decision:
    """Write the WAL of a new upgrade at step Stopping and stop the old driver."""
    s = plan.s
    generation, reset = target_generation(mode, plan.generation, plan.reset)
    to_hash = s.hash_at(generation, reset)
    not_before = stamp(s.now + datetime.timedelta(seconds=delay)) if delay else None
    what = describe(mode, generation, reset)
    plan.record.upgrade = UpgradeStatus(
        from_hash=from_hash,
        to_hash=to_hash,
        mode=mode,
        step=UpgradeStep.STOPPING,
        generation=generation,
        reset_progress=reset,
        reason=reason,
        started_at=stamp(s.now),
        began_at=stamp(s.now),
        not_before=not_before,
    )
    plan.record.message = f"{reason}: {what}"
    plan.events.append(
        event
        or Event(
            type="Normal",
            reason="Upgrading",
            message=f"{reason}: {from_hash} -> {to_hash}, {mode}: {what}",
        )
    )
    return plan.done(Action.STOP, requeue_after=POLL_SECONDS)


def recover(
    plan: Plan, failure: Failure, from_hash: str | None, *, fallback: bool = True
) -> Decision | None:
    """A new generation for a checkpoint the driver cannot use, when allowed.

    ``fallback``: an incompatible checkpoint may fall back to a new generation (not during
    an operator upgrade, which never drops state).
    """
    s, generation = plan.s, plan.generation
    if failure.reason == FailureReason.CHECKPOINT_LOST:
        return begin(
            plan,
            UpgradeMode.COMMITTED_OFFSETS,
            CHECKPOINT_LOST,
            from_hash=from_hash,
            event=Event(
                type="Warning",
                reason=CHECKPOINT_LOST,
                message=f"the driver found checkpoint generation {generation} lost "
                f"({failure.message}); generation {generation + 1} starts from the "
                "progress group",
            ),
        )
    if failure.reason == FailureReason.CORRUPT_CHECKPOINT:
        delay = backoff_seconds(plan.failover, s.failover)
        return begin(
            plan,
            UpgradeMode.COMMITTED_OFFSETS,
            CHECKPOINT_RECOVERY,
            from_hash=from_hash,
            delay=delay,
            event=Event(
                type="Warning",
                reason="Restarted",
                message=f"checkpoint generation {generation} is unreadable ({failure.message}); "
                f"starting generation {generation + 1} from the progress group "
                f"in {delay:.0f}s",
            ),
        )
    if not (s.upgrade.allow_fallback and fallback):
        return None
    return begin(
        plan,
        UpgradeMode.COMMITTED_OFFSETS,
        FELL_BACK,
        from_hash=from_hash,
        event=Event(
            type="Warning",
            reason="FellBack",
            message=f"checkpoint generation {generation} is incompatible with the new query "
            f"({failure.message}); falling back to committed-offsets: generation "
            f"{generation + 1} starts from the progress group",
        ),
    )


def degradation(plan: Plan) -> Degradation | None:
    """Why the pipeline is Degraded now, if it is."""
    s, status = plan.s, plan.failover
    spec = s.failover
    steady = s.driver.steady_with(s.status.spec_hash, s.now)
    if steady or status.last_reason is None:
        return None
    if crash_looping(status, spec):
        return Degradation(
            reason="CrashLoop",
            message=f"{len(status.recent)} driver restarts within {spec.window} "
            f"(maxRestarts {spec.max_restarts}); last: [{status.last_reason}] "
            f"{status.last_message}",
        )
    if status.last_reason in {r.value for r in HOPELESS} and status.recent:
        return Degradation(
            reason=status.last_reason,
            message=f"restarting does not help: {status.last_message}",
        )
    if status.last_reason == FailureReason.INCOMPATIBLE_CHECKPOINT.value and status.recent:
        wal = s.status.upgrade
        if wal is not None and wal.reason == OPERATOR_UPGRADE:
            return Degradation(
                reason="IncompatibleCheckpoint",
                message=f"{status.last_message}; the checkpoint cannot serve the query as "
                "this operator renders it, and an operator upgrade never drops state: roll "
                "the operator back, or change spec.restartNonce to restart in upgrade.mode",
            )
        return Degradation(
            reason="IncompatibleCheckpoint",
            message=f"{status.last_message}; upgrade.allowFallback is false: change the spec "
            "or use upgrade.mode committed-offsets",
        )
    return None


def decide(s: Situation) -> Decision:
    """The next lifecycle action for a pipeline (see the module docstring)."""
    plan = Plan(s)
    status, wal = s.status, s.status.upgrade
    if status.spec_hash is None and wal is None and s.claim is ClaimState.DELETING:
        # A claim of an earlier pipeline of the same name is still going: applying now
        # would patch the claim that is being deleted, and the driver would wait for it.
        plan.record.message = f"waiting for the earlier claim {s.claim_name} to be deleted"
        return plan.done(Action.WAIT, requeue_after=POLL_SECONDS)
    if status.spec_hash is None and wal is None and not s.driver.exists:
        spec_hash = s.hash_at(plan.generation, plan.reset)
        plan.record.spec_hash = spec_hash
        plan.record.rendered_by = s.rendered_by
        plan.record.applied_fingerprint = s.fingerprint
        plan.record.checkpoint = CheckpointStatus(
            generation=plan.generation, reset_progress=plan.reset
        )
        plan.record.message = "submitted"
        plan.events.append(
            Event(
                type="Normal",
                reason="Submitted",
                message=f"driver at spec hash {spec_hash}, checkpoint generation {plan.generation}",
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


def _stopping(plan: Plan, wal: UpgradeStatus) -> Decision:
    s = plan.s
    if wal.reason == OPERATOR_UPGRADE and _spec_changed(s):
        # The user changed the spec before the new driver started: that is a restart in the
        # user's mode (nothing of the last-state one was applied yet).
        return _spec_restart(plan, wal.from_hash)
    target = s.hash_at(wal.generation, wal.reset_progress)
    if target != wal.to_hash:
        # The spec changed again before the new driver started: start that one instead.
        wal = wal.model_copy(update={"to_hash": target})
        plan.record.upgrade = wal
    if s.driver.replicas != 0:
        return plan.done(
            Action.STOP, requeue_after=POLL_SECONDS, degraded=_not_stopped(plan.s, wal)
        )
    if s.driver.pods or s.claim is ClaimState.DELETING:
        # A deleted claim goes once no pod uses it; a new one is made only after that.
        return plan.done(
            Action.WAIT, requeue_after=POLL_SECONDS, degraded=_not_stopped(plan.s, wal)
        )
    gave_back = wal.reason == OPERATOR_UPGRADE and not holds_restart_slot(wal, s.upgrade, s.now)
    if gave_back and not s.restart_slot():
        # The stop outlasted its bound and gave its slot back: the new driver waits for one.
        return plan.done(Action.WAIT, requeue_after=UPGRADE_WAIT_SECONDS, hold=True)
    if wal.not_before and s.now < parse_stamp(wal.not_before):
        wait = (parse_stamp(wal.not_before) - s.now).total_seconds()
        return plan.done(Action.WAIT, requeue_after=max(POLL_SECONDS, wait))
    # The old driver is gone: write the next step, then apply the new driver.
    plan.record.upgrade = wal.model_copy(
        update={"step": UpgradeStep.STARTING, "started_at": stamp(s.now)}
    )
    plan.record.spec_hash = target
    plan.record.rendered_by = s.rendered_by
    plan.record.applied_fingerprint = s.fingerprint
    plan.record.checkpoint = CheckpointStatus(
        generation=wal.generation, reset_progress=wal.reset_progress
    )
    plan.generation, plan.reset = wal.generation, wal.reset_progress
    return plan.done(Action.APPLY, requeue_after=POLL_SECONDS)


def _starting(plan: Plan, wal: UpgradeStatus) -> Decision | None:
    """The new driver was applied: wait for it to be Ready; None means "done, go steady"."""
    s = plan.s
    if s.hash_at(wal.generation, wal.reset_progress) != wal.to_hash:
        plan.record.upgrade = None
        return None  # superseded by a newer spec: the steady state starts the next upgrade
    if (
        s.driver.template_hash != wal.to_hash
        or s.driver.replicas != plan.replicas
        or s.claim is ClaimState.MISSING
    ):
        return plan.done(Action.APPLY, requeue_after=POLL_SECONDS)  # an apply was lost
    what = describe(wal.mode, wal.generation, wal.reset_progress)
    if s.suspend or s.driver.ready_with(wal.to_hash):
        plan.record.upgrade = None
        plan.record.message = f"{wal.reason}: {what}, done"
        plan.events.append(
            Event(
                type="Warning" if wal.reason == ROLLED_BACK else "Normal",
                reason="Upgraded",
                message=f"{wal.reason}: driver at spec hash {wal.to_hash}, {what}",
            )
        )
        return None
    failure = plan.checkpoint_failure(wal.to_hash)
    if failure is not None and not (
        failure.reason == FailureReason.INCOMPATIBLE_CHECKPOINT
        and wal.mode is not UpgradeMode.LAST_STATE
    ):
        decision = recover(plan, failure, wal.to_hash, fallback=wal.reason != OPERATOR_UPGRADE)
        if decision is not None:
            return decision
    timeout = s.upgrade.readiness_timeout.delta
    started = parse_stamp(wal.started_at) if wal.started_at else s.now
    if s.now - started < timeout:
        left = (started + timeout - s.now).total_seconds()
        return plan.done(
            Action.WAIT,
            requeue_after=min(max(left, POLL_SECONDS), UPGRADE_WAIT_SECONDS),
            degraded=degradation(plan),
        )
    stable = s.status.last_stable_fingerprint
    if s.upgrade.rollback and stable and not s.running_stable and stable != s.fingerprint:
        plan.record.rolled_back_fingerprint = s.fingerprint
        plan.generation, plan.reset = wal.generation, wal.reset_progress
        # The rolled-back spec's hash is known once the lifecycle renders the stable spec:
        # the Stopping step refreshes toHash then.
        return begin(
            plan,
            UpgradeMode.COMMITTED_OFFSETS,
            ROLLED_BACK,
            from_hash=wal.to_hash,
            event=Event(
                type="Warning",
                reason="RolledBack",
                message=f"driver at spec hash {wal.to_hash} not Ready within "
                f"{s.upgrade.readiness_timeout}; "
                "rolling back to the last stable spec as a new checkpoint generation "
                "from the progress group",
            ),
        )
    return plan.done(
        Action.WAIT,
        requeue_after=UPGRADE_WAIT_SECONDS,
        degraded=degradation(plan)
        or Degradation(
            reason="UpgradeNotReady",
            message=f"driver at spec hash {wal.to_hash} not Ready within "
            f"{s.upgrade.readiness_timeout}",
        ),
    )


def _steady(plan: Plan) -> Decision:
    s = plan.s
    status = s.status
    record = plan.record
    applied = record.spec_hash if "spec_hash" in record.model_fields_set else status.spec_hash
    if s.claim.gone and applied is not None:
        return _checkpoint_lost(plan, applied)
    failure = plan.checkpoint_failure(applied)
    if failure is not None:
        decision = recover(plan, failure, applied)
        if decision is not None:
            return decision
    if s.hash_at(plan.generation, plan.reset) != applied:
        if _spec_changed(s):
            return _spec_restart(plan, applied)
        return _operator_upgrade(plan, applied)
    if status.rendered_by != s.rendered_by:
        # The spec hash is what this operator renders: its version is recorded, nothing
        # restarts (also where an older operator recorded no version).
        record.rendered_by = s.rendered_by
    action = Action.WAIT
    if (
        not s.driver.exists
        or s.driver.replicas != plan.replicas
        or status.applied_fingerprint != s.fingerprint
    ):
        action = Action.APPLY
        record.applied_fingerprint = s.fingerprint
        if s.driver.exists and s.driver.replicas != plan.replicas:
            if s.suspend:
                plan.events.append(
                    Event(
                        type="Normal",
                        reason="Suspended",
                        message="stopping the driver gracefully; state is kept",
                    )
                )
                record.message = "suspended"
            else:
                plan.events.append(
                    Event(
                        type="Normal",
                        reason="Resumed",
                        message=f"driver resumes checkpoint generation {plan.generation}",
                    )
                )
                record.message = "resumed"
    if (
        s.driver.steady_with(applied, s.now)
        and not s.running_stable
        and status.last_stable_fingerprint != s.fingerprint
    ):
        record.last_stable_spec = s.spec_dump
        record.last_stable_fingerprint = s.fingerprint
    return plan.done(action, degraded=degradation(plan))


def _spec_changed(s: Situation) -> bool:
    """Whether the user's spec changed since it was applied (else only its rendering did).

    An older operator that wrote no fingerprint leaves it unknown: that counts as unchanged,
    so the restart is the one that is safe in every mode (last-state).
    """
    applied = s.status.applied_fingerprint
    return applied is not None and applied != s.fingerprint


def _spec_restart(plan: Plan, from_hash: str | None) -> Decision:
    """A restart for a changed spec (or restartNonce, or a rollback), in ``upgrade.mode``."""
    s = plan.s
    reason = ROLLED_BACK if s.running_stable else s.restart_reason
    return begin(plan, s.upgrade.mode, reason, from_hash=from_hash)


def _operator_upgrade(plan: Plan, applied: str | None) -> Decision:
    """The same spec renders differently: a throttled restart in last-state.

    A driver with no pod (suspended, or not created) needs no slot.  While none is free the
    children stay as they are (``hold``) and the pipeline looks again when one frees.
    """
    s = plan.s
    if s.driver.pods and not s.restart_slot():
        message = (
            f"{OPERATOR_UPGRADE}: the driver runs spec hash {applied}, this operator renders "
            f"{s.hash_at(plan.generation, plan.reset)}; waiting for a restart slot (other "
            "drivers are restarting for the operator upgrade)"
        )
        if s.status.message != message:
            plan.record.message = message
        return plan.done(
            Action.WAIT,
            requeue_after=UPGRADE_WAIT_SECONDS,
            degraded=degradation(plan),
            hold=True,
        )
    return begin(plan, UpgradeMode.LAST_STATE, OPERATOR_UPGRADE, from_hash=applied)


def holds_restart_slot(
    wal: UpgradeStatus | None, upgrade: UpgradeSpec, now: datetime.datetime
) -> bool:
    """Whether an upgrade in flight counts against the operator's restart slots.

    An operator-upgrade restart does until its driver is Ready, or until a step has run for
    ``readinessTimeout``: a stop whose driver pod does not go (``DriverNotStopped``) or a start
    whose driver is not Ready (``UpgradeNotReady``).  The pipeline is Degraded then, and the
    slot serves other pipelines; a stop that ends later waits for a free slot to start.
    """
    if wal is None or wal.reason != OPERATOR_UPGRADE:
        return False
    return not _overdue(wal, upgrade, now)


def _overdue(wal: UpgradeStatus, upgrade: UpgradeSpec, now: datetime.datetime) -> bool:
    """Whether the upgrade's step has run for ``readinessTimeout``: a stop since the upgrade
    began (a driver pod that does not go), a start since its driver was applied."""
    since = (wal.began_at or wal.started_at) if wal.step is UpgradeStep.STOPPING else wal.started_at
    if since is None:
        return False
    timeout = upgrade.readiness_timeout.delta
    return now - parse_stamp(since) >= timeout


def _not_stopped(s: Situation, wal: UpgradeStatus) -> Degradation | None:
    """Why the pipeline is Degraded while its old driver has not stopped for ``readinessTimeout``
    (a pod on a lost node, or held by a finalizer), else None; the new driver still waits."""
    if not _overdue(wal, s.upgrade, s.now):
        return None
    pods = ", ".join(p.name for p in s.driver.pods) or "the StatefulSet's"
    freed = (
        "; its operator-upgrade restart slot is free for other pipelines"
        if wal.reason == OPERATOR_UPGRADE
        else ""
    )
    return Degradation(
        reason="DriverNotStopped",
        message=f"{wal.reason}: driver pod {pods} has not stopped within "
        f"{s.upgrade.readiness_timeout} of the stop "
        f"(upgrade.readinessTimeout){freed}; the new driver starts once it is gone (a pod of a "
        "lost node stays until it is deleted: kubectl delete pod --force)",
    )


def _checkpoint_lost(plan: Plan, applied: str) -> Decision:
    """The checkpoint claim is gone: the next generation starts from the progress group.

    The old driver stops first (a deleted claim stays until no pod uses it);
    the Starting step makes a new claim.
    """
    s = plan.s
    state = "missing" if s.claim is ClaimState.MISSING else "being deleted"
    return begin(
        plan,
        UpgradeMode.COMMITTED_OFFSETS,
        CHECKPOINT_LOST,
        from_hash=applied,
        event=Event(
            type="Warning",
            reason=CHECKPOINT_LOST,
            message=f"checkpoint claim {s.claim_name} is {state}: checkpoint generation "
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
    # Accepted once: what a newer operator recorded, or a rule tightened since, still runs.
    stable = validate_lenient(PipelineSpec, status.last_stable_spec, ratchet=True).value
    stable = stable.model_copy(update={"suspend": pipeline.spec.suspend})
    return pipeline.model_copy(update={"spec": stable}), True
