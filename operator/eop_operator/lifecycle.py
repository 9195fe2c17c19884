"""The lifecycle loop: observe a pipeline's driver, decide (pure), write status, act.

:func:`drive` is what every trigger calls (a spec change, a driver pod or
StatefulSet event, the periodic timer).  The decisions live in
``reconcile.upgrade`` and ``reconcile.failover``; this module only reads the
API server, writes the decision's status patch *before* acting on it (the
write-ahead log of an upgrade in flight), posts the events and applies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import logging
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from eop_operator import API_VERSION, KIND, metrics
from eop_operator.api.load import InvalidPipeline, load_pipeline
from eop_operator.api.models import ExactlyOncePipeline, Phase, PipelineStatus, UpgradeStep
from eop_operator.api.resolve import IdentityChanged, resolve_identity
from eop_operator.kube.client import KubeClient, KubeError
from eop_operator.kube.events import post_event
from eop_operator.kube.observed import CHILD_KINDS, Observed, PipelineKey, Versions
from eop_operator.reconcile.admission import IdentityTaken
from eop_operator.reconcile.children import (
    ChildRef,
    Version,
    child_ref,
    plan_sync,
    stamp_rendered_hash,
    version_of,
)
from eop_operator.reconcile.failover import parse_stamp
from eop_operator.reconcile.observe import ClaimState, DriverState, WarningEvent
from eop_operator.reconcile.status import (
    Cause,
    DriverObservation,
    diagnose,
    judge,
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
_LOCKS: dict[PipelineKey, asyncio.Lock] = {}
#: Decisions per :func:`drive` call before it yields to the next trigger.
MAX_STEPS = 6
#: A child deleted or changed by hand is applied again at once, and then at most this
#: often per pipeline (another controller fighting over a field gets no loop).
HEAL_SECONDS = 10.0
#: Every child is applied again this often whatever it looks like: what was edited while
#: the operator was down comes back too.  Each pipeline's first time is spread over it.
VERIFY_SECONDS = 600.0
#: A pipeline whose driver does not run is looked at this often without events (the
#: namespace's Warning events, listed at most as often, may name a new cause).
LOOK_SECONDS = 10.0
#: A running pipeline is looked at this often without events.
SETTLED_SECONDS = 60.0
#: After an apply, the StatefulSet controller's word is awaited this long before the
#: status describes a StatefulSet it has not seen yet.
CONTROLLER_SECONDS = 2.0
#: The namespace's Warning events are listed at most this often (all its pipelines share
#: the list: a burst of new pipelines would list them at every step).
WARNINGS_SECONDS = 10.0
#: The last list of Warning events per namespace (event-loop time, the list under way or done).
_WARNINGS: dict[str, tuple[float, asyncio.Future[list[WarningEvent]]]] = {}


@dataclass
class _Memory:
    """What the lifecycle remembers of one pipeline between steps (lost at exit: safe)."""

    #: Each child's version as the operator last applied it or found it in sync.
    applied: dict[ChildRef, Version] = field(default_factory=dict)
    #: When children were last applied (event-loop time).
    applied_at: float = -math.inf
    #: When every child is applied again whatever it looks like.
    verify_at: float | None = None
    #: What the API server refused at the last apply of the pipeline's children.
    refused: tuple[str, ...] = ()
    #: When the timer should look at the pipeline next (0: at its next tick).
    look_at: float = 0.0
    #: The versions of what the last step that waited read (``Observed.versions``).
    seen: Versions = field(default_factory=dict)


_MEMORY: dict[PipelineKey, _Memory] = {}


def _memory(key: PipelineKey, clock: float) -> _Memory:
    memory = _MEMORY.get(key)
    if memory is None:
        # Spread the periodic apply of every child: an operator start looks at all
        # pipelines at once, and would otherwise apply all of them again at once.
        offset = int(hashlib.sha256(f"{key[0]}/{key[1]}".encode()).hexdigest()[:8], 16)
        memory = _MEMORY[key] = _Memory(verify_at=clock + offset % int(VERIFY_SECONDS))
    return memory


def forget(observed: Observed, namespace: str, name: str) -> None:
    """Drop what the lifecycle remembers of a pipeline that is gone or going."""
    _LOCKS.pop((namespace, name), None)
    _MEMORY.pop((namespace, name), None)
    observed.own.drop((namespace, name))


def due(namespace: str, name: str) -> bool:
    """Whether the timer should look at the pipeline now (its last step said when)."""
    memory = _MEMORY.get((namespace, name))
    return memory is None or asyncio.get_running_loop().time() >= memory.look_at


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
    observed: Observed,
    namespace: str,
    name: str,
    render: Renderer,
    *,
    invalid: tuple[type[Exception], ...] = (),
    pod: dict[str, Any] | None = None,
) -> float | None:
    """Take the pipeline's lifecycle steps until the next one is to wait.

    Reads what the watches delivered (``observed``), writes through ``client``.
    Returns how long until the next look (also what :func:`due` tells the
    timer), None for a pipeline that is gone.  An invalid spec (or an ``invalid``
    extra error of ``render``) is refused (:func:`refuse`).  ``pod`` is a driver
    pod from a watch event: it may be gone already, and its termination still
    counts.
    """
    key = (namespace, name)
    refusable: tuple[type[Exception], ...] = (
        InvalidPipeline,
        IdentityChanged,
        MissingImage,
        *invalid,
    )
    lock = _LOCKS.setdefault(key, asyncio.Lock())
    async with lock:
        for _ in range(MAX_STEPS):
            if _Shutdown.stopping:
                return None
            clock = asyncio.get_running_loop().time()
            body = observed.pipeline(namespace, name, clock)
            if body is None or body["metadata"].get("deletionTimestamp"):
                forget(observed, namespace, name)
                return None
            memory = _memory(key, clock)
            seen = observed.versions(namespace, name, clock)
            if seen == memory.seen and clock < memory.look_at:
                # Nothing changed since the last step and nothing is due: it would decide
                # the same (the echo of the operator's own write, a timer tick).
                return memory.look_at - clock
            memory.look_at = 0.0  # a step that fails is tried again at the next tick
            try:
                wait = await _step(client, observed, body, render, memory, [pod] if pod else [])
            except refusable as exc:
                await refuse(client, observed, body, exc)
                wait = LOOK_SECONDS  # what made it invalid may go (another pipeline's claim)
            if wait is not None:
                # What the step read, as its own writes left it: whatever else changed
                # meanwhile (an event during the step) is news for the next trigger.
                memory.seen = {**seen, **observed.written_since(namespace, name, clock)}
                memory.look_at = clock + wait
                return wait
    memory.look_at = clock + POLL_SECONDS
    return POLL_SECONDS


def _wait(decision: Decision) -> float:
    """How long a decision waits: its requeue, else until something changes (inf).

    A steady WAIT carries no requeue; read as "look again now", every event and
    timer tick took ``MAX_STEPS`` full steps for a pipeline with nothing to do.
    """
    return math.inf if decision.requeue_after is None else decision.requeue_after


def _news(patch: dict[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a status patch that change something (a decision repeats some)."""
    return {key: value for key, value in patch.items() if status.get(key) != value}


