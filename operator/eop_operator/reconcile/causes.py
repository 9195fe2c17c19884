"""Why a driver does not run, in the words of its pod, its events and its claim (pure).

:func:`pod_cause` reads the driver pod's own status; :func:`diagnose` adds the
claim and the namespace's Warning events.  The lifecycle puts the cause in the
conditions' reason and message (``reconcile.status.lifecycle_verdict``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from eop_operator.reconcile.failover import classify
from eop_operator.reconcile.observe import (
    RECOVERY_SECONDS,
    ClaimState,
    DriverState,
    PodObservation,
    WarningEvent,
)


@dataclass(frozen=True, kw_only=True)
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
        reason="CrashLoop" if stuck else "DriverRestarted",
        message=f"the driver exited (code {pod.termination.exit_code}) and restarted {times}; "
        f"last: [{reason}] {_quote(message)}",
        stuck=stuck,
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
                reason="ImagePullFailed",
                message=f"the driver image cannot be pulled ({reason}): {_quote(message)}",
                stuck=True,
            )
        if reason == "CrashLoopBackOff" and pod.termination is not None:
            return _crash(pod, stuck=True)
        if reason in CONTAINER_FAILED:
            return Cause(
                reason="ContainerFailed",
                message=f"the driver container cannot start ({reason}): {_quote(message)}",
                stuck=True,
            )
    if pod.restarted_within(now, RECOVERY_SECONDS):
        return _crash(pod, stuck=pod.restart_count >= 2)
    if pod.unschedulable is not None:
        return Cause(
            reason="Unschedulable",
            message=f"the driver pod cannot be scheduled: {_quote(pod.unschedulable)}",
            stuck=False,
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
            reason="CheckpointClaimMissing",
            message=f"checkpoint claim {claim_name} is {state}: the operator makes a new one "
            "for the next checkpoint generation",
            stuck=False,
        )
    if claim_name is not None and claim is ClaimState.LOST:
        return Cause(
            reason="CheckpointClaimLost",
            message=f"checkpoint claim {claim_name} lost its volume (phase Lost): delete the "
            "claim and the operator starts the next checkpoint generation on a new one",
            stuck=True,
        )
    if not pods:
        created = _latest(warnings, "StatefulSet", statefulset_uid or "", FAILED_CREATE)
        if created is not None and driver.exists and driver.replicas > 0:
            return Cause(
                reason="FailedCreate",
                message=f"the driver StatefulSet cannot create its pod: {_quote(created.message)}",
                stuck=True,
            )
        return None
    pod = pods[0]
    for reason, reasons, what, stuck in _POD_EVENTS:
        event = _latest(warnings, "Pod", pod.uid, reasons)
        if event is not None and not pod.started:
            message = f"{what} ({event.reason}): {_quote(event.message)}"
            return Cause(reason=reason, message=message, stuck=stuck)
    if claim_name is not None and claim is ClaimState.PENDING:
        provisioning = _latest(warnings, "PersistentVolumeClaim", claim_name)
        detail = f": {_quote(provisioning.message)}" if provisioning else ""
        stuck = provisioning is not None and provisioning.reason == "ProvisioningFailed"
        return Cause(
            reason="ClaimPending",
            message=f"checkpoint claim {claim_name} is Pending{detail}",
            stuck=stuck,
        )
    other = _latest(warnings, "Pod", pod.uid)
    if other is not None and not pod.started:
        return Cause(
            reason="DriverStarting",
            message=f"driver not ready yet ({other.reason}): {_quote(other.message)}",
            stuck=False,
        )
    return None
