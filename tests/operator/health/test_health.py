"""Health from progress, the pure parts: lag, worst partitions, input rate, stall verdicts,
which partitions a pipeline reads and where unseen ones start, secret redaction, the leader
lease rules, the operator's metrics, and when the operator keeps a progress group alive.
"""

from __future__ import annotations

import asyncio
import base64
import time
import urllib.error
from typing import Any

import pytest

from devenv.certs import Certs, strimzi_user_secret_data
from eop_operator import metrics
from eop_operator.api.load import load_pipeline
from eop_operator.api.status_patch import merge_patch
from eop_operator.controller import health_monitor
from eop_operator.controller.context import Context, OperatorOptions
from eop_operator.controller.health_monitor import HealthMemory, HealthMonitor
from eop_operator.health.keep_alive import driver_runs
from eop_operator.health.progress import (
    KafkaAccess,
    ProgressUnavailable,
    kafka_access,
    source_partitions,
    start_positions,
)
from eop_operator.health.report import health_patch, held_partitions, lost_progress, ready_since
from eop_operator.health.stall import (
    PartitionOffsets,
    ProgressHistory,
    Reading,
    advanced,
    assess,
    input_rate,
    remember,
    worst_partitions,
)
from eop_operator.kube.client import KubeError, KubeUnavailable
from eop_operator.kube.lease import LeaseAction, LeaseRecord, decide
from eop_spark.contract.spec import KafkaSource
from tests.operator.scrape import free_port, http_get, scrape, value

WINDOW = 300.0


def part(p: int, committed: int | None, end: int, *, start: int = 0, topic: str = "in") -> Any:
    return PartitionOffsets(topic, p, committed, end, start)


def obs(at: float, *partitions: PartitionOffsets) -> Reading:
    return Reading(at, tuple(partitions))


def fold(*readings: Reading) -> ProgressHistory:
    history = None
    for o in readings:
        history = remember(history, o)
    assert history is not None
    return history


# --- lag ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("committed", "end", "start", "lag"),
    [
        (10, 15, 0, 5),  # behind
        (15, 15, 0, 0),  # caught up
        (None, 15, 0, 15),  # never committed, starts at earliest (0)
        (None, 15, 15, 0),  # never committed, starts at latest: nothing owed
        (None, 15, 20, 0),  # explicit start past the end
        (20, 15, 0, 0),  # G ahead of the end (topic recreated): never negative
    ],
)
def test_partition_lag(committed: int | None, end: int, start: int, lag: int) -> None:
    assert part(0, committed, end, start=start).lag == lag


def test_total_lag_sums_partitions() -> None:
    assert obs(0, part(0, 1, 4), part(1, None, 10, start=2), part(2, 7, 7)).lag == 3 + 8


def test_worst_partitions_are_the_three_largest_nonzero() -> None:
    parts = [part(0, 0, 5), part(1, 0, 50), part(2, 0, 5), part(3, 9, 9), part(4, 0, 7)]
    assert [(p.partition, p.lag) for p in worst_partitions(parts)] == [(1, 50), (4, 7), (0, 5)]
    assert worst_partitions([part(0, 3, 3)]) == ()


# --- advance and input rate -----------------------------------------------------------------------


def test_advanced_counts_moves_and_first_commits_only() -> None:
    assert advanced({("in", 0): 5}, {("in", 0): 6})
    assert advanced({}, {("in", 0): 0})
    assert not advanced({("in", 0): 5}, {("in", 0): 5})
    assert not advanced({("in", 0): 5, ("in", 1): 3}, {("in", 0): 5})  # a partition vanished


def test_input_rate_from_end_offsets() -> None:
    history = fold(
        obs(0, part(0, 0, 100), part(1, 0, 0)),
        obs(10, part(0, 0, 150), part(1, 0, 30)),
        obs(20, part(0, 0, 200), part(1, 0, 60)),
    )
    assert input_rate(history.samples) == pytest.approx((100 + 60) / 20)


