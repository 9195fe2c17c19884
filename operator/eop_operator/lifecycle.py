"""The lifecycle loop: observe a pipeline's driver, decide (pure), write status, act.

:func:`drive` is what every trigger calls (a spec change, a driver pod or
StatefulSet event, the periodic timer).  The decisions live in
``reconcile.upgrade`` and ``reconcile.failover``; this module only reads the
API server, writes the decision's status patch *before* acting on it (the
write-ahead log of an upgrade in flight), posts the events and applies.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import secrets
from collections.abc import Callable, Sequence
from typing import Any

from eop_operator import API_VERSION, KIND, metrics
from eop_operator.api.load import InvalidPipeline, load_pipeline
from eop_operator.api.models import ExactlyOncePipeline, Phase, UpgradeStep
from eop_operator.api.resolve import IdentityChanged, resolve_identity
from eop_operator.kube.client import KubeClient, KubeError
from eop_operator.kube.events import post_event
from eop_operator.reconcile.failover import parse_stamp
from eop_operator.reconcile.observe import ClaimState, DriverState, WarningEvent
from eop_operator.reconcile.status import (
    Cause,
    DriverObservation,
    diagnose,
    lifecycle_verdict,
    pod_cause,
    ready_column,
    scale_status,
    status_patch,
)
from eop_operator.reconcile.upgrade import (
    POLL_SECONDS,
    RESTART_NONCE,
    SPEC_CHANGED,
    Action,
    Decision,
    Event,
    Situation,
    decide,
    spec_fingerprint,
    spec_to_run,
)
from eop_operator.render import (
    MissingImage,
    RenderedPipeline,
    checkpoint_root,
    rpc_secret,
)
from eop_operator.render.executors import RPC_KEY_BYTES
from eop_operator.render.naming import (
    RESTART_NONCE_ANNOTATION,
    checkpoint_claim_name,
    driver_name,
    selector_labels,
)

log = logging.getLogger(__name__)

#: Renders a pipeline at (checkpoint generation, resetProgress); see ``render_pipeline``.
Renderer = Callable[[ExactlyOncePipeline, int, bool], RenderedPipeline]

#: One lifecycle step at a time per pipeline: the spec, pod, StatefulSet and timer
#: handlers all call :func:`drive`, which must not interleave for one pipeline.
_LOCKS: dict[tuple[str, str], asyncio.Lock] = {}
#: Decisions per :func:`drive` call before it yields to the next trigger.
MAX_STEPS = 6
#: Every child is applied again (what was deleted or changed comes back) at most this
#: often per pipeline; a running pipeline is looked at every minute by the timer.
HEAL_SECONDS = 10.0
#: When each pipeline's children were last applied (event-loop time).
_HEALED: dict[tuple[str, str], float] = {}
#: What the API server refused at the last apply of each pipeline's children.
_REFUSED: dict[tuple[str, str], tuple[str, ...]] = {}
#: The namespace's Warning events are listed at most this often for a pipeline whose
#: driver does not run (a burst of new pipelines would list them at every step).
WARNINGS_SECONDS = 10.0
#: The last list of Warning events per pipeline (event-loop time, the events).
_WARNINGS: dict[tuple[str, str], tuple[float, list[WarningEvent]]] = {}


class _Shutdown:
    """Set once the operator stops: :func:`drive` takes no further step."""

    stopping = False


async def quiesce(timeout: float) -> bool:
    """Take no new lifecycle step; wait up to ``timeout`` for the steps under way.

    The operator calls this before it closes its API client: kopf abandons a
    timer that is mid-step when the operator exits, and that step would
    otherwise fail on the closed client.  Returns False if a step outlasted
    ``timeout``.
    """
    _Shutdown.stopping = True

    async def settle() -> None:
        for lock in list(_LOCKS.values()):
            async with lock:
                pass

    try:
        await asyncio.wait_for(settle(), timeout)
    except TimeoutError:
        return False
    return True


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def drive(
    client: KubeClient,
    namespace: str,
    name: str,
    render: Renderer,
    *,
    invalid: tuple[type[Exception], ...] = (),
    pod: dict[str, Any] | None = None,
) -> float | None:
    """Take the pipeline's lifecycle steps until the next one is to wait.

    Returns when to look again (inf: once something changes; the timer looks
    anyway).  Invalid specs (and the ``invalid`` extra errors of ``render``) are
    left to the spec handler, which reports them.  ``pod`` is a driver pod from
    a watch event: it may be gone already, and its termination still counts.
    """
    lock = _LOCKS.setdefault((namespace, name), asyncio.Lock())
    async with lock:
        for _ in range(MAX_STEPS):
            if _Shutdown.stopping:
                return None
            body = await client.get(API_VERSION, KIND, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                for memory in (_LOCKS, _HEALED, _REFUSED, _WARNINGS):
                    memory.pop((namespace, name), None)
                return None
            try:
                requeue = await _step(client, body, render, [pod] if pod else [])
            except (InvalidPipeline, IdentityChanged, MissingImage):
                return None
            except invalid:
                return None
            if requeue is not None:
                return requeue
    return POLL_SECONDS


def _wait(decision: Decision) -> float:
    """How long a decision waits: its requeue, else until something changes (inf).

    A steady WAIT carries no requeue; read as "look again now", every event and
    timer tick took ``MAX_STEPS`` full steps of reads for a pipeline with nothing to do.
    """
    return math.inf if decision.requeue_after is None else decision.requeue_after


def _template_annotation(statefulset: dict[str, Any] | None, key: str) -> str | None:
    template = (statefulset or {}).get("spec", {}).get("template", {})
    value = (template.get("metadata", {}).get("annotations") or {}).get(key)
    return None if value is None else str(value)


def _count(pipeline: ExactlyOncePipeline, events: Sequence[Event], now: datetime.datetime) -> None:
    """Feed the operator's metrics from the events of one decision."""
    namespace, name = pipeline.metadata.namespace, pipeline.metadata.name
    wal = pipeline.status.upgrade
    for event in events:
        if event.reason == "Restarted":
            metrics.record_restart(namespace, name, event.reason)
        elif event.reason == "Upgraded" and wal is not None:
            began = parse_stamp(wal.began_at or wal.started_at) if wal.started_at else now
            seconds = max((now - began).total_seconds(), 0.0)
            metrics.record_upgrade(namespace, name, wal.mode.value, seconds)


