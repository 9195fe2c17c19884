"""Pure status decisions: (pipeline, what was observed) -> the phase and the conditions.

Conditions follow Kubernetes conventions and are kstatus-compatible: besides
``Ready``, ``Progressing`` and ``Degraded`` (what people read), the status
carries ``Reconciling`` and ``Stalled`` (what kstatus, Flux and Argo CD's
generic health read) and ``observedGeneration``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from eop_operator.api.models import (
    Condition,
    ConditionStatus,
    ExactlyOncePipeline,
    Phase,
    PipelineStatus,
)
from eop_operator.api.status_patch import LifecyclePatch
from eop_operator.reconcile.causes import Cause
from eop_operator.reconcile.children import NotOwned
from eop_operator.reconcile.decision import Degradation
from eop_operator.render.naming import EXECUTORS_ANNOTATION, executor_selector

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
RECONCILING = "Reconciling"
STALLED = "Stalled"
#: True while the operator runs a spec that breaks a rule added or tightened after the spec
#: was accepted (ratcheting): no Degraded, the spec runs; a changed spec must obey the rule.
SPEC_NO_LONGER_VALID = "SpecNoLongerValid"
#: The condition types this operator writes; others (a newer operator's) are kept as found.
OWNED_CONDITIONS = (READY, PROGRESSING, DEGRADED, RECONCILING, STALLED, SPEC_NO_LONGER_VALID)


@dataclass(frozen=True, kw_only=True)
class DriverObservation:
    """What the driver StatefulSet reports."""

    desired: int
    ready: int
    rolled_out: bool
    #: Executors the driver of the StatefulSet's template starts (None: none on Kubernetes).
    executors: int | None = None

    @classmethod
    def from_statefulset(cls, sts: dict[str, Any]) -> DriverObservation:
        """Read replicas and rollout progress from a StatefulSet object."""
        spec, status = sts.get("spec", {}), sts.get("status", {})
        generation = sts.get("metadata", {}).get("generation")
        rolled_out = status.get("observedGeneration") == generation and status.get(
            "updateRevision"
        ) in (None, status.get("currentRevision"))
        annotations = spec.get("template", {}).get("metadata", {}).get("annotations") or {}
        executors = annotations.get(EXECUTORS_ANNOTATION)
        return cls(
            desired=int(spec.get("replicas", 1)),
            ready=int(status.get("readyReplicas", 0)),
            rolled_out=bool(rolled_out),
            executors=int(executors) if executors is not None else None,
        )

    def running_executors(self) -> int | None:
        """The executors of the Ready driver (0 while none is Ready); None off Kubernetes.

        A driver rolled out with a new count is Ready only once it runs; until then the
        template already holds the new count, and this says 0.
        """
        if self.executors is None:
            return None
        return self.executors if self.ready > 0 and self.rolled_out else 0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The phase and the conditions that say why (``ready``, ``progressing``, ``degraded``)."""

    phase: Phase
    ready: bool
    progressing: bool
    degraded: bool
    reason: str
    message: str


def judge(*, suspend: bool, driver: DriverObservation | None, error: str | None) -> Verdict:
    """Decide phase and conditions from suspension, the driver and any reconcile error."""
    if error is not None:
        return _stuck(Phase.INVALID, "InvalidSpec", error)
    if suspend:
        if driver is None or driver.ready == 0:
            return _settled(Phase.SUSPENDED, "Suspended", "driver stopped")
        return _pending(Phase.SUSPENDED, "Suspending", "waiting for the driver to stop")
    if driver is None:
        return _pending(Phase.PENDING, "Creating", "driver not created yet")
    if driver.ready >= 1 and driver.rolled_out:
        return Verdict(
            phase=Phase.RUNNING,
            ready=True,
            progressing=False,
            degraded=False,
            reason="DriverReady",
            message="driver is running",
        )
    if not driver.rolled_out:
        return _pending(Phase.PENDING, "RollingOut", "driver is being replaced")
    return _pending(Phase.PENDING, "DriverStarting", "driver not ready yet")


def failed_step(message: str) -> Verdict:
    """The operator cannot take the pipeline's next step (an error of its own, not the
    spec's): Degraded, reason ``ReconcileFailed``, until a step succeeds again."""
    return _stuck(Phase.DEGRADED, "ReconcileFailed", message)


def _pending(phase: Phase, reason: str, message: str) -> Verdict:
    """Not Ready, on its way (Progressing)."""
    return Verdict(
        phase=phase, ready=False, progressing=True, degraded=False, reason=reason, message=message
    )


def _settled(phase: Phase, reason: str, message: str) -> Verdict:
    """Not Ready, and nothing under way."""
    return Verdict(
        phase=phase, ready=False, progressing=False, degraded=False, reason=reason, message=message
    )


def _stuck(phase: Phase, reason: str, message: str) -> Verdict:
    """Not Ready, and waiting does not help (Degraded)."""
    return Verdict(
        phase=phase, ready=False, progressing=False, degraded=True, reason=reason, message=message
    )


