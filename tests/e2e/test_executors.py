"""Executors as pods on the local cluster: hardened, authenticated, exactly once when one dies.

A partitioned pipeline with ``spark.master: k8s://...`` and two executors, run by the operator
installed with its chart, against the real broker while a producer writes. The driver creates
its executor pods from the operator's template (only with the driver RBAC the operator binds);
the test reads their hardening from the API server, proves the partitioned tasks commit in the
executors' JVMs (each logs the transactional ids it holds), force-deletes one executor pod
mid-stream and checks the sink: 0 duplicates, 0 missing for a ``read_committed`` reader. A
client without the pipeline's RPC key (none, or a wrong one) is refused by the driver's RPC
endpoint; the same client with the key is let in, so the refusals are the key's doing.

The single-node cluster has no pod network: driver and executors run on the node's network
(``driver.hostNetwork``); the spread over nodes is left to the multi-node cluster.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from eop_operator.render.executors import RPC_SECURITY_CONF
from tests.e2e.conftest import E2ECluster
from tests.e2e.test_cluster import (
    _describe,
    _driver_pod,
    _eventually,
    _get,
    _operator,
    _pipeline,
    _produce,
    _read_committed,
    _termination_messages,
)
from tests.plugins.kafka import TopicFactory

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

EXECUTORS = 2
#: Records written before the pipeline starts, and while it runs (in ``BURSTS`` bursts).
BEFORE, DURING, BURSTS = 400, 2000, 20
#: Each executor asks for a quarter core: driver, two executors and the operator share 2 cores.
EXECUTOR_CPU = "250m"
#: The driver endpoint executors register with.
ENDPOINT = "CoarseGrainedScheduler"


def _executor_pods(e2e: E2ECluster, ns: str, pipeline: str) -> list[dict[str, Any]]:
    selector = f"exactlyonce.io/pipeline={pipeline},app.kubernetes.io/component=executor"
    return list(_get(e2e, "pods", "-n", ns, "-l", selector).get("items", []))


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in pod["spec"]["containers"][0].get("env", [])}


class Producer(threading.Thread):
    """Writes ``DURING`` records in ``BURSTS`` bursts while the test goes on."""

    def __init__(self, broker: KafkaBroker, topic: str, pause: float) -> None:
        super().__init__(name="e2e-producer", daemon=True)
        self.broker, self.topic, self.pause = broker, topic, pause
        self.records = [(f"d{i}", f"v{i}") for i in range(DURING)]
        self.error: BaseException | None = None

    def run(self) -> None:
        size = DURING // BURSTS
        try:
            for start in range(0, DURING, size):
                _produce(self.broker, self.topic, self.records[start : start + size])
                time.sleep(self.pause)
        except BaseException as exc:  # reported by the test
            self.error = exc


def probe_spark_rpc(address: tuple[str, int], key: str | None) -> str | None:
    """Ask the driver's RPC endpoint for its scheduler as a Spark client would.

    ``key``: the RPC key to authenticate with (as Spark uses it: the base64 of the key file),
    None for a client without authentication. Returns None when the driver answered, else
    the error. A JVM of the test's own pyspark, no SparkContext: Spark's RpcEnv in client mode.
    """
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(SparkConf().set("spark.ui.enabled", "false"))
    try:
        jvm = gateway.jvm
        conf = jvm.org.apache.spark.SparkConf(False)
        for name, value in {
            "spark.rpc.askTimeout": "15s",
            "spark.rpc.lookupTimeout": "15s",
            "spark.network.timeout": "15s",
        }.items():
            conf.set(name, value)
        if key is not None:  # the settings the operator gives driver and executors
            for name, value in {**RPC_SECURITY_CONF, "spark.authenticate.secret": key}.items():
                conf.set(name, value)
        config = getattr(getattr(jvm.org.apache.spark.internal.config, "package$"), "MODULE$")
        security = jvm.org.apache.spark.SecurityManager(
            conf, jvm.scala.Option.empty(), config.AUTH_SECRET_FILE()
        )
        env = jvm.org.apache.spark.rpc.RpcEnv.create(
            "eop-probe", "127.0.0.1", 0, conf, security, True
        )
        try:
            target = jvm.org.apache.spark.rpc.RpcAddress(address[0], address[1])
            env.setupEndpointRef(target, ENDPOINT)
            return None
        except Py4JJavaError as exc:  # the client was refused: say why, innermost cause first
            causes, cause = [], exc.java_exception
            while cause is not None:
                causes.append(str(cause.toString()))
                cause = cause.getCause()
            return " <- ".join(reversed(causes))[:400]
        finally:
            env.shutdown()
    finally:
        gateway.shutdown()
        gateway.proc.kill()


def test_executors_run_as_hardened_pods_and_commit_exactly_once(
    local_cluster: E2ECluster,
    e2e_namespace: str,
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    e2e, ns, name = local_cluster, e2e_namespace, "wide"
    cluster = e2e.cluster
    began = time.monotonic()
    with _operator(e2e, ns, tmp_path) as (ops_ns, operator_pod):
        source = kafka_topic_factory(4, prefix="e2e-exec-in")
        sink = kafka_topic_factory(2, prefix="e2e-exec-out")
        before = [(f"b{i}", f"v{i}") for i in range(BEFORE)]
        _produce(kafka_broker, source, before)
        manifest = _pipeline(name, ns, kafka_broker.bootstrap_servers, source, sink)
        spec = manifest["spec"]
        spec["sink"]["kafka"]["commitMode"] = "partitioned"
        spec["spark"] = {
            "master": f"k8s://https://127.0.0.1:{cluster.apiserver_port}",
            "driver": {"cores": 1, "memory": "512m"},
            "executor": {"instances": EXECUTORS, "cores": 1, "memory": "512m"},
        }
        spec["executor"] = {"resources": {"requests": {"cpu": EXECUTOR_CPU}}}
        cluster.apply(manifest)

        def diagnostics() -> str:
            driver = _driver_pod(e2e, ns, name)
            logs = cluster.kubectl("logs", "-n", ns, f"{name}-driver-0", "--tail=60").stdout
            executors = ""
            for pod in _executor_pods(e2e, ns, name):
                pod_name = pod["metadata"]["name"]
                tail = cluster.kubectl("logs", "-n", ns, pod_name, "--tail=30").stdout
                executors += f"\n--- {pod_name} ({pod['status'].get('phase')}):\n{tail}"
            operator = cluster.kubectl("logs", "-n", ops_ns, operator_pod, "--tail=30").stdout
            status = _get(e2e, "eop", name, "-n", ns).get("status")
            return (
                f"\n--- status: {json.dumps(status)}"
                f"\n--- driver: {_termination_messages(driver)}\n{logs}{executors}"
                f"\n--- operator:\n{operator}\n--- describe:\n{_describe(e2e, ns, 'pods')}"
            )

        # 1. The driver starts its executors: two pods, built from the operator's template.
        pods = _eventually(
            lambda: len(p := _running(_executor_pods(e2e, ns, name))) == EXECUTORS and p,
            240,
            lambda: f"{EXECUTORS} executor pods Running" + diagnostics(),
        )
        print(f"applied -> {EXECUTORS} executors Running in {time.monotonic() - began:.1f}s")
        driver = _driver_pod(e2e, ns, name)
        for pod in pods:
            spec_ = pod["spec"]
            (container,) = spec_["containers"]
            security = spec_["securityContext"]
            assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000
            assert security["seccompProfile"] == {"type": "RuntimeDefault"}
            hardened = container["securityContext"]
            assert hardened["readOnlyRootFilesystem"] is True
            assert hardened["allowPrivilegeEscalation"] is False
            assert hardened["capabilities"]["drop"] == ["ALL"]
            # No API token in an executor; the driver's, which makes pods, stays with it.
            assert spec_["automountServiceAccountToken"] is False
            assert not [m for m in container["volumeMounts"] if "serviceaccount" in m["mountPath"]]
            # Spark's RPC key reaches it as a file, never in the pod's spec.
            assert "_SPARK_AUTH_SECRET" not in _env(pod)
            rpc = [
                v
                for v in spec_["volumes"]
                if v.get("secret", {}).get("secretName") == f"{name}-spark-rpc"
            ]
            assert rpc, spec_["volumes"]
            assert container["resources"]["requests"]["cpu"] == EXECUTOR_CPU
            assert container["resources"]["limits"]["memory"] == f"{512 + 384}Mi"
            # Owned by the driver pod: they go with it.
            owners = pod["metadata"]["ownerReferences"]
            assert [o["uid"] for o in owners] == [driver["metadata"]["uid"]]
            assert container["args"] == ["executor"]

        # 2. /scale and the status report the executors of the running driver.
        status = _eventually(
            lambda: (
                (s := _get(e2e, "eop", name, "-n", ns).get("status", {})).get("executors")
                == EXECUTORS
                and s
            ),
            120,
            lambda: "status.executors" + diagnostics(),
        )
        assert status["executorSelector"].endswith(f"exactlyonce.io/pipeline={name}")

        # 3. Spark RPC refuses a client without the key, or with another one; with it, it answers.
        driver_url = _env(pods[0])["SPARK_DRIVER_URL"]["value"]  # spark://Name@host:port
        host, port = driver_url.rsplit("@", 1)[1].rsplit(":", 1)
        secret = _get(e2e, "secret", f"{name}-spark-rpc", "-n", ns)
        key = secret["data"]["key"]
        wrong = "A" * len(key)
        answers = {what: probe_spark_rpc((host, int(port)), k) for what, k in
                   (("no key", None), ("wrong key", wrong), ("the key", key))}  # fmt: skip
        print(f"Spark RPC at {host}:{port}: {answers}")
        assert answers["the key"] is None, answers
        assert answers["no key"] is not None and answers["wrong key"] is not None, answers

        # 4. A producer writes throughout; an executor pod dies mid-stream.
        producer = Producer(kafka_broker, source, pause=1.0)
        producer.start()
        first = _read_committed(kafka_broker, sink, 1, timeout=180, settle=0)
        assert first, "no output" + diagnostics()
        victim = pods[0]["metadata"]["name"]
        killed_at = time.monotonic()
        cluster.kubectl(
            "delete", "pod", victim, "-n", ns, "--grace-period=0", "--force", check=True
        )
        replaced = _eventually(
            lambda: (
                len(p := _running(_executor_pods(e2e, ns, name))) == EXECUTORS
                and victim not in {x["metadata"]["name"] for x in p}
                and p
            ),
            180,
            lambda: f"a new executor for {victim}" + diagnostics(),
        )
        print(f"executor {victim} force-deleted -> replaced in {time.monotonic() - killed_at:.1f}s")
        producer.join(120)
        assert producer.error is None, producer.error

        # 5. Exactly once for a read_committed reader.
        expected = before + producer.records
        seen = _read_committed(kafka_broker, sink, len(expected), timeout=300, settle=10)
        counts = Counter(seen)
        duplicates = {r: n for r, n in counts.items() if n > 1}
        missing = set(expected) - set(counts)
        assert not missing and not duplicates and set(counts) == set(expected), (
            f"sink not exactly-once: {len(missing)} missing, {len(duplicates)} duplicated"
            + diagnostics()
        )
        print(f"{len(expected)} records exactly once, {time.monotonic() - began:.1f}s after apply")

        # 6. The partitioned tasks committed in the executors' JVMs: each says which of the
        # pipeline's transactional ids its producers hold; the driver, where they would run.
        held: dict[str, str] = {}
        for pod in [*replaced, *pods]:
            pod_name = pod["metadata"]["name"]
            logs = cluster.kubectl("logs", "-n", ns, pod_name).stdout
            for line in logs.splitlines():
                if (
                    f"eop.{ns}.{name}.{source}." in line
                    and "transactional producer in executor" in line
                ):
                    held[line.split(": transactional producer")[0].rsplit(" ", 1)[-1]] = pod_name
        assert held, "no executor logged a transactional producer" + diagnostics()
        driver_logs = cluster.kubectl("logs", "-n", ns, f"{name}-driver-0").stdout
        assert "tasks commit in the executors' JVM" in driver_logs
        print(f"transactional ids held in executors: {held}")
