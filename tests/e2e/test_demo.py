"""The ``make demo`` scenario as a test: two pipelines, a force-deleted driver pod, a driver
container SIGKILLed through containerd, a mid-stream query upgrade; then exactly-once outputs
for read_committed readers and never two driver pods of one pipeline at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from demo import run as demo
from devenv.kafka import KafkaBroker
from tests.e2e.conftest import E2ECluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def demo_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker with the demo's topics, stopped after the test."""
    broker = demo.start_broker(tmp_path / "kafka")
    yield broker
    broker.stop()


def test_demo_scenario_is_exactly_once(
    local_cluster: E2ECluster, demo_broker: KafkaBroker, tmp_path: Path
) -> None:
    cluster = local_cluster.cluster
    images = demo.Images(local_cluster.operator_image, local_cluster.spark_image)
    demo.install_operator(cluster, images, tmp_path)
    try:
        outcome = demo.run_scenario(
            cluster,
            demo_broker,
            images,
            rate=800,
            duration=60,
            container_kill=True,
            operator_kill=True,
        )
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
    finally:
        cluster.kubectl(
            "delete", "eop", "--all", "-n", demo.NAMESPACE, "--wait=true", "--timeout=120s"
        )
        cluster.helm("uninstall", demo.RELEASE, "-n", demo.OPERATOR_NAMESPACE, "--wait")