def lifecycle_verdict(
    *,
    suspend: bool,
    driver: DriverObservation | None,
    degraded: Degradation | None,
    upgrading: str | None,
    cause: Cause | None = None,
    refused: Sequence[str] = (),
) -> Verdict:
    """The verdict once the lifecycle is known: Degraded and Upgrading win over the driver's.

    ``cause`` (see ``reconcile.causes.diagnose``) says why the driver does not run: it names
    the reason and message, and makes the pipeline Degraded when waiting does
    not help. ``refused`` are the objects the API server refused to apply, and those eop
    would not (:class:`NotOwned`: someone else's object of a child's name makes it Degraded).
    """
    not_owned = [line for line in refused if isinstance(line, NotOwned)]
    if not_owned and degraded is None:
        degraded = Degradation(reason="ChildNotOwned", message="; ".join(not_owned))
        refused = [line for line in refused if not isinstance(line, NotOwned)]
    if degraded is not None:
        verdict = _stuck(Phase.DEGRADED, degraded.reason, degraded.message)
    elif upgrading is not None and not suspend:
        verdict = _pending(Phase.UPGRADING, "Upgrading", upgrading)
        if cause is not None:
            verdict = replace(
                verdict,
                degraded=cause.stuck,
                reason=cause.reason,
                message=f"{upgrading}; {cause.message}",
            )
    else:
        verdict = judge(suspend=suspend, driver=driver, error=None)
        if cause is not None and not suspend:
            if cause.stuck:
                verdict = _stuck(Phase.DEGRADED, cause.reason, cause.message)
            else:
                verdict = _pending(Phase.PENDING, cause.reason, cause.message)
    if refused:
        listed = "; ".join(refused)
        verdict = replace(
            verdict,
            reason="ApplyRefused" if verdict.phase is Phase.RUNNING else verdict.reason,
            message=f"{verdict.message}; refused by the API server: {listed}",
        )
    return verdict


def _condition(
    previous: list[Condition],
    kind: str,
    value: bool,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> Condition:
    status = ConditionStatus.TRUE if value else ConditionStatus.FALSE
    before = next((c for c in previous if c.type == kind), None)
    # lastTransitionTime moves only when the status flips, as conventions require.
    since = before.last_transition_time if before and before.status == status else now
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def conditions(
    previous: list[Condition],
    verdict: Verdict,
    *,
    generation: int | None,
    now: str,
    ratcheted: tuple[str, ...] = (),
) -> list[Condition]:
    """All conditions for a verdict, keeping transition times of unchanged ones.

    ``ratcheted``: the rules the running spec no longer passes (a ``SpecNoLongerValid``
    condition names them).  Conditions of types this operator does not write (a newer
    operator's) are kept: the list is written whole.
    """
    # kstatus, Flux and Argo CD's generic health read Stalled as "Failed": every Degraded
    # verdict needs a person (a crash loop, a refused generation, an invalid spec), so a
    # GitOps tool reports it at once instead of when its health-check timeout runs out.
    stalled = verdict.degraded
    table = [
        (READY, verdict.ready),
        (PROGRESSING, verdict.progressing),
        (DEGRADED, verdict.degraded),
        (RECONCILING, verdict.progressing),
        (STALLED, stalled),
    ]
    written = [
        _condition(
            previous, kind, value, verdict.reason, verdict.message, generation=generation, now=now
        )
        for kind, value in table
    ]
    if ratcheted:
        message = (
            "the spec runs as accepted but breaks rules of this operator version; a changed "
            f"spec must pass them: {'; '.join(ratcheted)}"
        )
        written.append(
            _condition(
                previous,
                SPEC_NO_LONGER_VALID,
                True,
                "RuleTightened",
                message,
                generation=generation,
                now=now,
            )
        )
    return written + [c for c in previous if c.type not in OWNED_CONDITIONS]


def ready_column(driver: DriverObservation | None, *, suspend: bool) -> str:
    """The READY column: ready driver pods over desired ones."""
    if driver is not None:
        return f"{driver.ready}/{driver.desired}"
    return f"0/{0 if suspend else 1}"


def verdict_status(
    verdict: Verdict,
    *,
    previous: PipelineStatus,
    generation: int | None,
    ready: str,
    now: str,
    ratcheted: tuple[str, ...] = (),
) -> LifecyclePatch:
    """The status a verdict sets: phase, READY, observedGeneration and the conditions.

    ``ratcheted``: rules the running spec no longer passes (see :func:`conditions`).
    """
    return LifecyclePatch(
        phase=verdict.phase,
        ready=ready,
        observed_generation=generation,
        conditions=conditions(
            previous.conditions, verdict, generation=generation, now=now, ratcheted=ratcheted
        ),
    )


def scale_status(pipeline: ExactlyOncePipeline, driver: DriverObservation | None) -> LifecyclePatch:
    """``status.executors`` and ``status.executorSelector``: what ``/scale`` reports.

    Both unset (null, which a merge patch removes) without executors on Kubernetes.
    """
    if not pipeline.spec.spark.on_kubernetes:
        return LifecyclePatch(executors=None, executor_selector=None)
    running = driver.running_executors() if driver is not None else None
    return LifecyclePatch(executors=running or 0, executor_selector=executor_selector(pipeline))