def test_input_rate_needs_two_samples_and_ignores_shrinking_or_new_partitions() -> None:
    assert input_rate([(0.0, {("in", 0): 5})]) is None
    assert input_rate([(0.0, {("in", 0): 50}), (10.0, {("in", 0): 10, ("in", 1): 99})]) == 0
    assert input_rate([(5.0, {("in", 0): 1}), (5.0, {("in", 0): 9})]) is None


# --- stall verdicts -------------------------------------------------------------------------------


def test_no_progress_with_lag_past_the_window_is_a_stall() -> None:
    first, late = obs(0, part(0, 10, 20)), obs(WINDOW, part(0, 10, 25))
    health = assess(fold(first, late), late, stall_timeout=WINDOW, ready_since=0)
    assert health.stalled and health.idle_seconds == WINDOW and health.lag == 15


def test_no_progress_within_the_window_is_not_a_stall() -> None:
    first, soon = obs(0, part(0, 10, 20)), obs(WINDOW - 1, part(0, 10, 20))
    health = assess(fold(first, soon), soon, stall_timeout=WINDOW, ready_since=0)
    assert not health.stalled and health.idle_seconds == WINDOW - 1


def test_an_advance_restarts_the_window() -> None:
    a, b, c = obs(0, part(0, 10, 20)), obs(100, part(0, 11, 30)), obs(350, part(0, 11, 30))
    health = assess(fold(a, b, c), c, stall_timeout=WINDOW, ready_since=0)
    assert not health.stalled and health.last_advance == 100 and health.idle_seconds == 250


def test_idle_without_lag_is_healthy() -> None:
    a, b = obs(0, part(0, 20, 20)), obs(10 * WINDOW, part(0, 20, 20))
    health = assess(fold(a, b), b, stall_timeout=WINDOW, ready_since=0)
    assert not health.stalled and health.idle_seconds == 0


def test_a_driver_that_is_not_ready_is_never_stalled() -> None:
    a, b = obs(0, part(0, 0, 20)), obs(10 * WINDOW, part(0, 0, 20))
    assert not assess(fold(a, b), b, stall_timeout=WINDOW, ready_since=None).stalled


def test_a_recently_ready_driver_gets_a_full_window() -> None:
    a, b = obs(0, part(0, 0, 20)), obs(10 * WINDOW, part(0, 0, 20))
    ready = 10 * WINDOW - 60  # became Ready (or was restarted) a minute ago
    health = assess(fold(a, b), b, stall_timeout=WINDOW, ready_since=ready)
    assert not health.stalled and health.idle_seconds == 60


def test_last_commit_time_is_only_reported_once_an_advance_was_seen() -> None:
    a, b = obs(0, part(0, 3, 20)), obs(30, part(0, 3, 20))
    assert assess(fold(a, b), b, stall_timeout=WINDOW, ready_since=0).last_advance is None
    c = obs(60, part(0, 4, 20))
    assert assess(fold(a, b, c), c, stall_timeout=WINDOW, ready_since=0).last_advance == 60


def test_status_fields_of_a_check() -> None:
    a, b = obs(0, part(0, 3, 20), part(1, None, 4)), obs(10, part(0, 5, 40), part(1, None, 4))
    health = assess(fold(a, b), b, stall_timeout=WINDOW, ready_since=0)
    # The last check could not read the offsets; this one can.
    before = {"lag": 3, "progress": {"lag": 3, "message": "the broker does not answer"}}
    status = merge_patch(health_patch(health, checked_at=b.at), before)
    assert status["lag"] == status["progress"]["lag"] == 35 + 4
    assert status["progress"]["worstPartitions"][0] == {
        "topic": "in",
        "partition": 0,
        "committed": 5,
        "end": 40,
        "lag": 35,
    }
    assert status["progress"]["inputRate"] == 2.0
    assert status["progress"]["lastCommitTime"] == "1970-01-01T00:00:10Z"
    assert status["progress"]["message"] is None  # a successful check clears an old error


# --- which partitions, where unseen partitions start ----------------------------------------------


def source(**fields: Any) -> KafkaSource:
    return KafkaSource.model_validate({"bootstrapServers": "k:9092", **fields})


