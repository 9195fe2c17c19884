"""Scale-out benchmark: one partitioned pipeline in one pod against two executors on two nodes,
its checkpoint on a volume against S3, and recovery from executor and node loss.

Everything runs on the multi-node local cluster (``devenv.cluster --nodes 3``: real kubelets,
a pod network), with the operator installed from the chart, a Kafka broker and a SeaweedFS
server on the machine's loopback that pods reach through the cluster's gateway (the
environment of ``tests/e2e/test_scale_out.py``: ``tests/e2e/pipelines_on_nodes.py``).

Throughput. One input topic of 4 partitions holds ``--records`` records of 100 B. The same
partitioned pipeline (``SELECT key, value FROM source``, ``maxOffsetsPerTrigger`` a
twentieth of the input, a 200 ms trigger) copies it to a fresh topic, once per round in each
of three set-ups, in a rotating order:

  (A) ``local[2]`` in the driver pod, checkpoint on a volume (the node's disk);
  (B) ``local[2]`` in the driver pod, checkpoint in the S3 bucket;
  (C) ``k8s://`` with 2 executors of 1 core on 2 nodes, checkpoint in the S3 bucket.

A set-up's rate is the records its batches read after the first batch, divided by the time
from the first batch's commit to the last one's (the driver's batch log): what a running
pipeline sustains, start-up and the first batch's compilation left out. C/B is what the
executors cost or gain; B/A what the object store costs. Each set-up keeps its best and its
median round.

Recovery. Set-up C runs on a topic a producer writes 400 records a second to; then, in turn,
an executor pod is force-deleted, an executor's node is lost, and the driver's node is lost
(``node-lose``: link cut, every process SIGKILLed, the node tainted out-of-service), each
followed by the node's restore. For each: the seconds from the loss to the next committed
batch (every partition of the progress group past where it stood at the loss).

    EOP_NODES_CLUSTER_DIR=/tmp/nodes .venv/bin/python -m bench.scale_out
    .venv/bin/python -m bench.scale_out --records 100000 --rounds 1    # a quick look

It starts the cluster if it is not running (and leaves it as it found it), builds and
imports the images, and prints the machine's load average at the start and the end: on a
shared machine, say what else ran. The figures and how to read them: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "spark_apps"), str(REPO / "operator")]

from confluent_kafka import Producer  # noqa: E402

from demo.run import progress_offsets  # noqa: E402
from devenv.cluster import LocalCluster  # noqa: E402
from devenv.kafka import KafkaBroker  # noqa: E402
from devenv.podnet import GATEWAY  # noqa: E402
from devenv.s3 import S3Server, s3a_jars  # noqa: E402
from tests.e2e.conftest import E2ECluster  # noqa: E402
from tests.e2e.executor_pods import executor_pods, running  # noqa: E402
from tests.e2e.pipelines_on_nodes import (  # noqa: E402
    EXECUTORS,
    Check,
    ScaleOut,
    batch_committed_since,
    first_held,
    node_of,
    restore_lost_nodes,
    scale_out_environment,
    then,
    wait_caught_up,
)
from tests.e2e.test_cluster import _driver_pod  # noqa: E402

#: Set-up name -> (spark master, checkpoint in the bucket).
SETUPS = {
    "A local[2], volume": ("local[2]", False),
    "B local[2], S3": ("local[2]", True),
    "C 2 executors, S3": ("k8s", True),
}
RECORD_BYTES = 100
TRIGGER = "200ms"
#: A set-up's start and its copy of the input, and a recovery, are bounded by these.
RUN_TIMEOUT = 900.0
RECOVERY_TIMEOUT = 300.0
#: The recovery phase's producer: records per second, written every 0.25 s.
FEED_RATE = 400


def log(message: str) -> None:
    """One progress line on stderr."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def fill(broker: KafkaBroker, topic: str, records: int) -> None:
    """``records`` records of RECORD_BYTES, keyed, spread over the topic's partitions."""
    producer = Producer(broker.client_config({"linger.ms": 50, "enable.idempotence": True}))
    pad = "x" * (RECORD_BYTES - 12)
    for i in range(records):
        while True:
            try:
                producer.produce(topic, key=f"k{i:09d}".encode(), value=f"{pad}{i:012d}".encode())
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.05)
    assert producer.flush(120) == 0


