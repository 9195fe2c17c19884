"""What the operator sees of a driver: its StatefulSet and pods, read into plain values.

Pure: Kubernetes objects (dicts) in, frozen dataclasses out, so the lifecycle
decisions can be tested without an API server.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eop_operator.render.naming import GENERATION_ANNOTATION, SPEC_HASH_ANNOTATION


@dataclass(frozen=True)
class Termination:
    """The last time the driver container ended."""

    #: None: no kubelet ever reported an end (the pod went with its node).
    exit_code: int | None
    message: str
    #: Whether it ended right now (state.terminated) rather than before a restart.
    current: bool = False
    #: When it ended (the kubelet's ``finishedAt``, RFC 3339 seconds), if known.
    finished_at: str | None = None
    #: The pod was ended by Kubernetes while its container ran as last reported: its node
    #: stopped reporting (lost, cut off or shut down) and the pod was evicted or
    #: garbage-collected there (see :func:`lost_with_node`).
    node_lost: bool = False


def lost_with_node(pod: dict[str, Any]) -> Termination | None:
    """The end of a driver pod that Kubernetes failed while no kubelet said its container ended.

    A node that stops reporting cannot tell that its containers stopped: the API server keeps
    the container ``running`` until the pod is gone. The taint manager (a ``NoExecute``
    taint: ``node.kubernetes.io/out-of-service``, or ``unreachable``/``not-ready`` after the
    toleration) or PodGC marks the pod ``DisruptionTarget`` and ``Failed`` and deletes it;
    the StatefulSet then starts the driver on another node.
    """
    meta, status = pod.get("metadata", {}), pod.get("status", {})
    if status.get("phase") != "Failed":
        return None
    for container in status.get("containerStatuses") or []:
        if container.get("name") == "driver" and "running" not in (container.get("state") or {}):
            return None
    disruption: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"), {}
    )
    node = pod.get("spec", {}).get("nodeName") or "?"
    why = " ".join(
        str(disruption.get(k) or "").strip() for k in ("reason", "message") if disruption.get(k)
    )
    return Termination(
        exit_code=None,
        message=f"the driver pod was deleted while its node {node} was not reporting"
        + (f" ({why})" if why else ""),
        finished_at=disruption.get("lastTransitionTime") or meta.get("deletionTimestamp"),
        node_lost=True,
    )


@dataclass(frozen=True)
class PodObservation:
    """One driver pod."""

    name: str
    uid: str
    phase: str = "Pending"
    ready: bool = False
    spec_hash: str | None = None
    generation: int | None = None
    deleting: bool = False
    restart_count: int = 0
    termination: Termination | None = None
    #: The driver container's ``state.waiting`` (reason, message), e.g. ImagePullBackOff.
    waiting: tuple[str, str] | None = None
    #: The scheduler's word when it cannot place the pod (PodScheduled False).
    unschedulable: str | None = None
    #: Whether the kubelet has started the driver container at least once.
    started: bool = False

    def _since_restart(self, now: datetime.datetime) -> float | None:
        """Seconds since the driver container ended before its last restart (None: it did not)."""
        ended = self.termination
        if ended is None or ended.current or self.restart_count == 0 or not ended.finished_at:
            return None
        finished = datetime.datetime.strptime(ended.finished_at, "%Y-%m-%dT%H:%M:%SZ")
        return (now - finished.replace(tzinfo=datetime.UTC)).total_seconds()

    def restarted_within(self, now: datetime.datetime, seconds: float) -> bool:
        """Whether the driver container ended (and was restarted) less than ``seconds`` ago.

        A crash-looping driver is Ready for a moment between two crashes: its
        previous termination (``lastState.terminated``) tells it apart from a
        driver that runs.
        """
        since = self._since_restart(now)
        return since is not None and since < seconds

    def recovers_in(self, now: datetime.datetime) -> float:
        """Seconds until a restart less than ``RECOVERY_SECONDS`` ago stops counting (else inf)."""
        since = self._since_restart(now)
        return math.inf if since is None or since >= RECOVERY_SECONDS else RECOVERY_SECONDS - since

    @property
    def failures(self) -> int:
        """How many times this pod's driver has ended with an error so far."""
        ended_now = self.termination is not None and self.termination.current
        failed_now = ended_now and self.termination is not None and self.termination.exit_code != 0
        failed_pod = self.phase == "Failed" and not ended_now
        return self.restart_count + (1 if failed_now or failed_pod else 0)

    @classmethod
    def from_pod(cls, pod: dict[str, Any]) -> PodObservation:
        """Read a core/v1 Pod."""
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        annotations = meta.get("annotations") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        containers = [c for c in status.get("containerStatuses") or [] if c.get("name") == "driver"]
        restarts, termination, waiting, started = 0, None, None, False
        if containers:
            container = containers[0]
            restarts = int(container.get("restartCount", 0))
            state = container.get("state") or {}
            started = bool(state.get("running") or state.get("terminated") or restarts)
            if state.get("waiting"):
                wait = state["waiting"]
                waiting = (str(wait.get("reason") or ""), str(wait.get("message") or ""))
            now = (container.get("state") or {}).get("terminated")
            before = (container.get("lastState") or {}).get("terminated")
            ended = now or before
            if ended:
                termination = Termination(
                    exit_code=int(ended.get("exitCode", 1)),
                    message=str(ended.get("message") or ended.get("reason") or ""),
                    current=now is not None,
                    finished_at=ended.get("finishedAt"),
                )
        termination = lost_with_node(pod) or termination
        generation = annotations.get(GENERATION_ANNOTATION)
        scheduled: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
        )
        unschedulable = None
        if scheduled.get("status") == "False":
            unschedulable = str(scheduled.get("message") or scheduled.get("reason") or "")
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            phase=status.get("phase", "Pending"),
            ready=conditions.get("Ready") == "True",
            spec_hash=annotations.get(SPEC_HASH_ANNOTATION),
            generation=int(generation) if generation is not None else None,
            deleting=meta.get("deletionTimestamp") is not None,
            restart_count=restarts,
            termination=termination,
            waiting=waiting,
            unschedulable=unschedulable,
            started=started,
        )


