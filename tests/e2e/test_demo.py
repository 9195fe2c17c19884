"""The ``make demo`` scenario as a test, twice in a row on the same cluster.

Each run: two pipelines, a force-deleted driver pod, a driver container SIGKILLed through
containerd, a mid-stream query upgrade; then exactly-once outputs for read_committed readers
and never two driver pods of one pipeline at once.  After the first run, ``eop verify`` (as
``make demo`` ends) finds both pipelines clean.  The second run starts where the first
left off, as ``make demo`` run again does: the first run's pipelines still run (against a
broker that is gone) and their checkpoint claims are still there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from demo import run as demo
from tests.e2e.conftest import E2ECluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _scenario(
    local_cluster: E2ECluster, work_dir: Path, *, duration: float, disruptions: bool
) -> None:
    """One run with a broker of its own (as each ``make demo`` has): exactly once, by the demo's
    own check and, after a run with disruptions, by ``eop verify`` on both pipelines."""
    images = demo.Images(local_cluster.operator_image, local_cluster.spark_image)
    broker = demo.start_broker(work_dir / "kafka")
    try:
        outcome = demo.run_scenario(
            local_cluster.cluster,
            broker,
            images,
            rate=800,
            duration=duration,
            container_kill=disruptions,
            operator_kill=disruptions,
        )
        verified = demo.eop_verify(local_cluster.cluster) if disruptions else {}
    finally:
        broker.stop()
    for code, report in verified.values():
        assert code == 0, report
        assert "OK: the sink holds exactly the output recomputed" in report, report
    if disruptions:
        assert "record-wise" in verified[demo.CLEAN][1]
        assert "output mode update): the last value per key" in verified[demo.COUNT][1]
    v = outcome.verification
    print(v.table())
    assert v.produced > 10_000
    assert v.duplicates == 0, v.table()
    assert v.missing == 0, v.table()
    assert v.unexpected == 0, v.table()
    assert v.clean_records == v.expected_clean, v.table()
    assert v.window_diffs == 0, v.table()
    assert all(e == c for e, c in v.per_campaign.values()), v.table()
    assert outcome.max_clean_drivers == 1, outcome
    assert outcome.max_count_drivers == 1, outcome


def test_demo_scenario_is_exactly_once_twice_in_a_row(
    local_cluster: E2ECluster, tmp_path: Path
) -> None:
    cluster = local_cluster.cluster
    images = demo.Images(local_cluster.operator_image, local_cluster.spark_image)
    demo.install_operator(cluster, images, tmp_path)
    try:
        _scenario(local_cluster, tmp_path / "first", duration=60, disruptions=True)
        # Again at once: the first run's pipelines, drivers and claims are still there.
        _scenario(local_cluster, tmp_path / "second", duration=20, disruptions=False)
        # What ``make demo`` does before it stops the cluster: none of it comes back with the
        # cluster's next start to hold the node's cores.
        demo.remove_workloads(cluster)
        left = cluster.kubectl("get", "eop,pods,pvc", "-n", demo.NAMESPACE, "-o", "name")
        assert left.returncode == 0 and not left.stdout.strip(), left.stdout + left.stderr
    finally:
        cluster.kubectl(
            "delete", "eop", "--all", "-n", demo.NAMESPACE, "--wait=true", "--timeout=120s"
        )
        cluster.helm("uninstall", demo.RELEASE, "-n", demo.OPERATOR_NAMESPACE, "--wait")