def manifest(so: ScaleOut, name: str, setup: str, source: str, sink: str, per_batch: int) -> Any:
    """The partitioned pipeline of ``setup``."""
    master, in_s3 = SETUPS[setup]
    pipeline = so.pipeline(name, source, sink)
    spec = pipeline["spec"]
    spec["sink"]["kafka"]["commitMode"] = "partitioned"
    spec["trigger"] = {"processingTime": TRIGGER}
    if per_batch:
        spec["source"]["kafka"]["maxOffsetsPerTrigger"] = per_batch
    if master != "k8s":
        spec["spark"] = {"master": master, "driver": {"cores": 2, "memory": "1g"}}
        spec["driver"] = {"resources": {"requests": {"cpu": "500m"}}}
        spec.pop("executor", None)
    if not in_s3:
        spec.pop("checkpoint")  # a claim of the cluster's default class: the node's disk
    return pipeline


def driver_batches(so: ScaleOut, name: str) -> list[dict[str, Any]]:
    """The batch records the driver logged (``--log-format json``)."""
    logs = so.cluster.kubectl("logs", "-n", so.ns, f"{name}-driver-0").stdout
    batches = []
    for line in logs.splitlines():
        if line.startswith("{") and '"event": "batch"' in line:
            batches.append(json.loads(line))
    return batches


def sustained_rate(batches: list[dict[str, Any]]) -> float:
    """Records per second from the first batch's commit to the last's."""
    if len(batches) < 3:
        return float("nan")
    span = batches[-1]["committed_at"] - batches[0]["committed_at"]
    return sum(int(b.get("rows_in") or 0) for b in batches[1:]) / span


def delete(so: ScaleOut, name: str) -> None:
    """Delete a pipeline and wait for it (its driver and executors) to be gone."""
    so.cluster.kubectl("delete", "eop", name, "-n", so.ns, "--wait=true", "--timeout=120s")
    so.cluster.kubectl(
        "wait", "--for=delete", "pods", "-n", so.ns, "-l", f"exactlyonce.io/pipeline={name}",
        "--timeout=120s",
    )  # fmt: skip