async def refuse(
    client: KubeClient, observed: Observed, body: dict[str, Any], exc: Exception
) -> None:
    """Say why a pipeline cannot run: a Warning event and the status, once per generation.

    Nothing is created or changed for it (what is checked fails before anything is rendered).
    """
    try:
        previous = PipelineStatus.model_validate(body.get("status") or {})
    except ValidationError:
        previous = PipelineStatus()
    meta = body["metadata"]
    generation = meta.get("generation")
    said = [c.message for c in previous.conditions if c.type == "Ready"]
    if (previous.phase, previous.observed_generation, said) == (
        Phase.INVALID,
        generation,
        [str(exc)],
    ):
        return  # said already: every event of the pipeline comes here
    reason = "IdentityInUse" if isinstance(exc, IdentityTaken) else "InvalidSpec"
    await post_event(client, body, type="Warning", reason=reason, message=str(exc))
    verdict = judge(suspend=False, driver=None, error=str(exc))
    status = status_patch(
        verdict,
        previous=previous,
        generation=generation,
        ready=ready_column(None, suspend=False),
        now=_now(),
    )
    written = await client.patch(
        API_VERSION, KIND, meta["namespace"], meta["name"], {"status": status}, subresource="status"
    )
    observed.record(written, asyncio.get_running_loop().time())


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
    client: KubeClient, objects: list[dict[str, Any]]
) -> tuple[dict[ChildRef, dict[str, Any]], tuple[str, ...]]:
    """Apply the children given; return the API server's answers and what it refused.

    Children do not block each other: a refused claim update (a size the
    StorageClass cannot expand) leaves the driver to start, and its readiness
    timeout and rollback still apply.  Only a refused ConfigMap holds the
    StatefulSet back: its pod would run the old ``run.json`` under the new
    spec hash.  Passing faults (5xx, time-outs) raise, and the step is retried.
    """
    supporting = [obj for obj in objects if obj["kind"] != "StatefulSet"]
    statefulsets = [obj for obj in objects if obj["kind"] == "StatefulSet"]
    # Everything the driver mounts or runs as goes first; the StatefulSet last,
    # so its pod never starts without its ConfigMap and claim.
    results = await asyncio.gather(
        *(client.apply(obj) for obj in supporting), return_exceptions=True
    )
    applied: dict[ChildRef, dict[str, Any]] = {}
    refused: list[str] = []
    for obj, result in zip(supporting, results, strict=True):
        if isinstance(result, BaseException):
            if not _refused(result):
                raise result
            refused.append(_refusal(obj, result))
        else:
            applied[child_ref(obj)] = result
    for sts in statefulsets:
        if any(line.startswith("ConfigMap ") for line in refused):
            refused.append(f"StatefulSet {sts['metadata']['name']}: held back until its ConfigMap")
            continue
        try:
            applied[child_ref(sts)] = await client.apply(sts)
        except KubeError as exc:
            if not _refused(exc):
                raise
            refused.append(_refusal(sts, exc))
    return applied, tuple(refused)


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


