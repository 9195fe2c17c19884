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

import time
from pathlib import Path

import pytest

from devenv.kafka import KafkaBroker
from tests.e2e.conftest import E2ECluster
from tests.e2e.executor_pods import (
    assert_hardened,
    container_env,
    executor_pods,
    ids_held_by_executors,
    pipeline_diagnostics,
    running,
)
from tests.e2e.records import BurstProducer, exactly_once_failure
from tests.e2e.spark_rpc_probe import probe_keys, probe_spark_rpc
from tests.e2e.test_cluster import (
    _driver_pod,
    _eventually,
    _get,
    _operator,
    _pipeline,
    _produce,
    _read_committed,
)
from tests.plugins.kafka import TopicFactory

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]

EXECUTORS = 2
#: Records written before the pipeline starts, and while it runs (in ``BURSTS`` bursts).
BEFORE, DURING, BURSTS = 400, 2000, 20
#: Each executor asks for a quarter core: driver, two executors and the operator share 2 cores.
EXECUTOR_CPU = "250m"


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
            return pipeline_diagnostics(e2e, ns, name, (ops_ns, operator_pod))

        # 1. The driver starts its executors: two pods, built from the operator's template.
        pods = _eventually(
            lambda: len(p := running(executor_pods(e2e, ns, name))) == EXECUTORS and p,
            240,
            lambda: f"{EXECUTORS} executor pods Running" + diagnostics(),
        )
        print(f"applied -> {EXECUTORS} executors Running in {time.monotonic() - began:.1f}s")
        driver = _driver_pod(e2e, ns, name)
        for pod in pods:
            assert_hardened(
                pod,
                name,
                driver_uid=driver["metadata"]["uid"],
                cpu=EXECUTOR_CPU,
                memory=f"{512 + 384}Mi",
            )

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
        driver_url = container_env(pods[0])["SPARK_DRIVER_URL"]["value"]  # spark://Name@host:port
        host, port = driver_url.rsplit("@", 1)[1].rsplit(":", 1)
        secret = _get(e2e, "secret", f"{name}-spark-rpc", "-n", ns)
        answers = probe_spark_rpc((host, int(port)), probe_keys(secret["data"]["key"]))
        print(f"Spark RPC at {host}:{port}: {answers}")
        assert answers["the key"] is None, answers
        assert answers["no key"] is not None and answers["wrong key"] is not None, answers

        # 4. A producer writes throughout; an executor pod dies mid-stream.
        during = [(f"d{i}", f"v{i}") for i in range(DURING)]
        producer = BurstProducer(kafka_broker, source, during, bursts=BURSTS, pause=1.0)
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
                len(p := running(executor_pods(e2e, ns, name))) == EXECUTORS
                and victim not in {x["metadata"]["name"] for x in p}
                and p
            ),
            180,
            lambda: f"a new executor for {victim}" + diagnostics(),
        )
        print(f"executor {victim} force-deleted -> replaced in {time.monotonic() - killed_at:.1f}s")
        producer.finish(120)

        # 5. Exactly once for a read_committed reader.
        expected = before + producer.records
        seen = _read_committed(kafka_broker, sink, len(expected), timeout=300, settle=10)
        failure = exactly_once_failure(seen, expected)
        assert failure is None, failure + diagnostics()
        print(f"{len(expected)} records exactly once, {time.monotonic() - began:.1f}s after apply")

        # 6. The partitioned tasks committed in the executors' JVMs: each says which of the
        # pipeline's transactional ids its producers hold; the driver, where they would run.
        held = ids_held_by_executors(e2e, ns, f"eop.{ns}.{name}.{source}.", [*replaced, *pods])
        assert held, "no executor logged a transactional producer" + diagnostics()
        driver_logs = cluster.kubectl("logs", "-n", ns, f"{name}-driver-0").stdout
        assert "tasks commit in the executors' JVM" in driver_logs
        print(f"transactional ids held in executors: {held}")