def copy_once(so: ScaleOut, setup: str, source: str, records: int) -> float:
    """One round of ``setup``: copy the input; its sustained rate."""
    name = f"copy-{uuid.uuid4().hex[:6]}"
    sink = f"{name}-out"
    so.broker.create_topic(sink, 4)
    began = time.monotonic()
    so.cluster.apply(manifest(so, name, setup, source, sink, max(1, records // 20)))
    try:
        wait_caught_up(so, name, source, RUN_TIMEOUT)
        batches = [b for b in driver_batches(so, name) if b.get("rows_in")]
        rate = sustained_rate(batches)
        log(
            f"{setup}: {len(batches)} batches, {rate:,.0f} records/s "
            f"({time.monotonic() - began:.0f}s with start-up)"
        )
        return rate
    finally:
        delete(so, name)


class Feed(threading.Thread):
    """Writes FEED_RATE records a second to ``topic`` until ``stopping`` is set."""

    def __init__(self, broker: KafkaBroker, topic: str) -> None:
        """Prepare; :meth:`start` begins writing."""
        super().__init__(name="feed", daemon=True)
        self.broker, self.topic = broker, topic
        self.stopping = threading.Event()

    def run(self) -> None:
        """Write until stopped; flush."""
        producer = Producer(self.broker.client_config({"enable.idempotence": True}))
        n = 0
        while not self.stopping.wait(0.25):
            for _ in range(FEED_RATE // 4):
                producer.produce(self.topic, key=f"f{n}".encode(), value=b"x" * RECORD_BYTES)
                n += 1
            producer.poll(0)
        producer.flush(30)


def recoveries(so: ScaleOut) -> dict[str, float]:
    """Set-up C under a steady feed: seconds from each loss to the next committed batch."""
    name = "recovery"
    source, sink = f"{name}-{uuid.uuid4().hex[:6]}-in", f"{name}-out"
    so.broker.create_topic(source, 4)
    so.broker.create_topic(sink, 4)
    feed = Feed(so.broker, source)
    feed.start()
    group = f"eop.{so.ns}.{name}"
    so.cluster.apply(manifest(so, name, "C 2 executors, S3", source, sink, 0))
    results: dict[str, float] = {}

    def driver_replaced(uid: str) -> bool:
        pod = _driver_pod(so.e2e, so.ns, name)
        running_ = pod.get("status", {}).get("phase") == "Running"
        return bool(pod) and pod["metadata"]["uid"] != uid and running_

    try:
        first_held(
            {
                "executors": lambda: len(running(executor_pods(so.e2e, so.ns, name))) == EXECUTORS,
                "a batch": batch_committed_since(so.broker, group, source, {}),
            },
            RUN_TIMEOUT,
            lambda: "the recovery pipeline running",
        )

        def committed_from_now() -> Check:
            return batch_committed_since(
                so.broker, group, source, progress_offsets(so.broker, group, source)
            )

        def lose(what: str, act: Callable[[], object], driver: str = "") -> None:
            """``act``; the seconds to the next committed batch (with ``driver``, the uid of
            the driver pod lost: a batch its replacement committed)."""
            time.sleep(10)  # a steady state first
            wait_caught_up(so, name, source, RECOVERY_TIMEOUT)
            at_loss = progress_offsets(so.broker, group, source)
            began = time.monotonic()
            act()
            batch = batch_committed_since(so.broker, group, source, at_loss)
            if driver:
                # The old driver's executors may still commit the batch in flight.
                batch = then(lambda: driver_replaced(driver), committed_from_now)
            held = first_held(
                {"batch": batch},
                RECOVERY_TIMEOUT,
                lambda: f"a batch after {what}",
                since=began,
            )
            results[what] = held["batch"]
            log(f"{what}: next committed batch after {held['batch']:.1f}s")
            restore_lost_nodes(so.cluster)
            first_held(
                {
                    "executors": lambda: (
                        len(running(executor_pods(so.e2e, so.ns, name))) == EXECUTORS
                    )
                },
                RECOVERY_TIMEOUT,
                lambda: f"{EXECUTORS} executors after {what}",
            )

        victim = running(executor_pods(so.e2e, so.ns, name))[0]["metadata"]["name"]
        lose(
            "executor pod deleted",
            lambda: so.cluster.kubectl(
                "delete", "pod", victim, "-n", so.ns, "--grace-period=0", "--force"
            ),
        )
        driver_node = node_of(_driver_pod(so.e2e, so.ns, name))
        node = next(
            node_of(p)
            for p in running(executor_pods(so.e2e, so.ns, name))
            if node_of(p) != driver_node
        )
        lose("executor's node lost", lambda: so.cluster.lose_node(node))
        driver = _driver_pod(so.e2e, so.ns, name)
        lose(
            "driver's node lost",
            lambda: so.cluster.lose_node(node_of(driver)),
            driver["metadata"]["uid"],
        )
        return results
    finally:
        feed.stopping.set()
        feed.join(30)
        restore_lost_nodes(so.cluster)
        delete(so, name)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-recovery", action="store_true", help="throughput only")
    parser.add_argument("--work", type=Path, help="work directory (default: a temp dir)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="eop-bench-scale-out-"))
    load_before = os.getloadavg()
    began = time.monotonic()
    cluster = LocalCluster(nodes=3)
    was_running = cluster.is_running()
    cluster.up(images=False)
    refs = cluster.load_images()
    e2e = E2ECluster(cluster, refs["operator"], refs["spark"], started_here=not was_running)
    s3a_jars()
    broker = KafkaBroker(work / "kafka", cluster_address=GATEWAY).start()
    s3 = S3Server(work / "s3").start()
    rates: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    recovered: dict[str, float] = {}
    try:
        (work / "operator").mkdir(parents=True, exist_ok=True)
        with scale_out_environment(e2e, broker, s3, work / "operator") as so:
            source = f"bench-in-{uuid.uuid4().hex[:6]}"
            broker.create_topic(source, 4)
            fill(broker, source, args.records)
            log(f"{args.records:,} records of {RECORD_BYTES} B in {source}")
            order = list(SETUPS)
            for round_ in range(args.rounds):
                for setup in order[round_ % len(order) :] + order[: round_ % len(order)]:
                    rates[setup].append(copy_once(so, setup, source, args.records))
            if not args.no_recovery:
                recovered = recoveries(so)
    finally:
        broker.stop()
        s3.stop()
        if not was_running:
            cluster.down()
    load_after = os.getloadavg()

    print(f"\nscale-out benchmark: {args.records:,} records of {RECORD_BYTES} B, 4 partitions, "
          f"{args.rounds} round(s), {time.monotonic() - began:.0f}s in all")  # fmt: skip
    print(f"load average at the start {load_before[0]:.1f}, at the end {load_after[0]:.1f}")
    print("\n| set-up | records/s, best round | median round |\n| --- | --- | --- |")
    for setup, values in rates.items():
        print(f"| {setup} | {max(values):,.0f} | {statistics.median(values):,.0f} |")
    best = {setup: max(values) for setup, values in rates.items()}
    a, b, c = (best[s] for s in SETUPS)
    print(f"\nC/B (2 executors on 2 nodes / local[2], both S3): {c / b:.2f}")
    print(f"B/A (S3 / volume, both local[2]): {b / a:.2f}")
    if recovered:
        print("\n| loss (2 executors, S3) | seconds to the next committed batch |\n| --- | --- |")
        for what, seconds in recovered.items():
            print(f"| {what} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
