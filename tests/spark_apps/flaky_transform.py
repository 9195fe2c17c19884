"""A record-wise Python transform whose first pass over one record fails (transiently)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: The runner's environment names a file; the first task to reach the source offset in
#: ``<file>.offset`` creates the file and fails, as a source fetch timeout would.
FAIL_ONCE_ENV = "EOP_TEST_FAIL_ONCE"


def fail_once(source: DataFrame) -> DataFrame:
    """Keep every column, drop records valued ``skip``; fail at the offset once, retryably."""
    from pyspark.sql import functions as F

    marker = Path(os.environ[FAIL_ONCE_ENV])
    at = int(Path(f"{marker}.offset").read_text())

    @F.udf("string")
    def value_or_failure(value: bytes | None, offset: int) -> str | None:
        if offset == at and not marker.exists():
            from eop_spark.contract.errors import SinkRetryable

            marker.touch()
            raise SinkRetryable(f"injected upstream failure at offset {offset}")
        return None if value is None else value.decode()

    kept = source.where(F.col("value") != F.lit(b"skip"))
    return kept.withColumn("value", value_or_failure(F.col("value"), F.col("offset")))