async def _warnings(client: KubeClient, namespace: str, clock: float) -> list[WarningEvent]:
    """The namespace's Warning events: one list at a time, at most every ``WARNINGS_SECONDS``.

    An operator start looks at all pipelines of a namespace at once: they share one list.
    """
    cached = _WARNINGS.get(namespace)
    if cached is None or clock - cached[0] >= WARNINGS_SECONDS:
        for stale in [ns for ns, (at, _) in _WARNINGS.items() if clock - at >= WARNINGS_SECONDS]:
            del _WARNINGS[stale]  # no pipeline of these namespaces waits for its driver now
        cached = (clock, asyncio.ensure_future(_list_warnings(client, namespace)))
        _WARNINGS[namespace] = cached
    try:
        return await asyncio.shield(cached[1])
    except BaseException:
        if _WARNINGS.get(namespace) is cached:
            del _WARNINGS[namespace]  # a failed list is not kept: the next step lists again
        raise


async def _list_warnings(client: KubeClient, namespace: str) -> list[WarningEvent]:
    try:
        events = await client.list_objects("v1", "Event", namespace, field_selector="type=Warning")
    except KubeError as exc:
        if exc.status != 403:
            raise
        # An older chart's RBAC: the status says less, the lifecycle goes on.
        log.warning("cannot list events in %s (%s): conditions give fewer causes", namespace, exc)
        events = []
    return [WarningEvent.from_event(event) for event in events]


def _memoized(render: Renderer, pipeline: ExactlyOncePipeline) -> Callable[[int, bool], Any]:
    """``render`` of one pipeline, each (generation, reset) rendered once per step."""
    rendered: dict[tuple[int, bool], RenderedPipeline] = {}

    def at(generation: int, reset: bool) -> RenderedPipeline:
        if (generation, reset) not in rendered:
            rendered[(generation, reset)] = render(pipeline, generation, reset)
        return rendered[(generation, reset)]

    return at