def test_source_partitions_by_name_and_by_pattern() -> None:
    topics = {"orders": [1, 0], "orders-eu": [0], "__consumer_offsets": [0], "refunds": [0]}
    assert source_partitions(topics, source(topics=["orders"])) == [("orders", 0), ("orders", 1)]
    assert source_partitions(topics, source(topicPattern="orders.*")) == [
        ("orders", 0),
        ("orders", 1),
        ("orders-eu", 0),
    ]
    # Java's Pattern.matches: the whole name
    assert source_partitions(topics, source(topicPattern="order")) == []
    with pytest.raises(ProgressUnavailable, match="missing"):
        source_partitions(topics, source(topics=["orders", "missing"]))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("earliest", {("t", 0): 5, ("t", 1): 0}),
        ("latest", {("t", 0): 50, ("t", 1): 9}),
        ('{"t":{"0":7,"1":-1}}', {("t", 0): 7, ("t", 1): 9}),
    ],
)
def test_where_unseen_partitions_start(spec: str, expected: dict[Any, int]) -> None:
    watermarks = {("t", 0): (5, 50), ("t", 1): (0, 9)}
    assert start_positions(watermarks, watermarks, spec) == expected


def test_secret_values_are_redacted_from_messages() -> None:
    access = KafkaAccess({}, {}, secrets=("hunter2-password", "abc"))
    message = access.redact("SASL auth failed for hunter2-password (abc)")
    assert "hunter2" not in message and "***" in message
    assert "abc" in message  # too short to redact safely


def test_ready_since_reads_the_pod_ready_condition() -> None:
    pod = {
        "metadata": {},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "1970-01-01T00:01:40Z"}
            ]
        },
    }
    assert ready_since(pod) == 100.0
    assert ready_since(None) is None
    assert ready_since({**pod, "metadata": {"deletionTimestamp": "x"}}) is None
    pod["status"]["conditions"][0]["status"] = "False"
    assert ready_since(pod) is None


def test_health_defaults_in_the_api() -> None:
    pipeline = load_pipeline(
        {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": "p"},
            "spec": {
                "source": {"kafka": {"bootstrapServers": "k:9092", "topics": ["in"]}},
                "transform": {"sql": "SELECT key, value FROM source"},
                "sink": {"kafka": {"bootstrapServers": "k:9092", "topic": "out"}},
            },
        }
    )
    assert pipeline.spec.health.check_interval == "30s"
    assert pipeline.spec.health.stall_timeout == "5m"


# --- Secrets read through the API ----------------------------------------------------------------


class SecretsApi:
    """What ``kafka_access`` asks of the API: ``get`` of one Secret, its data base64."""

    def __init__(self, name: str, data: dict[str, bytes]) -> None:
        self.secret = {
            "metadata": {"name": name},
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
        }

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        assert (api_version, kind, name) == ("v1", "Secret", self.secret["metadata"]["name"])
        return self.secret


def tls_body(secret: str, name: str = "p") -> dict[str, Any]:
    """A pipeline manifest whose Kafka clients authenticate with Secret ``secret``."""
    kafka = {"bootstrapServers": "k:9093", "secretRef": {"name": secret}}
    return {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {
            "source": {"kafka": {**kafka, "topics": ["in"]}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {**kafka, "topic": "out"}},
        },
    }


def tls_pipeline(secret: str) -> Any:
    return load_pipeline(tls_body(secret))


def test_a_strimzi_user_secret_with_binary_pkcs12_gives_the_health_check_its_tls(
    kafka_tls_certs: Certs,
) -> None:
    certs = kafka_tls_certs
    api = SecretsApi("kafka-user", strimzi_user_secret_data(certs))
    access = asyncio.run(kafka_access(api, tls_pipeline("kafka-user")))  # type: ignore[arg-type]
    for config in (access.source, access.sink):
        assert config["ssl.key.pem"] == certs.text("user.key").removesuffix("\n")
        assert config["ssl.ca.pem"] == certs.text("ca.crt").removesuffix("\n")
        assert "user.p12" not in config


