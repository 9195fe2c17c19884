"""The operator's Prometheus metrics and its HTTP endpoints (``/metrics``, ``/healthz``).

One registry, owned here; the rest of the operator records through the small
functions below, so metric names and labels live in one place:

* :func:`record_restart` — a driver restart the operator caused or saw
  (``reason``: ``Stalled``, ``Crashed``, ``RestartNonce``...);
* :func:`record_upgrade` — a finished upgrade, its mode and how long it took
  (from the first stop to the new driver Ready);
* :func:`set_phase` / :func:`forget` — the phase of each pipeline (the
  ``eop_pipelines`` gauge counts pipelines by phase; ``eop_pipeline_phase`` is 1 for the
  phase each pipeline is in and 0 for the others);
* :func:`set_lag` — the pipeline's lag from the progress group, in total and by partition;
* :func:`set_leader` — whether this replica holds the leader lease;
* :func:`record_reconcile_failure` — a lifecycle step that failed (``error``: the
  exception's class, e.g. ``KubeUnavailable``, ``InvalidPipeline``);
* :func:`record_check_failure` / :func:`record_check_success` — a health check that failed
  (``kind``: ``kafka`` or ``api``, which side did not answer) or succeeded (the time of
  the last good check of each pipeline).

:func:`serve` starts the endpoints in the operator's event loop before kopf
runs, so a standby replica answers probes and scrapes too.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from eop_operator.api.models import Phase

REGISTRY = CollectorRegistry(auto_describe=True)

PIPELINES = Gauge("eop_pipelines", "ExactlyOncePipelines by phase.", ["phase"], registry=REGISTRY)
LAG = Gauge(
    "eop_pipeline_lag_records",
    "Source records not yet visible in the sink (from the progress group).",
    ["namespace", "pipeline"],
    registry=REGISTRY,
)
PARTITION_LAG = Gauge(
    "eop_partition_lag_records",
    "Records of one source partition not yet visible in the sink (from the progress group).",
    ["namespace", "pipeline", "topic", "partition"],
    registry=REGISTRY,
)
PHASE = Gauge(
    "eop_pipeline_phase",
    "1 for the phase the pipeline is in, 0 for the other phases.",
    ["namespace", "pipeline", "phase"],
    registry=REGISTRY,
)
RESTARTS = Counter(
    "eop_driver_restarts",
    "Driver restarts, by reason.",
    ["namespace", "pipeline", "reason"],
    registry=REGISTRY,
)
UPGRADES = Counter(
    "eop_upgrades",
    "Finished upgrades, by mode.",
    ["namespace", "pipeline", "mode"],
    registry=REGISTRY,
)
UPGRADE_SECONDS = Histogram(
    "eop_upgrade_duration_seconds",
    "Time from stopping the old driver to the new driver Ready.",
    ["mode"],
    buckets=(5, 10, 30, 60, 120, 300, 600, 1800),
    registry=REGISTRY,
)
LEADER = Gauge(
    "eop_operator_leader", "1 while this replica holds the leader lease.", registry=REGISTRY
)

RECONCILE_FAILURES = Counter(
    "eop_reconcile_failures",
    "Lifecycle steps that failed, by the error's class (refused specs included).",
    ["namespace", "pipeline", "error"],
    registry=REGISTRY,
)
CHECK_FAILURES = Counter(
    "eop_health_check_failures",
    "Health checks that failed, by kind: kafka (offsets unreadable, progress group not "
    "refreshed) or api (the API server did not answer).",
    ["namespace", "pipeline", "kind"],
    registry=REGISTRY,
)
CHECK_SUCCESS = Gauge(
    "eop_health_check_last_success_timestamp_seconds",
    "When the pipeline's last health check read its progress and reported it (epoch seconds).",
    ["namespace", "pipeline"],
    registry=REGISTRY,
)
#: The kinds of health-check failure (``eop_health_check_failures_total{kind}``).
KAFKA, API = "kafka", "api"

_phases: dict[tuple[str, str], str] = {}
_partitions: dict[tuple[str, str], set[tuple[str, int]]] = {}
_leader = {"now": False}


def _recount() -> None:
    for phase in Phase:
        PIPELINES.labels(phase=phase.value).set(0)
    for phase_value in _phases.values():
        PIPELINES.labels(phase=phase_value).inc()


def set_phase(namespace: str, name: str, phase: str | None) -> None:
    """Record a pipeline's current phase (None: not reported yet, not counted)."""
    if phase is None:
        _phases.pop((namespace, name), None)
        _forget_phase(namespace, name)
    else:
        _phases[(namespace, name)] = phase
        for known in Phase:
            PHASE.labels(namespace=namespace, pipeline=name, phase=known.value).set(
                1 if known.value == phase else 0
            )
    _recount()