def _seen_by_controller(statefulset: dict[str, Any]) -> bool:
    observed = (statefulset.get("status") or {}).get("observedGeneration")
    return observed is not None and observed >= statefulset["metadata"].get("generation", 0)


def _selects(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    found = pod.get("metadata", {}).get("labels") or {}
    return all(found.get(k) == v for k, v in labels.items())


async def _step(
    client: KubeClient,
    observed: Observed,
    body: dict[str, Any],
    render: Renderer,
    memory: _Memory,
    departed: list[dict[str, Any]],
) -> float | None:
    """One decision and its action: a float means "look again in that long", None "now"."""
    pipeline = load_pipeline(body)
    identity = resolve_identity(pipeline)
    run, running_stable = spec_to_run(pipeline)
    rendered = _memoized(render, run)
    namespace, name = pipeline.metadata.namespace, pipeline.metadata.name
    clock = asyncio.get_running_loop().time()
    children = {
        (kind, child): obj
        for kind in CHILD_KINDS
        for child, obj in observed.objects(namespace, name, kind, clock).items()
    }
    statefulset = children.get(("StatefulSet", driver_name(pipeline)))
    selector = selector_labels(pipeline)
    pods = [
        p for p in observed.objects(namespace, name, "Pod", clock).values() if _selects(p, selector)
    ]
    nonce_changed = (
        statefulset is not None
        and _template_annotation(statefulset, RESTART_NONCE_ANNOTATION) != run.spec.restart_nonce
    )
    now = datetime.datetime.now(datetime.UTC)
    driver = DriverState.from_objects(statefulset, pods, departed)
    status = pipeline.status
    steady = driver.steady_with(status.spec_hash, now)
    claim_name = checkpoint_claim_name(pipeline) if run.spec.checkpoint.claim else None
    claim = ClaimState.UNKNOWN
    if claim_name is not None:
        claim = ClaimState.of(children.get(("PersistentVolumeClaim", claim_name)))
    decision = decide(
        Situation(
            status=status,
            fingerprint=spec_fingerprint(pipeline.spec),
            spec_dump=pipeline.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
            suspend=pipeline.spec.suspend,
            upgrade=pipeline.spec.upgrade,
            failover=pipeline.spec.failover,
            driver=driver,
            hash_at=lambda generation, reset: rendered(generation, reset).spec_hash,
            now=now,
            running_stable=running_stable,
            restart_reason=RESTART_NONCE if nonce_changed else SPEC_CHANGED,
            claim=claim,
            claim_name=claim_name,
        )
    )
    decision = dataclasses.replace(
        decision, status=_news(decision.status, body.get("status") or {})
    )
    if "upgrade" in decision.status:
        step = (decision.status["upgrade"] or {}).get("step")
    else:
        step = status.upgrade.step.value if status.upgrade else None
    # Never while an old driver stops: that StatefulSet must keep zero replicas.
    heal = (
        decision.action is Action.WAIT
        and status.spec_hash is not None
        and claim is not ClaimState.DELETING
        and step in (None, UpgradeStep.STARTING.value)
    )
    todo: list[dict[str, Any]] = []
    key_owner: ExactlyOncePipeline | None = None  # a pipeline whose RPC key must exist
    later = math.inf  # when children out of sync may be applied again
    if decision.action is Action.APPLY or heal:
        result = rendered(decision.generation, decision.reset_progress)
        objects = result.objects
        key_owner = run if result.needs_rpc_secret else None
        for obj in objects:
            if obj["kind"] == "StatefulSet":
                obj["spec"]["replicas"] = decision.replicas
            stamp_rendered_hash(obj)
        verify = memory.verify_at is not None and clock >= memory.verify_at
        plan = plan_sync(objects, children, memory.applied)
        memory.applied.update(plan.verified)
        todo = objects if verify else plan.apply
        if todo and decision.action is not Action.APPLY and not verify:
            later = memory.applied_at + HEAL_SECONDS - clock
            if later > 0:
                todo = []  # healed a moment ago: again once HEAL_SECONDS have passed
    # What only the apply changes (no WAL entry) is written after it: the status then
    # says what the step brought about, in one write rather than two.
    if todo and not decision.status and not decision.events:
        return await _apply(client, observed, body, todo, memory, clock, key_owner)
    unseen = CONTROLLER_SECONDS - (clock - memory.applied_at)
    if (
        unseen > 0
        and statefulset is not None
        and not _seen_by_controller(statefulset)
        and decision.action is Action.WAIT
        and not (decision.status or decision.events or todo)
    ):
        # The StatefulSet just applied has no word from its controller yet, which answers
        # in moments (an event, and the next step): a status written now would call a
        # driver being created "being replaced", then take it back.
        return unseen
    cause = None
    if not steady and not pipeline.spec.suspend:
        cause = pod_cause(driver, now)
        if cause is None:
            cause = diagnose(
                driver,
                claim=claim,
                claim_name=claim_name,
                warnings=await _warnings(client, namespace, clock),
                statefulset_uid=(statefulset or {}).get("metadata", {}).get("uid"),
                now=now,
            )
    await _write_status(
        client,
        observed,
        body,
        pipeline,
        identity.progress_group,
        decision,
        statefulset,
        cause=cause,
        refused=memory.refused,
    )
    _count(pipeline, decision.events, now)
    if todo:
        # The events say what the step does; they need not hold its apply back.
        again, _ = await asyncio.gather(
            _apply(client, observed, body, todo, memory, clock, key_owner),
            _post_events(client, body, decision.events),
        )
        return None if decision.action is Action.APPLY else again
    await _post_events(client, body, decision.events)
    if decision.action is Action.STOP and statefulset is not None:
        # A merge patch: the pod template stays the old one while the old driver stops.
        stopped = await client.patch(
            "apps/v1", "StatefulSet", namespace, driver_name(pipeline), {"spec": {"replicas": 0}}
        )
        observed.record(stopped, clock)
        memory.applied[child_ref(stopped)] = version_of(stopped)
        return None
    # Nothing to do now: look again when the decision, a driver's recovery, a child out
    # of sync or the periodic apply of every child is due, and at least every `looks`.
    looks = SETTLED_SECONDS if steady else LOOK_SECONDS
    verify_in = math.inf if memory.verify_at is None else memory.verify_at - clock
    deadlines = (_wait(decision), looks, later, verify_in, driver.recovers_in(now))
    return min(d for d in deadlines if d > 0)


async def _post_events(client: KubeClient, body: dict[str, Any], events: Sequence[Event]) -> None:
    for event in events:
        await post_event(client, body, type=event.type, reason=event.reason, message=event.message)


async def _apply(
    client: KubeClient,
    observed: Observed,
    body: dict[str, Any],
    todo: list[dict[str, Any]],
    memory: _Memory,
    clock: float,
    key_owner: ExactlyOncePipeline | None = None,
) -> float | None:
    """Apply ``todo`` and remember the answers; return when to look again.

    ``key_owner``: a pipeline whose Spark RPC key Secret is created first, if missing.

    None ("now") when what the API server refuses changed (the status says so), else
    the moments its controllers take to answer: their events are the next look.
    """
    # The key first: a driver pod waits for every Secret it mounts.
    refused_key = await ensure_rpc_secret(client, key_owner) if key_owner is not None else ()
    applied, refused = await apply_children(client, todo)
    refused = refused_key + refused
    for ref, answer in applied.items():
        observed.record(answer, clock)
        memory.applied[ref] = version_of(answer)
    memory.applied_at = clock
    if memory.verify_at is not None and clock >= memory.verify_at:
        memory.verify_at = clock + VERIFY_SECONDS
    before, memory.refused = memory.refused, refused
    if refused and refused != before:
        await post_event(
            client, body, type="Warning", reason="ApplyRefused", message="; ".join(refused)
        )
    return None if refused != before else CONTROLLER_SECONDS


async def _write_status(
    client: KubeClient,
    observed: Observed,
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
    written = await client.patch(
        API_VERSION, KIND, meta.namespace, meta.name, {"status": patch}, subresource="status"
    )
    observed.record(written, asyncio.get_running_loop().time())
