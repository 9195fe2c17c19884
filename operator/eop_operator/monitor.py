"""kopf wiring of health from progress, and of the pipeline metrics.

One daemon per pipeline checks, every ``spec.health.checkInterval``, the
progress group against the source's end offsets (``health.progress``), folds
the observation into its history and asks ``health.stall`` for the verdict.
It writes ``status.lag`` and ``status.progress``, and restarts a stalled
driver by deleting its pod (the StatefulSet recreates it) with a
``RestartStalled`` Warning event.

While no driver container runs (suspended, crash loop, scaled to zero), the
daemon also keeps its progress group from expiring (``health.keep_alive``).

A pipeline is never restarted while it is suspended, while its driver is not
Ready (a starting driver commits nothing yet) or while an upgrade is in
flight (``status.upgrade``: the lifecycle handlers own the driver then).

Registered by importing this module (``eop operator`` does).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from eop_operator import API_VERSION, GROUP, KIND, PLURAL, VERSION, metrics
from eop_operator.api.load import InvalidPipeline, load_pipeline
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import IdentityChanged, resolve_identity
from eop_operator.health.keep_alive import RefreshSchedule, driver_runs, keep_progress_alive
from eop_operator.health.progress import ProgressUnavailable, kafka_access, observe_progress
from eop_operator.health.stall import Health, Observation, ProgressHistory, assess, observe
from eop_operator.kube.client import KubeClient, KubeError
from eop_operator.kube.events import post_event
from eop_operator.kube.observed import WatchIndex
from eop_operator.render.naming import driver_pod_name
from eop_spark.spec import duration_ms

#: How long to wait before looking again at a pipeline whose spec is invalid.
INVALID_RETRY_S = 60.0
#: The restart reason recorded in events and metrics.
STALLED = "Stalled"

log = logging.getLogger(__name__)


def _stamp(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def ready_since(pod: dict[str, Any] | None) -> float | None:
    """When the driver pod became Ready (epoch seconds); None if it is not Ready now."""
    if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            return _epoch(stamp) if stamp else 0.0
    return None


def progress_status(health: Health, *, checked_at: float) -> dict[str, Any]:
    """The ``status`` fields a check writes: lag and progress (merge-patch form)."""
    return {
        "lag": health.lag,
        "progress": {
            "lag": health.lag,
            "worstPartitions": [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "committed": p.committed,
                    "end": p.end,
                    "lag": p.lag,
                }
                for p in health.worst
            ],
            "lastCommitTime": _stamp(health.last_advance) if health.last_advance else None,
            "inputRate": None if health.input_rate is None else round(health.input_rate, 3),
            "checkedAt": _stamp(checked_at),
            "message": None,
        },
    }


def held_partitions(
    previous: Mapping[str, list[int]], observation: Observation
) -> dict[str, list[int]] | None:
    """``previous`` plus the partitions ``G`` holds now, per topic; None when nothing is new."""
    held = {topic: set(partitions) for topic, partitions in previous.items()}
    for topic, partition in observation.committed():
        held.setdefault(topic, set()).add(partition)
    merged = {topic: sorted(partitions) for topic, partitions in sorted(held.items())}
    return None if merged == {t: sorted(p) for t, p in previous.items()} else merged


def lost_progress(
    held: Mapping[str, list[int]], observation: Observation, group: str
) -> str | None:
    """A status message when ``G`` lacks a partition it held before (expired or deleted)."""
    lost = [
        f"{p.topic}-{p.partition}"
        for p in observation.partitions
        if p.committed is None and p.partition in held.get(p.topic, ())
    ]
    if not lost:
        return None
    return (
        f"progress group {group} has no committed offset for {', '.join(lost)}, which it held "
        "before (expired after the broker's offsets.retention.minutes, or deleted): a new "
        "checkpoint generation would stop; restore the offsets with kafka-consumer-groups "
        f"--reset-offsets --group {group}"
    )


@dataclass
class ProgressWatch:
    """What one pipeline's daemon remembers between checks."""

    history: ProgressHistory | None = None
    #: When the daemon last restarted the driver (epoch seconds).
    restarted_at: float | None = None
    #: The progress group's refreshes while no driver runs (see health.keep_alive).
    refresh: RefreshSchedule = field(default_factory=RefreshSchedule)


