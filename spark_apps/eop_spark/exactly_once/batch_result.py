"""What a sink did with one micro-batch: the value every sink returns to the runner.

The runner logs it (:mod:`eop_spark.runtime.batch_log`) and counts it
(:mod:`eop_spark.runtime.metrics`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from eop_spark.contract.offsets import Offsets, to_spark_json


class BatchStatus:
    """How the sink handled a batch."""

    COMMITTED = "committed"  #: output and progress committed in this run
    SKIPPED = "skipped"  #: G already held the whole batch: a replay, nothing produced
    PARTIAL_REPLAY = "partial-replay"  #: some partitions were visible already, the rest committed


@dataclass
class BatchResult:
    """What the sink did with one micro-batch (``rows_in``: from Spark's batch report)."""

    batch_id: int
    mode: str
    status: str
    rows_out: int
    offsets: Offsets
    txn_ms: float
    transactions: int = 0
    skipped_partitions: int = 0
    fenced: int = 0
    aborted: int = 0
    rows_in: int | None = None
    committed_at: float = field(default_factory=time.time)

    def fields(self) -> dict[str, Any]:
        """The log fields of this batch (offsets as Spark's JSON string)."""
        data = asdict(self)
        data["offsets"] = to_spark_json(self.offsets)
        data["txn_ms"] = round(self.txn_ms, 1)
        data["committed_at"] = round(self.committed_at, 3)
        return data
