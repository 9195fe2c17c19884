"""Benchmark: the fixed cost of a Python task, with and without the workers' quick ACKs.

Spark's JVM writes a Python task's input (header, Arrow stream, end) in
separate writes on a loopback TCP socket with Nagle's algorithm on, and a
worker that only reads delays its ACKs, so the last write smaller than a
segment can wait for the kernel's 40 ms delayed-ACK timer.  eop's worker
daemon has its workers acknowledge every read at once
(:mod:`eop_spark.speedups.worker_daemon`).  This runs the same ``mapInArrow`` jobs, in
one SparkSession and in alternating rounds, through workers that do
(``quick ACKs``) and through workers that read as pyspark's own do
(``EOP_NO_QUICK_ACK=1``, a second daemon with its own workers), and prints
each one's median job time and the ratio:

- 4 tasks of one row each: what a task costs beyond its rows;
- 4 tasks of 62,500 rows of 100 bytes: one micro-batch of the data-plane
  benchmark (``bench/data_plane.py``) at its 100-byte size.

    .venv/bin/python -m bench.python_tasks [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "spark_apps")]

from eop_spark.contract.run_config import RunConfig  # noqa: E402
from eop_spark.runtime.session import build_session  # noqa: E402
from eop_spark.speedups.worker_daemon import NO_QUICK_ACK_ENV  # noqa: E402

TASKS = 4
#: Rows per task: one, and one task's share of a 1M-record copy in 4 batches.
SIZES = (1, 62_500)
CONTENDERS = ("quick ACKs", "pyspark's reads")


def count_rows(batches: Iterator[Any]) -> Iterator[Any]:
    """The task body: read every Arrow batch, return the row count."""
    import pyarrow as pa  # type: ignore[import-untyped]

    yield pa.RecordBatch.from_pylist([{"rows": sum(b.num_rows for b in batches)}])


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="jobs per contender and size")
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="eop-bench-")
    spark = build_session(
        RunConfig.offline("eop.bench.tasks", work, "SELECT value FROM source"), []
    )
    spark.sparkContext.setLogLevel("ERROR")
    slots = spark.sparkContext.defaultParallelism
    environment = spark.sparkContext.environment
    jobs = {}
    for size in SIZES:
        rows = spark.range(0, TASKS * size, 1, TASKS).selectExpr(
            "cast(repeat('x', 100) as binary) as value"
        )
        for contender in CONTENDERS:
            # A function's workers get the context's environment as it is when it is made;
            # another environment means another daemon, with its own workers.
            environment.pop(NO_QUICK_ACK_ENV, None)
            if contender != CONTENDERS[0]:
                environment[NO_QUICK_ACK_ENV] = "1"
            jobs[size, contender] = rows.mapInArrow(count_rows, "rows long")
    environment.pop(NO_QUICK_ACK_ENV, None)

    times: dict[tuple[int, str], list[float]] = {key: [] for key in jobs}
    for round_ in range(args.rounds + 1):  # round 0 starts the workers: not counted
        for size in SIZES:
            order = CONTENDERS if round_ % 2 else CONTENDERS[::-1]
            for contender in order:
                started = time.perf_counter()
                counted = sum(row.rows for row in jobs[size, contender].collect())
                elapsed = time.perf_counter() - started
                assert counted == TASKS * size, (counted, size)
                if round_:
                    times[size, contender].append(elapsed * 1000.0)
    spark.stop()

    print(
        f"median ms per job of {TASKS} Python tasks on {slots} task slots, "
        f"{args.rounds} alternating rounds each"
    )
    print(f"{'rows per task':>14} {CONTENDERS[0]:>12} {CONTENDERS[1]:>16}   ratio")
    for size in SIZES:
        quick, plain = (statistics.median(times[size, c]) for c in CONTENDERS)
        print(f"{size:>14,} {quick:>12.1f} {plain:>16.1f}   {plain / quick:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