def test_a_binary_value_the_health_check_needs_is_a_status_message(
    kafka_tls_certs: Certs,
) -> None:
    data = strimzi_user_secret_data(kafka_tls_certs)
    data["user.key"] = data["user.p12"]  # DER where PEM belongs
    api = SecretsApi("kafka-user", data)
    with pytest.raises(ProgressUnavailable, match=r"key user\.key of Secret kafka-user .*UTF-8"):
        asyncio.run(kafka_access(api, tls_pipeline("kafka-user")))  # type: ignore[arg-type]


# --- leader lease ---------------------------------------------------------------------------------


def lease(holder: str | None, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder, duration, "t", 0, "1")


@pytest.mark.parametrize(
    ("record", "unchanged_for", "action"),
    [
        (None, 0, LeaseAction.ACQUIRE),  # no lease yet
        (lease(None), 0, LeaseAction.ACQUIRE),  # released
        (lease("me"), 0, LeaseAction.RENEW),
        (lease("me"), 99, LeaseAction.RENEW),
        (lease("other"), 14.9, LeaseAction.WAIT),  # the holder may still renew
        (lease("other"), 15, LeaseAction.ACQUIRE),  # silent for a whole lease duration
    ],
)
def test_lease_rules(record: LeaseRecord | None, unchanged_for: float, action: LeaseAction) -> None:
    assert decide(record, "me", unchanged_for=unchanged_for) is action


def test_lease_record_from_object() -> None:
    record = LeaseRecord.from_object(
        {
            "metadata": {"resourceVersion": "42"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 2},
        }
    )
    assert (record.holder, record.duration, record.transitions) == ("a", 15, 2)
    assert record.resource_version == "42"


# --- operator metrics -----------------------------------------------------------------------------


def sample(name: str, labels: dict[str, str]) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels)


def test_metrics_recorders() -> None:
    metrics.set_phase("ns", "a", "Running")
    metrics.set_phase("ns", "b", "Running")
    metrics.set_phase("ns", "c", "Degraded")
    assert sample("eop_pipelines", {"phase": "Running"}) == 2
    metrics.set_phase("ns", "b", "Suspended")
    metrics.forget("ns", "c")
    assert sample("eop_pipelines", {"phase": "Running"}) == 1
    assert sample("eop_pipelines", {"phase": "Degraded"}) == 0
    assert sample("eop_pipelines", {"phase": "Suspended"}) == 1

    metrics.set_lag("ns", "a", 42)
    assert sample("eop_pipeline_lag_records", {"namespace": "ns", "pipeline": "a"}) == 42
    metrics.forget("ns", "a")
    assert sample("eop_pipeline_lag_records", {"namespace": "ns", "pipeline": "a"}) is None

    labels = {"namespace": "ns", "pipeline": "a", "reason": "Stalled"}
    before = sample("eop_driver_restarts_total", labels) or 0
    metrics.record_restart("ns", "a", "Stalled")
    assert sample("eop_driver_restarts_total", labels) == before + 1

    metrics.record_upgrade("ns", "a", "last-state", 42.0)
    assert sample("eop_upgrades_total", {"namespace": "ns", "pipeline": "a", "mode": "last-state"})
    assert sample("eop_upgrade_duration_seconds_bucket", {"mode": "last-state", "le": "60.0"})


def test_metrics_and_liveness_endpoints() -> None:
    port = free_port()

    async def scrape_both() -> tuple[str, str]:
        endpoint = metrics.Endpoint("127.0.0.1", port, "/metrics")
        liveness = metrics.Endpoint.parse(f"http://127.0.0.1:{port}/healthz")
        runner = await metrics.serve(metrics=endpoint, liveness=liveness)
        try:
            base = f"http://127.0.0.1:{port}"
            return await asyncio.to_thread(http_get, base + "/metrics"), await asyncio.to_thread(
                http_get, base + "/healthz"
            )
        finally:
            await runner.cleanup()

    metrics.set_leader(False)
    text, health = asyncio.run(scrape_both())
    assert "eop_operator_leader 0.0" in text and "# TYPE eop_pipelines gauge" in text
    assert '"leader": false' in health