def _refused(exc: BaseException) -> bool:
    """An API server's "no" to this object (invalid, forbidden, immutable), not a passing fault."""
    return isinstance(exc, KubeError) and 400 <= exc.status < 500 and exc.status not in (408, 429)


def _refusal(obj: dict[str, Any], exc: BaseException) -> str:
    return f"{obj['kind']} {obj['metadata']['name']}: {str(exc)[:300]}"


async def apply_children(
    client: KubeClient, objects: list[dict[str, Any]], replicas: int
) -> tuple[str, ...]:
    """Apply every child; return what the API server refused, one line each.

    Children do not block each other: a refused claim update (a size the
    StorageClass cannot expand) leaves the driver to start, and its readiness
    timeout and rollback still apply.  Only a refused ConfigMap holds the
    StatefulSet back: its pod would run the old ``run.json`` under the new
    spec hash.  Passing faults (5xx, time-outs) raise, and the step is retried.
    """
    *supporting, sts = objects
    sts["spec"]["replicas"] = replicas
    # Everything the driver mounts or runs as goes first; the StatefulSet last,
    # so its pod never starts without its ConfigMap and claim.
    results = await asyncio.gather(
        *(client.apply(obj) for obj in supporting), return_exceptions=True
    )
    refused: list[str] = []
    for obj, result in zip(supporting, results, strict=True):
        if isinstance(result, BaseException):
            if not _refused(result):
                raise result
            refused.append(_refusal(obj, result))
    if any(line.startswith("ConfigMap ") for line in refused):
        refused.append(f"StatefulSet {sts['metadata']['name']}: held back until its ConfigMap")
        return tuple(refused)
    try:
        await client.apply(sts)
    except KubeError as exc:
        if not _refused(exc):
            raise
        refused.append(_refusal(sts, exc))
    return tuple(refused)


