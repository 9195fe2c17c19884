"""Leader election with a coordination.k8s.io Lease, as client-go's leaderelection does it.

Every operator replica runs this before kopf: one holds the Lease and runs
the handlers, the others wait.  Rules (docs/high-availability.md):

* a Lease is taken over only when its record (holder, renew time, resource
  version) has not changed for ``leaseDurationSeconds`` *as measured by the
  candidate's own monotonic clock*, so clock skew between nodes does not
  matter;
* every write carries the ``resourceVersion`` it read, so two candidates
  never both win: the API server answers 409 to the slower one;
* the leader renews every ``retry_period`` and gives up once it has not
  renewed for ``renew_deadline`` (shorter than the lease duration), before any
  candidate may take over: the caller then stops acting at once;
* a renewal counts from the moment it was *sent* (its write may land any time
  after), and each attempt is cut off when the renew deadline passes: a slow
  API server can make a renewal late, never stretch leadership past the
  deadline (an HTTP timeout longer than the lease would let two leaders act).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from eop_operator.kube.client import KubeClient, KubeError

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"

log = logging.getLogger(__name__)


class LeaseAction(StrEnum):
    """What a candidate does after reading the Lease."""

    ACQUIRE = "acquire"  #: nobody holds it (or the holder stopped renewing): take it
    RENEW = "renew"  #: we hold it: renew it
    WAIT = "wait"  #: someone else holds it and renews it


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease that election reads."""

    holder: str | None
    duration: int
    renew_time: str | None
    transitions: int
    resource_version: str | None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LeaseRecord:
        """Read a Lease object."""
        spec = obj.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or None,
            duration=int(spec.get("leaseDurationSeconds") or 0),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=obj.get("metadata", {}).get("resourceVersion"),
        )

    @property
    def key(self) -> tuple[str | None, str | None, str | None]:
        """What must change for the holder to count as alive."""
        return (self.holder, self.renew_time, self.resource_version)


def decide(record: LeaseRecord | None, identity: str, *, unchanged_for: float) -> LeaseAction:
    """The candidate's action, given the Lease and how long its record has stayed unchanged."""
    if record is None or record.holder is None:
        return LeaseAction.ACQUIRE
    if record.holder == identity:
        return LeaseAction.RENEW
    if unchanged_for >= record.duration:
        return LeaseAction.ACQUIRE
    return LeaseAction.WAIT


def _micro_time() -> str:
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquire, hold and release one Lease for ``identity``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        """Durations in seconds; ``renew_deadline`` must be shorter than ``lease_duration``."""
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._seen: tuple[str | None, str | None, str | None] | None = None
        self._seen_at = 0.0
        self._holding = False
        #: Monotonic time at which the last successful acquire or renewal was sent.
        self._renewed_at = 0.0

    @property
    def renewed_at(self) -> float:
        """When the last successful acquire or renewal was sent (``time.monotonic()``)."""
        return self._renewed_at

    async def _attempt(self, timeout: float) -> bool | None:
        """One :meth:`try_acquire_or_renew` cut off after ``timeout`` seconds (then None).

        On success, the time the attempt started counts as the renewal time: its write
        landed no earlier, so a standby's wait for a whole lease duration starts after it.
        """
        started = time.monotonic()
        try:
            held = await asyncio.wait_for(self.try_acquire_or_renew(), max(timeout, 0.0))
        except TimeoutError:
            log.warning("leader election: no answer from the API server within %.1fs", timeout)
            return None
        if held:
            self._renewed_at = started
        return held

    async def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, then take or renew it if the rules allow; True if held."""
        obj = await self.client.get(API_VERSION, KIND, self.namespace, self.name)
        record = LeaseRecord.from_object(obj) if obj is not None else None
        now = time.monotonic()
        if record is None or record.key != self._seen:
            self._seen, self._seen_at = (record.key if record else None), now
        action = decide(record, self.identity, unchanged_for=now - self._seen_at)
        if action is LeaseAction.WAIT:
            self._holding = False
            return False
        stamp = _micro_time()
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "renewTime": stamp,
        }
        if action is LeaseAction.ACQUIRE:
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = (record.transitions + 1) if record else 0
        try:
            if obj is None:
                await self.client.create(
                    {
                        "apiVersion": API_VERSION,
                        "kind": KIND,
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": spec,
                    }
                )
            else:
                # The read resourceVersion is a precondition: a concurrent writer gets 409.
                assert record is not None
                await self.client.patch(
                    API_VERSION,
                    KIND,
                    self.namespace,
                    self.name,
                    {"metadata": {"resourceVersion": record.resource_version}, "spec": spec},
                )
        except KubeError as exc:
            if exc.status != 409:
                raise
            self._holding = False
            return False
        if action is LeaseAction.ACQUIRE:
            log.info("became leader: lease %s/%s as %s", self.namespace, self.name, self.identity)
        self._holding = True
        return True

    async def acquire(self) -> None:
        """Wait until this candidate holds the Lease (standby until then)."""
        announced = False
        while True:
            try:
                if await self._attempt(self.renew_deadline):
                    return
            except (KubeError, OSError) as exc:
                log.warning("leader election: %s", exc)
            if not announced:
                log.info(
                    "standby: lease %s/%s is held by another replica", self.namespace, self.name
                )
                announced = True
            await asyncio.sleep(self.retry_period)

    async def hold(self) -> None:
        """Renew the Lease until a renewal has not succeeded for ``renew_deadline``; then return.

        Returning means leadership is lost: the caller must stop acting.  Each renewal is
        cut off at the deadline, so this returns at most ``renew_deadline`` after the last
        successful renewal was sent, however slow the API server answers.
        """
        while True:
            deadline = self._renewed_at + self.renew_deadline
            await asyncio.sleep(max(0.0, min(self.retry_period, deadline - time.monotonic())))
            held: bool | None = None
            try:
                held = await self._attempt(deadline - time.monotonic())
            except (KubeError, OSError) as exc:
                log.warning("leader election: cannot renew: %s", exc)
            if held:
                continue
            if held is False:
                log.error("lost the lease %s/%s to another replica", self.namespace, self.name)
                return
            if time.monotonic() >= deadline:
                log.error("could not renew the lease for %.0fs", self.renew_deadline)
                return

    async def release(self) -> None:
        """Give the Lease up (on a clean shutdown), so a standby takes over at once."""
        if not self._holding:
            return
        self._holding = False
        obj = await self.client.get(API_VERSION, KIND, self.namespace, self.name)
        if obj is None or LeaseRecord.from_object(obj).holder != self.identity:
            return
        try:
            await self.client.patch(
                API_VERSION,
                KIND,
                self.namespace,
                self.name,
                {
                    "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    "spec": {"holderIdentity": None, "leaseDurationSeconds": 1},
                },
            )
            log.info("released the lease %s/%s", self.namespace, self.name)
        except KubeError as exc:
            log.warning("could not release the lease: %s", exc)
