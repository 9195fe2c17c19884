"""The health monitor: one daemon per pipeline that checks its lag and keeps ``G`` alive.

Every ``spec.health.checkInterval`` the daemon reads the progress group
against the source's end offsets (``health.progress``), folds the reading into
its history and asks ``health.stall`` for the verdict.  It writes
``status.lag`` and ``status.progress`` (``health.report``; its only status
fields, see ``kube.status``), and reports a stalled driver to the lifecycle
(``controller.stall_reports``), whose next step restarts it: the daemon
observes, the lifecycle alone acts on the driver.

While no driver container runs (suspended, crash loop, scaled to zero, a
refused spec), the daemon also keeps its progress group from expiring
(``health.keep_alive``); for a refused spec, the group of the spec that last ran.

A stall is never reported while the pipeline is suspended or while its driver
is not Ready (a starting driver commits nothing yet); the lifecycle restarts
nothing while an upgrade is in flight (``reconcile.step_plan.restart_for``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eop_operator import metrics
from eop_operator.api.load import InvalidPipeline, load_last_stable, load_stored
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import Identity, IdentityChanged, resolve_identity
from eop_operator.controller.context import Context
from eop_operator.health.keep_alive import RefreshSchedule, driver_runs, keep_progress_alive
from eop_operator.health.progress import ProgressUnavailable, kafka_access, read_progress
from eop_operator.health.report import (
    health_patch,
    held_partitions,
    lost_progress,
    problem_patch,
    ready_since,
)
from eop_operator.health.stall import Health, ProgressHistory, assess, remember
from eop_operator.kube.client import KubeError
from eop_operator.kube.observed import WatchIndex
from eop_operator.reconcile.step_plan import Stall
from eop_operator.render.naming import driver_pod_name

#: How long to wait before looking again at a pipeline whose spec is invalid.
INVALID_RETRY_S = 60.0
#: Kafka checks (each a few blocking client calls in a worker thread, up to
#: ``health.progress.DEFAULT_TIMEOUT_S`` each against a broker that does not answer) in
#: flight at once: the others wait their turn, and threads stay free for the rest.
KAFKA_CHECKS = 4

log = logging.getLogger(__name__)


@dataclass
class HealthMemory:
    """What one pipeline's daemon remembers between checks."""

    history: ProgressHistory | None = None
    #: The progress group's refreshes while no driver runs (see health.keep_alive).
    refresh: RefreshSchedule = field(default_factory=RefreshSchedule)


def first_check_delay(uid: str, interval: float) -> float:
    """When a pipeline's first check runs, spread over one interval by its uid.

    An operator start begins the daemons of all pipelines at once; their checks
    would otherwise all hit Kafka (and the thread pool) together, every interval.
    """
    return int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % 1000 / 1000 * interval


def _driver_pod(pods: WatchIndex, pipeline: ExactlyOncePipeline) -> dict[str, Any] | None:
    """The driver pod as the watch last saw it."""
    meta, pod_name = pipeline.metadata, driver_pod_name(pipeline)
    found = pods.get((meta.namespace, meta.name), ())
    return next(
        (p for p in found if p["kind"] == "Pod" and p["metadata"]["name"] == pod_name), None
    )


@dataclass(frozen=True)
class Kept:
    """The pipeline whose progress the daemon keeps, as whom it runs, and whether its spec
    is refused (see :func:`kept_pipeline`)."""

    pipeline: ExactlyOncePipeline
    identity: Identity
    refused: bool


def kept_pipeline(body: Mapping[str, Any]) -> Kept | None:
    """The pipeline whose progress the daemon keeps, read and resolved once per check.

    A refused spec (phase ``Invalid``: it does not load, or asks for another identity)
    starts no driver, but the progress of the spec that last ran must outlive the user's
    fix however long it takes (invariant 6): that spec (``status.lastStableSpec``) is
    kept alive, and nothing else is checked.  None: refused, and nothing ever ran.
    """
    try:
        pipeline = load_stored(body).value
        return Kept(pipeline, resolve_identity(pipeline), refused=False)
    except (InvalidPipeline, IdentityChanged):
        pass
    try:
        stable = load_last_stable(body)
        return Kept(stable, resolve_identity(stable), refused=True)
    except (InvalidPipeline, IdentityChanged):
        return None


