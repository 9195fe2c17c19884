"""Pure status decisions: (pipeline, what was observed) -> the status to write.

Conditions follow Kubernetes conventions and are kstatus-compatible: besides
``Ready``, ``Progressing`` and ``Degraded`` (what people read), the status
carries ``Reconciling`` and ``Stalled`` (what kstatus, Flux and Argo CD's
generic health read) and ``observedGeneration``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eop_operator.api.models import Condition, ConditionStatus, Phase, PipelineStatus

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
RECONCILING = "Reconciling"
STALLED = "Stalled"


@dataclass(frozen=True)
class DriverObservation:
    """What the driver StatefulSet reports."""

    desired: int
    ready: int
    rolled_out: bool

    @classmethod
    def from_statefulset(cls, sts: dict[str, Any]) -> DriverObservation:
        """Read replicas and rollout progress from a StatefulSet object."""
        spec, status = sts.get("spec", {}), sts.get("status", {})
        generation = sts.get("metadata", {}).get("generation")
        rolled_out = status.get("observedGeneration") == generation and status.get(
            "updateRevision"
        ) in (None, status.get("currentRevision"))
        return cls(
            desired=int(spec.get("replicas", 1)),
            ready=int(status.get("readyReplicas", 0)),
            rolled_out=bool(rolled_out),
        )


@dataclass(frozen=True)
class Verdict:
    """The phase and the conditions that say why."""

    phase: Phase
    ready: bool
    progressing: bool
    degraded: bool
    reason: str
    message: str


def judge(*, suspend: bool, driver: DriverObservation | None, error: str | None) -> Verdict:
    """Decide phase and conditions from suspension, the driver and any reconcile error."""
    if error is not None:
        return Verdict(Phase.INVALID, False, False, True, "InvalidSpec", error)
    if suspend:
        settled = driver is None or driver.ready == 0
        if settled:
            return Verdict(Phase.SUSPENDED, False, False, False, "Suspended", "driver stopped")
        return Verdict(
            Phase.SUSPENDED, False, True, False, "Suspending", "waiting for the driver to stop"
        )
    if driver is None:
        return Verdict(Phase.PENDING, False, True, False, "Creating", "driver not created yet")
    if driver.ready >= 1 and driver.rolled_out:
        return Verdict(Phase.RUNNING, True, False, False, "DriverReady", "driver is running")
    if not driver.rolled_out:
        return Verdict(Phase.PENDING, False, True, False, "RollingOut", "driver is being replaced")
    return Verdict(Phase.PENDING, False, True, False, "DriverStarting", "driver not ready yet")


def lifecycle_verdict(
    *,
    suspend: bool,
    driver: DriverObservation | None,
    degraded: tuple[str, str] | None,
    upgrading: str | None,
) -> Verdict:
    """The verdict once the lifecycle is known: Degraded and Upgrading win over the driver's."""
    if degraded is not None:
        reason, message = degraded
        return Verdict(Phase.DEGRADED, False, False, True, reason, message)
    if upgrading is not None and not suspend:
        return Verdict(Phase.UPGRADING, False, True, False, "Upgrading", upgrading)
    return judge(suspend=suspend, driver=driver, error=None)


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
    previous: list[Condition], verdict: Verdict, *, generation: int | None, now: str
) -> list[Condition]:
    """All conditions for a verdict, keeping transition times of unchanged ones."""
    stalled = verdict.degraded and verdict.reason == "InvalidSpec"
    table = [
        (READY, verdict.ready),
        (PROGRESSING, verdict.progressing),
        (DEGRADED, verdict.degraded),
        (RECONCILING, verdict.progressing),
        (STALLED, stalled),
    ]
    return [
        _condition(
            previous, kind, value, verdict.reason, verdict.message, generation=generation, now=now
        )
        for kind, value in table
    ]


def ready_column(driver: DriverObservation | None, *, suspend: bool) -> str:
    """The READY column: ready driver pods over desired ones."""
    if driver is not None:
        return f"{driver.ready}/{driver.desired}"
    return f"0/{0 if suspend else 1}"


def status_patch(
    verdict: Verdict,
    *,
    previous: PipelineStatus,
    generation: int | None,
    ready: str,
    now: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The merge patch of ``.status`` for a verdict (plus any extra fields)."""
    patch: dict[str, Any] = {
        "phase": verdict.phase.value,
        "ready": ready,
        "observedGeneration": generation,
        "conditions": [
            c.model_dump(by_alias=True, exclude_none=True, mode="json")
            for c in conditions(previous.conditions, verdict, generation=generation, now=now)
        ],
    }
    patch.update(extra or {})
    return patch
