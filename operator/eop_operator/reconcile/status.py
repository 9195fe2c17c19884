"""Pure status decisions: (pipeline, what was observed) -> the status to write.

Conditions follow Kubernetes conventions and are kstatus-compatible: besides
``Ready``, ``Progressing`` and ``Degraded`` (what people read), the status
carries ``Reconciling`` and ``Stalled`` (what kstatus, Flux and Argo CD's
generic health read) and ``observedGeneration``.
"""

from __future__ import annotations

import datetime
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
from eop_operator.reconcile.failover import classify
from eop_operator.reconcile.observe import (
    RECOVERY_SECONDS,
    ClaimState,
    DriverState,
    PodObservation,
    WarningEvent,
)
from eop_operator.render.naming import EXECUTORS_ANNOTATION, executor_selector

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


@dataclass(frozen=True)
class Cause:
    """Why the driver does not run, in the words of the pod, its events and the claim."""

    #: A short CamelCase reason (the REASON column of ``kubectl get eop``).
    reason: str
    message: str
    #: Waiting does not help (a crash loop, an image that cannot be pulled): Degraded.
    stuck: bool


#: Container waiting reasons of an image that cannot be had.
IMAGE_PULL = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
#: Container waiting reasons of a container the runtime cannot create or start.
CONTAINER_FAILED = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
#: Pod events of a pod that gets no sandbox (network, runtime) from the kubelet.
SANDBOX_FAILED = frozenset({"FailedCreatePodSandBox"})
#: Pod events of volumes that cannot be attached or mounted.
VOLUME_FAILED = frozenset({"FailedMount", "FailedAttachVolume", "FailedMapVolume"})
#: StatefulSet events of a pod the API server refuses (quota, LimitRange, admission).
FAILED_CREATE = frozenset({"FailedCreate"})
#: Pod events that stop a pod before its container starts: (reason, event reasons, what it
#: means, whether waiting does not help).
_POD_EVENTS = (
    ("SandboxFailed", SANDBOX_FAILED, "the driver pod gets no sandbox or network", True),
    ("VolumeFailed", VOLUME_FAILED, "a volume of the driver pod cannot be mounted", False),
)
#: How much of a Kubernetes message a condition quotes.
QUOTE_LIMIT = 400


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= QUOTE_LIMIT else text[: QUOTE_LIMIT - 3] + "..."


def _crash(pod: PodObservation, *, stuck: bool) -> Cause:
    """A driver that ended: its termination message as the runner wrote it."""
    assert pod.termination is not None
    reason, message = classify(pod.termination)
    times = "1 time" if pod.restart_count == 1 else f"{pod.restart_count} times"
    return Cause(
        "CrashLoop" if stuck else "DriverRestarted",
        f"the driver exited (code {pod.termination.exit_code}) and restarted {times}; "
        f"last: [{reason}] {_quote(message)}",
        stuck,
    )


def _latest(
    warnings: Sequence[WarningEvent], kind: str, match: str, reasons: frozenset[str] | None = None
) -> WarningEvent | None:
    """The newest warning about the object of ``kind`` whose uid (or, for claims, name) is
    ``match``, among ``reasons`` when given."""
    found = [
        w
        for w in warnings
        if w.kind == kind
        and match in (w.uid, w.name if kind == "PersistentVolumeClaim" else "")
        and (reasons is None or w.reason in reasons)
    ]
    return max(found, key=lambda w: w.at) if found else None


def pod_cause(driver: DriverState, now: datetime.datetime) -> Cause | None:
    """What the driver pod's own status says is wrong, if anything (no events needed)."""
    pods = [p for p in driver.pods if not p.deleting]
    if not pods:
        return None
    pod = pods[0]
    if pod.waiting is not None:
        reason, message = pod.waiting
        if reason in IMAGE_PULL:
            return Cause(
                "ImagePullFailed",
                f"the driver image cannot be pulled ({reason}): {_quote(message)}",
                True,
            )
        if reason == "CrashLoopBackOff" and pod.termination is not None:
            return _crash(pod, stuck=True)
        if reason in CONTAINER_FAILED:
            return Cause(
                "ContainerFailed",
                f"the driver container cannot start ({reason}): {_quote(message)}",
                True,
            )
    if pod.restarted_within(now, RECOVERY_SECONDS):
        return _crash(pod, stuck=pod.restart_count >= 2)
    if pod.unschedulable is not None:
        return Cause(
            "Unschedulable",
            f"the driver pod cannot be scheduled: {_quote(pod.unschedulable)}",
            False,
        )
    return None


