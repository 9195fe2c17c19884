"""The keep-alive's reading of the sink cluster's offsets retention, on a real replicated cluster.

Kafka expires a member-less group's offsets ``offsets.retention.minutes`` after their last
commit (invariant 6): the runner's and the operator's keep-alive refresh the progress group
within the smallest retention any broker of the cluster has (any broker may become the group's
coordinator). Read wrong, a retention shorter than the fallback interval loses the progress.
The operator's keep-alive calls the same function (``eop_spark.operator_access``).
"""

from __future__ import annotations

import pytest

from devenv.kafka_cluster import KafkaCluster
from eop_spark.exactly_once.keep_alive import (
    REFRESHES_PER_RETENTION,
    offsets_retention_ms,
    refresh_interval_s,
)
from tests.plugins.kafka import CLUSTER_RETENTION_MINUTES

pytestmark = pytest.mark.kafka


def test_the_retention_read_is_the_smallest_of_every_broker(kafka_cluster: KafkaCluster) -> None:
    smallest_ms = min(CLUSTER_RETENTION_MINUTES.values()) * 60_000
    retention = offsets_retention_ms(kafka_cluster.client_config())
    assert retention == smallest_ms
    assert refresh_interval_s(retention) == smallest_ms / 1000 / REFRESHES_PER_RETENTION