def test_metrics_listen_only_on_the_address_given() -> None:
    port = free_port()

    async def reach() -> tuple[str, Exception | None]:
        runner = await metrics.serve(
            metrics=metrics.Endpoint("127.0.0.2", port, "/metrics"), liveness=None
        )
        try:
            text = await asyncio.to_thread(http_get, f"http://127.0.0.2:{port}/metrics")
            try:
                await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
            except OSError as exc:
                return text, exc
            return text, None
        finally:
            await runner.cleanup()

    text, elsewhere = asyncio.run(reach())
    assert "eop_operator_leader" in text
    assert isinstance(elsewhere, urllib.error.URLError), "another address answered"


class HealthApi:
    """The API server a health check talks to: the Secret read as scripted, status written."""

    def __init__(self, secret: KubeError | None) -> None:
        self.secret = secret
        self.status: list[dict[str, Any]] = []

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        if self.secret is not None:
            raise self.secret
        return None  # no such Secret

    async def patch(self, *args: Any, subresource: str | None = None) -> Any:
        self.status.append(args[-1])
        return {"metadata": {"namespace": args[2], "name": args[3]}}


def check_once(api: HealthApi, body: dict[str, Any]) -> str:
    """One health check of ``body`` (its driver running) through ``api``; then a scrape."""
    meta = body["metadata"]
    driver = {
        "kind": "Pod",
        "metadata": {"name": f"{meta['name']}-driver-0"},
        "status": {"phase": "Running", "containerStatuses": [_RUNNING]},
    }
    monitor = HealthMonitor(Context.of(OperatorOptions(), api))  # type: ignore[arg-type]

    async def run() -> str:
        pods = {(meta["namespace"], meta["name"]): [driver]}
        await monitor.check(body, HealthMemory(), pods)  # type: ignore[arg-type]
        return await scrape()

    return asyncio.run(run())


def test_failed_health_checks_are_counted_by_kind_in_the_metrics() -> None:
    unavailable = KubeUnavailable(503, "GET secrets: gave up after 6 attempts")
    text = check_once(HealthApi(unavailable), tls_body("kafka-user", "api-down"))
    labels = {"namespace": "ns", "pipeline": "api-down"}
    assert value(text, "eop_health_check_failures_total", **labels, kind="api") == 1
    assert value(text, "eop_health_check_failures_total", **labels, kind="kafka") is None

    api = HealthApi(None)  # the Secret is gone: the offsets cannot be read
    text = check_once(api, tls_body("kafka-user", "no-secret"))
    labels = {"namespace": "ns", "pipeline": "no-secret"}
    assert value(text, "eop_health_check_failures_total", **labels, kind="kafka") == 1
    assert value(text, "eop_health_check_last_success_timestamp_seconds", **labels) is None
    assert "Secret kafka-user does not exist" in str(api.status)


def test_a_good_health_check_is_timestamped_in_the_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def readable(*_: Any) -> Reading:
        return obs(time.time(), part(0, 10, 10))

    monkeypatch.setattr(health_monitor, "read_progress", readable)
    before = time.time()
    text = check_once(HealthApi(None), tls_body("kafka-user", "good"))
    labels = {"namespace": "ns", "pipeline": "good"}
    assert (value(text, "eop_health_check_last_success_timestamp_seconds", **labels) or 0) >= before
    assert value(text, "eop_health_check_failures_total", **labels, kind="kafka") is None


def test_endpoint_urls() -> None:
    assert metrics.Endpoint.parse("http://0.0.0.0:8080/healthz") == metrics.Endpoint(
        "0.0.0.0", 8080, "/healthz"
    )
    with pytest.raises(ValueError, match="HOST:PORT"):
        metrics.Endpoint.parse("tcp://x")


def _driver_pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p-driver-0"}, "status": status}


