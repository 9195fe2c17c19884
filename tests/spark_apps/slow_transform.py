"""A record-wise Python transform that takes its time (so a batch is in flight when signalled)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: Seconds spent per record.
DELAY = 0.002


def slow_upper(source: DataFrame) -> DataFrame:
    """Upper-case the value, slowly; keeps every other column (partitioned mode)."""
    from pyspark.sql import functions as F

    @F.udf("string")
    def slow(value: str | None) -> str | None:
        time.sleep(DELAY)
        return None if value is None else value.upper()

    return source.withColumn("value", slow(F.col("value").cast("string")))