async def _patch_status(client: KubeClient, pipeline: ExactlyOncePipeline, status: Any) -> None:
    meta = pipeline.metadata
    try:
        await client.patch(
            API_VERSION, KIND, meta.namespace, meta.name, {"status": status}, subresource="status"
        )
    except KubeError as exc:
        if exc.status != 404:  # deleted meanwhile
            raise


async def check_progress(
    client: KubeClient,
    body: kopf.Body,
    pipeline: ExactlyOncePipeline,
    watch: ProgressWatch,
    pod: dict[str, Any] | None,
) -> Health | str:
    """One check: read offsets, report them, restart a stalled driver; if unreadable, why.

    ``pod`` is the driver pod as the watch last saw it (None: there is none).  The
    reason offsets are unreadable is for ``status.progress.message`` (see ``_check_once``).
    """
    meta = pipeline.metadata
    try:
        group = resolve_identity(pipeline).progress_group
        observation = await observe_progress(client, pipeline, group)
    except (ProgressUnavailable, IdentityChanged) as exc:
        return str(exc)
    watch.history = observe(watch.history, observation)
    pod_name = driver_pod_name(pipeline)
    since = ready_since(pod)
    if since is not None and watch.restarted_at is not None:
        since = max(since, watch.restarted_at)
    health = assess(
        watch.history,
        observation,
        stall_timeout=duration_ms(pipeline.spec.health.stall_timeout) / 1000,
        ready_since=since,
    )
    status = progress_status(health, checked_at=observation.at)
    before = pipeline.status.progress.held_partitions if pipeline.status.progress else {}
    held = held_partitions(before, observation)
    if held is not None:
        status["progress"]["heldPartitions"] = held
    status["progress"]["message"] = lost_progress(held or before, observation, group)
    await _patch_status(client, pipeline, status)
    metrics.set_lag(
        meta.namespace,
        meta.name,
        health.lag,
        {(p.topic, p.partition): p.lag for p in observation.partitions},
    )
    if health.stalled and not body.get("status", {}).get("upgrade"):
        await post_event(
            client,
            body,
            type="Warning",
            reason="RestartStalled",
            message=f"the progress group has not advanced for {health.idle_seconds:.0f}s "
            f"with {health.lag} records waiting; restarting driver pod {pod_name}",
        )
        await client.delete("v1", "Pod", meta.namespace, pod_name)
        metrics.record_restart(meta.namespace, meta.name, STALLED)
        watch.restarted_at = time.time()
    return health


#: Kafka checks (each a few blocking client calls in a worker thread, up to
#: ``health.progress.DEFAULT_TIMEOUT_S`` each against a broker that does not answer) in
#: flight at once: the others wait their turn, and threads stay free for the rest.
KAFKA_CHECKS = 4
_KAFKA_TURNS: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _kafka_turn() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _KAFKA_TURNS:
        _KAFKA_TURNS.clear()  # one event loop per operator run
        _KAFKA_TURNS[loop] = asyncio.Semaphore(KAFKA_CHECKS)
    return _KAFKA_TURNS[loop]


def first_check_delay(uid: str, interval: float) -> float:
    """When a pipeline's first check runs, spread over one interval by its uid.

    An operator start begins the daemons of all pipelines at once; their checks
    would otherwise all hit Kafka (and the thread pool) together, every interval.
    """
    return int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % 1000 / 1000 * interval


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def watch_progress(
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    **kwargs: Any,
) -> None:
    """Check one pipeline's progress every ``spec.health.checkInterval`` until it is deleted."""
    pods: WatchIndex = kwargs["children"]  # handlers.children: the driver pods among them
    watch = ProgressWatch()
    namespace, name = body.metadata.namespace or "", body.metadata.name or ""
    try:
        interval = duration_ms(load_pipeline(body).spec.health.check_interval) / 1000
    except InvalidPipeline:
        interval = INVALID_RETRY_S
    await stopped.wait(first_check_delay(body.metadata.uid or name, interval))
    try:
        while not stopped:
            await _watch_once(body, memo, stopped, watch, namespace, name, pods)
    finally:
        metrics.forget(namespace, name)  # deleted (or the operator stops)