_RUNNING = {"name": "driver", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
_BACKOFF = {"name": "driver", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}


@pytest.mark.parametrize(
    ("pod", "runs"),
    [
        (None, False),  # suspended, or the StatefulSet scaled to zero
        (_driver_pod(phase="Pending"), False),  # not scheduled or not started
        (_driver_pod(phase="Running", containerStatuses=[_BACKOFF]), False),  # crash loop
        (_driver_pod(phase="Running", containerStatuses=[{"state": {"terminated": {}}}]), False),
        (_driver_pod(phase="Running", containerStatuses=[_RUNNING]), True),
        (_driver_pod(phase="Pending", initContainerStatuses=[_RUNNING]), True),
        (_driver_pod(conditions=[{"type": "Ready", "status": "True"}]), True),
    ],
)
def test_the_operator_refreshes_progress_only_while_no_driver_container_runs(
    pod: dict[str, Any] | None, runs: bool
) -> None:
    assert driver_runs(pod) is runs


def test_the_partitions_progress_held_are_recorded_and_their_loss_is_named() -> None:
    def seen(*committed: int | None) -> Reading:
        return Reading(
            at=0.0,
            partitions=tuple(
                PartitionOffsets("in", p, c, end=9, start=0) for p, c in enumerate(committed)
            ),
        )

    held = held_partitions({}, seen(4, None, 2))
    assert held == {"in": [0, 2]}
    assert lost_progress(held, seen(4, None, 2), "eop.ns.p") is None
    assert held_partitions(held, seen(5, None, 3)) is None  # nothing new: no status write
    assert held_partitions(held, seen(5, 1, 3)) == {"in": [0, 1, 2]}
    # Expired or deleted: named, with the way out.
    message = lost_progress(held, seen(None, None, 3), "eop.ns.p")
    assert message is not None
    assert "eop.ns.p has no committed offset for in-0, which it held before" in message
    assert "--reset-offsets --group eop.ns.p" in message


def refused_body(spec: dict[str, Any], stable: dict[str, Any] | None) -> dict[str, Any]:
    """A pipeline whose spec the operator refused (Invalid); ``stable``: the spec that ran."""
    body = tls_body("kafka-user", "refused")
    body["spec"] = spec
    body["status"] = {"phase": "Invalid", "transactionalIdPrefix": "ids-in-use"}
    if stable is not None:
        body["status"]["lastStableSpec"] = stable
    return body


@pytest.mark.parametrize("cause", ["another identity", "does not load"])
def test_a_refused_spec_keeps_the_progress_of_the_spec_that_last_ran(
    monkeypatch: pytest.MonkeyPatch, cause: str
) -> None:
    ran = {**tls_body("kafka-user")["spec"], "transactions": {"idPrefix": "ids-in-use"}}
    refused = {**ran, "transactions": {"idPrefix": "new-ids"}}
    if cause == "does not load":
        refused = {**ran, "sink": {}}
    kept: list[Any] = []

    async def access(_client: Any, pipeline: Any) -> str:
        return "access"

    async def keep(_access: Any, pipeline: Any, identity: Any, schedule: Any) -> None:
        assert identity.transactional_id_prefix == pipeline.spec.transactions.id_prefix
        kept.append(pipeline)

    async def no_lag_check(*_: Any) -> Reading:
        raise AssertionError("a refused spec's lag was checked")

    monkeypatch.setattr(health_monitor, "kafka_access", access)
    monkeypatch.setattr(health_monitor, "keep_progress_alive", keep)
    monkeypatch.setattr(health_monitor, "read_progress", no_lag_check)
    monitor = HealthMonitor(Context.of(OperatorOptions(), HealthApi(None)))  # type: ignore[arg-type]

    def check(body: dict[str, Any]) -> None:
        asyncio.run(monitor.check(body, HealthMemory(), {}))  # no driver pod

    check(refused_body(refused, ran))
    assert [p.spec.transactions.id_prefix for p in kept] == ["ids-in-use"]
    kept.clear()
    check(refused_body(refused, None))  # nothing ever ran: no progress to keep
    assert kept == []