class HealthMonitor:
    """Runs the checks of every pipeline through one context, a few at a time."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self._turns: asyncio.Semaphore | None = None

    def _kafka_turn(self) -> asyncio.Semaphore:
        if self._turns is None:  # made in the operator's event loop, at the first check
            self._turns = asyncio.Semaphore(KAFKA_CHECKS)
        return self._turns

    async def run(self, body: Mapping[str, Any], stopped: Any, pods: WatchIndex) -> None:
        """Check one pipeline every ``spec.health.checkInterval`` until ``stopped``.

        ``body`` is kopf's live view of the pipeline (spec edits apply at the next
        check); ``pods``: the watches' index of its children, the driver pod among them.
        """
        memory = HealthMemory()
        meta = body["metadata"]
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        try:
            interval = load_stored(body).value.spec.health.check_interval.seconds
        except InvalidPipeline:
            interval = INVALID_RETRY_S
        await stopped.wait(first_check_delay(meta.get("uid") or name, interval))
        try:
            while not stopped:
                metrics.set_phase(namespace, name, (body.get("status") or {}).get("phase"))
                # The pipeline is read only once it is this one's turn: waiting ones hold nothing.
                async with self._kafka_turn():
                    interval = await self.check(body, memory, pods)
                await stopped.wait(interval)
        finally:
            metrics.forget(namespace, name)  # deleted (or the operator stops)

    async def check(self, body: Mapping[str, Any], memory: HealthMemory, pods: WatchIndex) -> float:
        """Check the lag and keep ``G`` alive as needed; return the seconds until the next."""
        kept = kept_pipeline(body)
        if kept is None:
            return INVALID_RETRY_S
        pipeline = kept.pipeline
        interval = pipeline.spec.health.check_interval.seconds
        deleting = bool(body["metadata"].get("deletionTimestamp"))
        namespace, name = pipeline.metadata.namespace, pipeline.metadata.name
        failed: str | None = None  # the kind of the first failure of this check
        problem = None  # what status.progress.message says after this check
        if not pipeline.spec.suspend and not deleting and not kept.refused:
            try:
                outcome = await self.check_lag(body, kept, memory, _driver_pod(pods, pipeline))
                if isinstance(outcome, str):
                    problem, failed = outcome, metrics.KAFKA
                else:
                    metrics.record_check_success(namespace, name, time.time())
            except (KubeError, OSError) as exc:
                log.warning("health check of %s failed: %s", pipeline.pipeline_id, exc)
                failed = metrics.API
        else:
            # A resumed pipeline gets a fresh window.
            memory.history = None
            self.context.stalls.forget((namespace, name))
        if not deleting:
            try:
                pod = _driver_pod(pods, pipeline)  # as the watch sees it now, after the check
                refresh = await self.keep_alive_without_driver(kept, memory, pod)
                if refresh:
                    failed = failed or metrics.KAFKA
                    problem = (
                        problem or f"no driver runs: {refresh}"
                    )  # a failed check says it first
            except (KubeError, OSError) as exc:
                log.warning("keeping %s's progress failed: %s", pipeline.pipeline_id, exc)
                failed = failed or metrics.API
            interval = min(interval, memory.refresh.interval_s or interval)
        if problem is not None:
            # One write for both: an unreachable broker fails the check and the refresh alike.
            try:
                await self._write(body, problem_patch(problem, checked_at=time.time()))
            except (KubeError, OSError) as exc:
                log.warning("reporting %s's progress failed: %s", pipeline.pipeline_id, exc)
        if failed is not None:
            metrics.record_check_failure(namespace, name, failed)
        return interval

    async def _write(self, body: Mapping[str, Any], patch: Any) -> None:
        try:
            await self.context.status.write(body, patch)
        except KubeError as exc:
            if exc.status != 404:  # deleted meanwhile
                raise

    async def check_lag(
        self,
        body: Mapping[str, Any],
        kept: Kept,
        memory: HealthMemory,
        pod: dict[str, Any] | None,
    ) -> Health | str:
        """Read ``G``'s offsets, report them and a stalled driver; if unreadable, why.

        ``pod`` is the driver pod as the watch last saw it (None: there is none).  The
        reason offsets are unreadable is for ``status.progress.message``.
        """
        client, pipeline, group = self.context.client, kept.pipeline, kept.identity.progress_group
        meta = pipeline.metadata
        try:
            reading = await read_progress(client, pipeline, group)
        except ProgressUnavailable as exc:
            return str(exc)
        memory.history = remember(memory.history, reading)
        pod_name = driver_pod_name(pipeline)
        key = (meta.namespace, meta.name)
        since, restarted_at = ready_since(pod), self.context.stalls.restarted_at(key)
        if since is not None and restarted_at is not None:
            since = max(since, restarted_at)
        health = assess(
            memory.history,
            reading,
            stall_timeout=pipeline.spec.health.stall_timeout.seconds,
            ready_since=since,
        )
        before = pipeline.status.progress.held_partitions if pipeline.status.progress else {}
        held = held_partitions(before, reading)
        message = lost_progress(held or before, reading, group)
        await self._write(
            body, health_patch(health, checked_at=reading.at, held=held, message=message)
        )
        metrics.set_lag(
            meta.namespace,
            meta.name,
            health.lag,
            {(p.topic, p.partition): p.lag for p in reading.partitions},
        )
        if health.stalled:
            stall = Stall(idle_seconds=health.idle_seconds, lag=health.lag, pod=pod_name)
            self.context.stalls.report(key, stall)
        return health

    async def keep_alive_without_driver(
        self, kept: Kept, memory: HealthMemory, pod: dict[str, Any] | None
    ) -> str | None:
        """Refresh a pipeline's progress group when due, if no container of its driver runs.

        Suspended, crash-looping, scaled to zero: see ``health.keep_alive.driver_runs``
        (``pod``: the driver pod as the watch last saw it).  Returns why a refresh failed
        (for ``status.progress.message``; tried again at the next check), else None.
        """
        if driver_runs(pod):
            return None  # its runner keeps G alive (a stopping one may still commit)
        try:
            access = await kafka_access(self.context.client, kept.pipeline)
            await keep_progress_alive(access, kept.pipeline, kept.identity, memory.refresh)
        except ProgressUnavailable as exc:
            return str(exc)
        return None
