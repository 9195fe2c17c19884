"""Invariant 1 under chaos: the runner is SIGKILLed at random moments, again and again.

200,000 uniquely keyed records on 4 partitions; the runner process group (driver,
JVM, Python workers) is killed 8 times, including while transactions are open
or committing, and restarted each time.  A read_committed reader must then see
every input's output exactly once, and G must equal the source end offsets
(the scenarios are in ``tests/spark_apps/chaos.py``).
"""

from __future__ import annotations

import pytest

from tests.spark_apps import chaos
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

RECORDS = 200_000
KILLS = 8
#: Offsets per batch: the input must outlast every kill (see kill_repeatedly).
PER_BATCH = 5_000


def test_partitioned_filter_survives_kill_9(make_pipeline: PipelineFactory) -> None:
    chaos.partitioned_filter(
        make_pipeline(), chaos.seeded(), records=RECORDS, kills=KILLS, per_batch=PER_BATCH
    )


def test_coordinated_window_counts_survive_kill_9(make_pipeline: PipelineFactory) -> None:
    chaos.window_counts(
        make_pipeline(), chaos.seeded(), records=RECORDS, kills=KILLS, per_batch=PER_BATCH
    )