async def ensure_rpc_secret(client: KubeClient, pipeline: ExactlyOncePipeline) -> tuple[str, ...]:
    """Create the pipeline's RPC key Secret with a new random key, unless it exists.

    Created, never applied: an existing key stays as it is (a running driver and the
    executors it starts later must read the same one), and the operator never reads it.
    Returns what the API server refused (the driver then waits for the Secret to mount).
    """
    secret = rpc_secret(pipeline, secrets.token_bytes(RPC_KEY_BYTES))
    try:
        await client.create(secret)
    except KubeError as exc:
        if exc.status == 409:  # AlreadyExists
            return ()
        if not _refused(exc):
            raise
        return (_refusal(secret, exc),)
    return ()


async def _warnings(client: KubeClient, key: tuple[str, str], clock: float) -> list[WarningEvent]:
    """The namespace's Warning events: one list, at most every ``WARNINGS_SECONDS``."""
    cached = _WARNINGS.get(key)
    if cached is not None and clock - cached[0] < WARNINGS_SECONDS:
        return cached[1]
    try:
        events = await client.list_objects("v1", "Event", key[0], field_selector="type=Warning")
    except KubeError as exc:
        if exc.status != 403:
            raise
        # An older chart's RBAC: the status says less, the lifecycle goes on.
        log.warning("cannot list events in %s (%s): conditions give fewer causes", key[0], exc)
        events = []
    warnings = [WarningEvent.from_event(event) for event in events]
    _WARNINGS[key] = (clock, warnings)
    return warnings


async def _step(
    client: KubeClient, body: dict[str, Any], render: Renderer, departed: list[dict[str, Any]]
) -> float | None:
    """One decision and its action: a float means "wait that long", None "look again now"."""
    pipeline = load_pipeline(body)
    identity = resolve_identity(pipeline)
    run, running_stable = spec_to_run(pipeline)
    namespace = pipeline.metadata.namespace
    key = (namespace, pipeline.metadata.name)
    statefulset = await client.get("apps/v1", "StatefulSet", namespace, driver_name(pipeline))
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(pipeline).items())
    pods = await client.list_objects("v1", "Pod", namespace, label_selector=selector)
    nonce_changed = (
        statefulset is not None
        and _template_annotation(statefulset, RESTART_NONCE_ANNOTATION) != run.spec.restart_nonce
    )
    now = datetime.datetime.now(datetime.UTC)
    driver = DriverState.from_objects(statefulset, pods, departed)
    status = pipeline.status
    clock = asyncio.get_running_loop().time()
    heal_due = clock - _HEALED.get(key, -HEAL_SECONDS) >= HEAL_SECONDS
    steady = driver.steady_with(status.spec_hash, now)
    claim_name = checkpoint_claim_name(pipeline) if run.spec.checkpoint.claim else None
    claim = ClaimState.UNKNOWN
    # A running driver's claim, once deleted, stays until the pod goes: the periodic
    # look finds it; a driver that does not run, or an upgrade, looks every time.
    if claim_name is not None and (heal_due or not steady or status.upgrade is not None):
        found = await client.get("v1", "PersistentVolumeClaim", namespace, claim_name)
        claim = ClaimState.of(found)
    decision = decide(
        Situation(
            status=status,
            fingerprint=spec_fingerprint(pipeline.spec),
            spec_dump=pipeline.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            suspend=pipeline.spec.suspend,
            upgrade=pipeline.spec.upgrade,
            failover=pipeline.spec.failover,
            driver=driver,
            hash_at=lambda generation, reset: render(run, generation, reset).spec_hash,
            now=now,
            running_stable=running_stable,
            restart_reason=RESTART_NONCE if nonce_changed else SPEC_CHANGED,
            claim=claim,
            claim_name=claim_name,
        )
    )
    cause = None
    if steady:
        _WARNINGS.pop(key, None)
    elif not pipeline.spec.suspend:
        cause = pod_cause(driver, now)
        if cause is None:
            cause = diagnose(
                driver,
                claim=claim,
                claim_name=claim_name,
                warnings=await _warnings(client, key, clock),
                statefulset_uid=(statefulset or {}).get("metadata", {}).get("uid"),
                now=now,
            )
    await _write_status(
        client,
        body,
        pipeline,
        identity.progress_group,
        decision,
        statefulset,
        cause=cause,
        refused=_REFUSED.get(key, ()),
    )
    for event in decision.events:
        await post_event(client, body, type=event.type, reason=event.reason, message=event.message)
    _count(pipeline, decision.events, now)
    if "upgrade" in decision.status:
        step = (decision.status["upgrade"] or {}).get("step")
    else:
        step = status.upgrade.step.value if status.upgrade else None
    # Never while an old driver stops: that StatefulSet must keep zero replicas.
    heal = (
        decision.action is Action.WAIT
        and heal_due
        and status.spec_hash is not None
        and claim is not ClaimState.DELETING
        and step in (None, UpgradeStep.STARTING.value)
    )
    if decision.action is Action.APPLY or heal:
        rendered = render(run, decision.generation, decision.reset_progress)
        # The key first: a driver pod waits for every Secret it mounts.
        refused = await ensure_rpc_secret(client, run) if rendered.needs_rpc_secret else ()
        refused += await apply_children(client, rendered.objects, decision.replicas)
        _HEALED[key] = clock
        before = _REFUSED.get(key, ())
        _REFUSED[key] = refused
        if refused and refused != before:
            await post_event(
                client, body, type="Warning", reason="ApplyRefused", message="; ".join(refused)
            )
        if decision.action is Action.APPLY or refused != before:
            return None
        return _wait(decision)
    if decision.action is Action.STOP and statefulset is not None:
        # A merge patch: the pod template stays the old one while the old driver stops.
        await client.patch(
            "apps/v1", "StatefulSet", namespace, driver_name(pipeline), {"spec": {"replicas": 0}}
        )
        return None
    return _wait(decision)