def _driver_pod(pods: WatchIndex, pipeline: ExactlyOncePipeline) -> dict[str, Any] | None:
    """The driver pod as the watch last saw it."""
    meta, pod_name = pipeline.metadata, driver_pod_name(pipeline)
    found = pods.get((meta.namespace, meta.name), ())
    return next(
        (p for p in found if p["kind"] == "Pod" and p["metadata"]["name"] == pod_name), None
    )


async def _watch_once(
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    watch: ProgressWatch,
    namespace: str,
    name: str,
    pods: WatchIndex,
) -> None:
    """One round of the daemon: count the phase, check progress, sleep an interval."""
    metrics.set_phase(namespace, name, body.get("status", {}).get("phase"))
    # The pipeline is read only once it is this daemon's turn: the waiting ones hold nothing.
    async with _kafka_turn():
        interval = await _check_once(body, memo, watch, pods)
    await stopped.wait(interval)


async def _check_once(
    body: kopf.Body, memo: kopf.Memo, watch: ProgressWatch, pods: WatchIndex
) -> float:
    """Check progress and keep it alive as needed; return the seconds until the next round."""
    try:
        pipeline = load_pipeline(body)  # the live body: spec edits apply at the next check
    except InvalidPipeline:
        return INVALID_RETRY_S
    interval = duration_ms(pipeline.spec.health.check_interval) / 1000
    deleting = bool(body.metadata.get("deletionTimestamp"))
    problem = None  # what status.progress.message says after this round
    if not pipeline.spec.suspend and not deleting:
        try:
            outcome = await check_progress(
                memo.client, body, pipeline, watch, _driver_pod(pods, pipeline)
            )
            problem = outcome if isinstance(outcome, str) else None
        except (KubeError, OSError) as exc:
            log.warning("health check of %s failed: %s", pipeline.pipeline_id, exc)
    else:
        # A resumed pipeline gets a fresh window.
        watch.history, watch.restarted_at = None, None
    if not deleting:
        try:
            failed = await keep_alive_without_driver(
                memo.client, pipeline, watch, _driver_pod(pods, pipeline)
            )
            if failed and problem is None:  # a failed check says it first
                problem = f"no driver runs: {failed}"
        except (KubeError, OSError) as exc:
            log.warning("keeping %s's progress failed: %s", pipeline.pipeline_id, exc)
        interval = min(interval, watch.refresh.interval_s or interval)
    if problem is not None:
        # One write for both: an unreachable broker fails the check and the refresh alike.
        progress = {"message": problem, "checkedAt": _stamp(time.time())}
        try:
            await _patch_status(memo.client, pipeline, {"progress": progress})
        except (KubeError, OSError) as exc:
            log.warning("reporting %s's progress failed: %s", pipeline.pipeline_id, exc)
    return interval


async def keep_alive_without_driver(
    client: KubeClient,
    pipeline: ExactlyOncePipeline,
    watch: ProgressWatch,
    pod: dict[str, Any] | None,
) -> str | None:
    """Refresh a pipeline's progress group when due, if no container of its driver runs.

    Suspended, crash-looping, scaled to zero: see ``health.keep_alive.driver_runs``
    (``pod``: the driver pod as the watch last saw it).  Returns why a refresh failed
    (for ``status.progress.message``; tried again at the next check), else None.
    """
    if driver_runs(pod):
        return None  # its runner keeps G alive (a stopping one may still commit)
    try:
        access = await kafka_access(client, pipeline)
        await keep_progress_alive(access, pipeline, watch.refresh)
    except (ProgressUnavailable, IdentityChanged) as exc:
        return str(exc)
    return None