@dataclass(frozen=True)
class DriverState:
    """The driver StatefulSet (None fields when it does not exist) and its pods."""

    exists: bool = False
    replicas: int = 0
    template_hash: str | None = None
    pods: tuple[PodObservation, ...] = field(default_factory=tuple)
    #: Pods already gone that a watch event showed ending (counted as restarts only).
    departed: tuple[PodObservation, ...] = field(default_factory=tuple)

    @classmethod
    def from_objects(
        cls,
        statefulset: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        departed: list[dict[str, Any]] = [],  # noqa: B006 (never mutated)
    ) -> DriverState:
        """Read the StatefulSet, the pods it selects and pods seen ending that are gone.

        The StatefulSet controller replaces a Failed pod at once, often before the
        operator lists the pods; the pod from the watch event keeps that failure.
        """
        observed = tuple(PodObservation.from_pod(p) for p in pods)
        uids = {p.uid for p in observed}
        gone = tuple(
            pod
            for pod in (PodObservation.from_pod(p) for p in departed)
            if pod.uid not in uids and pod.failures
        )
        if statefulset is None:
            return cls(pods=observed, departed=gone)
        template = statefulset.get("spec", {}).get("template", {})
        annotations = template.get("metadata", {}).get("annotations") or {}
        return cls(
            exists=True,
            replicas=int(statefulset.get("spec", {}).get("replicas", 1)),
            template_hash=annotations.get(SPEC_HASH_ANNOTATION),
            pods=observed,
            departed=gone,
        )

    def ready_with(self, spec_hash: str | None) -> bool:
        """Whether a pod of ``spec_hash`` is Ready."""
        return any(p.ready and not p.deleting and p.spec_hash == spec_hash for p in self.pods)

    def recovers_in(self, now: datetime.datetime) -> float:
        """Seconds until a pod that restarted a moment ago may count as steady (else inf)."""
        return min((p.recovers_in(now) for p in self.pods if not p.deleting), default=math.inf)

    def steady_with(self, spec_hash: str | None, now: datetime.datetime) -> bool:
        """Whether a pod of ``spec_hash`` is Ready and has not just restarted (a crash loop)."""
        return any(
            p.ready
            and not p.deleting
            and p.spec_hash == spec_hash
            and not p.restarted_within(now, RECOVERY_SECONDS)
            for p in self.pods
        )


#: A driver that restarted less than this long ago is not yet running again: between two
#: crashes of a crash loop the container is Ready for a moment.
RECOVERY_SECONDS = 60.0


class ClaimState(StrEnum):
    """The checkpoint claim as the operator last saw it."""

    #: The pipeline keeps its checkpoint at a URI, or the claim was not looked at.
    UNKNOWN = "unknown"
    BOUND = "Bound"
    PENDING = "Pending"
    #: Deleted, kept only until no pod uses it (kubernetes.io/pvc-protection).
    DELETING = "Deleting"
    MISSING = "Missing"
    LOST = "Lost"

    @classmethod
    def of(cls, claim: dict[str, Any] | None) -> ClaimState:
        """Read a core/v1 PersistentVolumeClaim (None: it does not exist)."""
        if claim is None:
            return cls.MISSING
        if claim.get("metadata", {}).get("deletionTimestamp"):
            return cls.DELETING
        phase = claim.get("status", {}).get("phase", "Pending")
        return {"Bound": cls.BOUND, "Lost": cls.LOST}.get(phase, cls.PENDING)

    @property
    def gone(self) -> bool:
        """Whether the checkpoint it held is gone or going (a new one must be made)."""
        return self in (ClaimState.MISSING, ClaimState.DELETING)


@dataclass(frozen=True)
class WarningEvent:
    """A Warning event about one of the driver's objects (the pod, StatefulSet or claim)."""

    kind: str
    name: str
    uid: str
    reason: str
    message: str
    #: The last time it happened (RFC 3339 seconds; "" when the event has none).
    at: str = ""

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> WarningEvent:
        """Read a core/v1 Event."""
        involved = event.get("involvedObject") or {}
        at = (
            event.get("lastTimestamp")
            or (event.get("series") or {}).get("lastObservedTime")
            or event.get("eventTime")
            or event.get("metadata", {}).get("creationTimestamp")
            or ""
        )
        return cls(
            kind=str(involved.get("kind", "")),
            name=str(involved.get("name", "")),
            uid=str(involved.get("uid", "")),
            reason=str(event.get("reason", "")),
            message=str(event.get("message", "")).strip(),
            at=str(at)[:19],
        )