def _forget_phase(namespace: str, name: str) -> None:
    for known in Phase:
        with contextlib.suppress(KeyError):
            PHASE.remove(namespace, name, known.value)


def forget(namespace: str, name: str) -> None:
    """Drop a deleted pipeline from every per-pipeline metric except the counters."""
    _phases.pop((namespace, name), None)
    _recount()
    _forget_phase(namespace, name)
    for gauge in (LAG, CHECK_SUCCESS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    _set_partitions(namespace, name, {})


def _set_partitions(namespace: str, name: str, partitions: Mapping[tuple[str, int], int]) -> None:
    for topic, partition in _partitions.pop((namespace, name), set()) - partitions.keys():
        with contextlib.suppress(KeyError):
            PARTITION_LAG.remove(namespace, name, topic, str(partition))
    for (topic, partition), lag in partitions.items():
        PARTITION_LAG.labels(
            namespace=namespace, pipeline=name, topic=topic, partition=str(partition)
        ).set(lag)
    if partitions:
        _partitions[(namespace, name)] = set(partitions)


def set_lag(
    namespace: str, name: str, lag: int, partitions: Mapping[tuple[str, int], int] | None = None
) -> None:
    """Record a pipeline's total lag in records and, if given, each partition's by
    (topic, partition); partitions no longer given are dropped."""
    LAG.labels(namespace=namespace, pipeline=name).set(lag)
    if partitions is not None:
        _set_partitions(namespace, name, partitions)


def record_restart(namespace: str, name: str, reason: str) -> None:
    """Count one driver restart of a pipeline, with its reason (e.g. ``Stalled``)."""
    RESTARTS.labels(namespace=namespace, pipeline=name, reason=reason).inc()


def record_upgrade(namespace: str, name: str, mode: str, seconds: float) -> None:
    """Count one finished upgrade (``mode`` as in spec.upgrade.mode) and observe its duration."""
    UPGRADES.labels(namespace=namespace, pipeline=name, mode=mode).inc()
    UPGRADE_SECONDS.labels(mode=mode).observe(seconds)


def record_reconcile_failure(namespace: str, name: str, error: BaseException) -> None:
    """Count one failed lifecycle step of a pipeline, by the class of its error."""
    RECONCILE_FAILURES.labels(namespace=namespace, pipeline=name, error=type(error).__name__).inc()


def record_check_failure(namespace: str, name: str, kind: str) -> None:
    """Count one failed health check of a pipeline (``kind``: :data:`KAFKA` or :data:`API`)."""
    CHECK_FAILURES.labels(namespace=namespace, pipeline=name, kind=kind).inc()


def record_check_success(namespace: str, name: str, at: float) -> None:
    """Record when a pipeline's health check last succeeded (epoch seconds)."""
    CHECK_SUCCESS.labels(namespace=namespace, pipeline=name).set(at)


def set_leader(leader: bool) -> None:
    """Record whether this replica is the one acting."""
    _leader["now"] = leader
    LEADER.set(1 if leader else 0)


def exposition() -> bytes:
    """The registry in the Prometheus text format."""
    return generate_latest(REGISTRY)


@dataclass(frozen=True)
class Endpoint:
    """Where an HTTP endpoint listens: ``http://host:port/path``."""

    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Parse ``http://host:port/path`` (host defaults to 0.0.0.0, path to /)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or parts.port is None:
            raise ValueError(f"expected http://HOST:PORT/PATH, got {url!r}")
        return cls(parts.hostname or "0.0.0.0", parts.port, parts.path or "/")


async def _metrics(_: web.Request) -> web.Response:
    return web.Response(body=exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(_: web.Request) -> web.Response:
    # Alive means the event loop answers; kopf's own liveness would say no more (no probes).
    return web.json_response({"status": "ok", "leader": _leader["now"]})


async def serve(*, metrics: Endpoint | None, liveness: Endpoint | None) -> web.AppRunner:
    """Start ``/metrics`` and the liveness endpoint in this event loop; return the runner.

    Both may share one port (then one server serves both paths).  Stop them with
    ``await runner.cleanup()``.
    """
    routes: dict[tuple[str, int], list[web.RouteDef]] = {}
    if metrics is not None:
        routes.setdefault((metrics.host, metrics.port), []).append(web.get(metrics.path, _metrics))
    if liveness is not None:
        routes.setdefault((liveness.host, liveness.port), []).append(
            web.get(liveness.path, _healthz)
        )
    app = web.Application()
    for defs in routes.values():
        app.add_routes(defs)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    for host, port in routes:
        await web.TCPSite(runner, host, port).start()
    return runner