def diagnose(
    driver: DriverState,
    *,
    claim: ClaimState,
    claim_name: str | None,
    warnings: Sequence[WarningEvent],
    statefulset_uid: str | None,
    now: datetime.datetime,
) -> Cause | None:
    """Why the driver is not running, or None when it runs (or nothing more is known).

    Pure: the pod's status first (waiting reasons, a termination a moment ago,
    the scheduler's word), then the claim, then the warnings about the pod, the
    StatefulSet and the claim (``warnings``: one list of the namespace's
    Warning events, read only when the driver is not running).
    """
    pods = [p for p in driver.pods if not p.deleting]
    if pods and pods[0].ready and not pods[0].restarted_within(now, RECOVERY_SECONDS):
        return None
    found = pod_cause(driver, now)
    if found is not None:
        return found
    if claim_name is not None and claim.gone:
        state = "missing" if claim is ClaimState.MISSING else "being deleted"
        return Cause(
            "CheckpointClaimMissing",
            f"checkpoint claim {claim_name} is {state}: the operator makes a new one for "
            "the next checkpoint generation",
            False,
        )
    if claim_name is not None and claim is ClaimState.LOST:
        return Cause(
            "CheckpointClaimLost",
            f"checkpoint claim {claim_name} lost its volume (phase Lost): delete the claim "
            "and the operator starts the next checkpoint generation on a new one",
            True,
        )
    if not pods:
        created = _latest(warnings, "StatefulSet", statefulset_uid or "", FAILED_CREATE)
        if created is not None and driver.exists and driver.replicas > 0:
            return Cause(
                "FailedCreate",
                f"the driver StatefulSet cannot create its pod: {_quote(created.message)}",
                True,
            )
        return None
    pod = pods[0]
    for reason, reasons, what, stuck in _POD_EVENTS:
        event = _latest(warnings, "Pod", pod.uid, reasons)
        if event is not None and not pod.started:
            return Cause(reason, f"{what} ({event.reason}): {_quote(event.message)}", stuck)
    if claim_name is not None and claim is ClaimState.PENDING:
        provisioning = _latest(warnings, "PersistentVolumeClaim", claim_name)
        detail = f": {_quote(provisioning.message)}" if provisioning else ""
        stuck = provisioning is not None and provisioning.reason == "ProvisioningFailed"
        return Cause("ClaimPending", f"checkpoint claim {claim_name} is Pending{detail}", stuck)
    other = _latest(warnings, "Pod", pod.uid)
    if other is not None and not pod.started:
        return Cause(
            "DriverStarting",
            f"driver not ready yet ({other.reason}): {_quote(other.message)}",
            False,
        )
    return None


def lifecycle_verdict(
    *,
    suspend: bool,
    driver: DriverObservation | None,
    degraded: tuple[str, str] | None,
    upgrading: str | None,
    cause: Cause | None = None,
    refused: Sequence[str] = (),
) -> Verdict:
    """The verdict once the lifecycle is known: Degraded and Upgrading win over the driver's.

    ``cause`` (see :func:`diagnose`) says why the driver does not run: it names
    the reason and message, and makes the pipeline Degraded when waiting does
    not help. ``refused`` are the objects the API server refused to apply.
    """
    if degraded is not None:
        reason, message = degraded
        verdict = Verdict(Phase.DEGRADED, False, False, True, reason, message)
    elif upgrading is not None and not suspend:
        verdict = Verdict(Phase.UPGRADING, False, True, False, "Upgrading", upgrading)
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
            phase = Phase.DEGRADED if cause.stuck else Phase.PENDING
            verdict = Verdict(
                phase, False, not cause.stuck, cause.stuck, cause.reason, cause.message
            )
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
    previous: list[Condition], verdict: Verdict, *, generation: int | None, now: str
) -> list[Condition]:
    """All conditions for a verdict, keeping transition times of unchanged ones."""
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


def scale_status(pipeline: ExactlyOncePipeline, driver: DriverObservation | None) -> dict[str, Any]:
    """``status.executors`` and ``status.executorSelector``: what ``/scale`` reports.

    Both unset (null, which a merge patch removes) without executors on Kubernetes.
    """
    if not pipeline.spec.spark.on_kubernetes:
        return {"executors": None, "executorSelector": None}
    running = driver.running_executors() if driver is not None else None
    return {"executors": running or 0, "executorSelector": executor_selector(pipeline)}