async def _write_status(
    client: KubeClient,
    body: dict[str, Any],
    pipeline: ExactlyOncePipeline,
    group: str,
    decision: Decision,
    statefulset: dict[str, Any] | None,
    *,
    cause: Cause | None,
    refused: tuple[str, ...],
) -> None:
    """Patch ``.status`` with the decision and the phase it leads to; skip no-op writes."""
    previous = pipeline.status
    observation = DriverObservation.from_statefulset(statefulset) if statefulset else None
    in_flight = decision.status.get("upgrade", previous.upgrade)
    message = decision.status.get("message") or previous.message or "upgrading"
    verdict = lifecycle_verdict(
        suspend=pipeline.spec.suspend,
        driver=observation,
        degraded=decision.degraded,
        upgrading=message if in_flight else None,
        cause=cause,
        refused=refused,
    )
    ready = ready_column(observation, suspend=pipeline.spec.suspend)
    generation = pipeline.metadata.generation
    scale = scale_status(pipeline, observation)
    patch = status_patch(
        verdict,
        previous=previous,
        generation=generation,
        ready=ready,
        now=_now(),
        extra={**scale, **decision.status},
    )
    unchanged = [(c["type"], c["status"], c["reason"], c["message"]) for c in patch["conditions"]]
    before = [(c.type, c.status.value, c.reason, c.message) for c in previous.conditions]
    if not decision.status and (
        previous.phase,
        previous.ready,
        previous.observed_generation,
        before,
        previous.executors,
        previous.executor_selector,
    ) == (verdict.phase, ready, generation, unchanged, *scale.values()):
        return
    checkpoint = dict(patch.get("checkpoint") or {})
    current = previous.checkpoint.generation if previous.checkpoint else 0
    checkpoint["path"] = (
        f"{checkpoint_root(pipeline).rstrip('/')}/gen-{checkpoint.get('generation', current)}"
    )
    patch.update(
        checkpoint=checkpoint,
        transactionalIdPrefix=resolve_identity(pipeline).transactional_id_prefix,
        progressGroup=group,
        commitMode=pipeline.spec.sink.kafka.commit_mode.value,
    )
    if verdict.phase is Phase.DEGRADED and previous.phase is not Phase.DEGRADED:
        await post_event(client, body, type="Warning", reason="Degraded", message=verdict.message)
    meta = pipeline.metadata
    await client.patch(
        API_VERSION, KIND, meta.namespace, meta.name, {"status": patch}, subresource="status"
    )
