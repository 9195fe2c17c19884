"""Benchmark: what each path of the partitioned sink, and each speed-up of its Python tasks, pays.

One broker, one input (N keyed records of 100 B on 4 partitions), copied by a fresh
``eop run`` process (``--log-format json``, partitioned commit mode, availableNow,
N/8 offsets per batch) under each contender, which differs from the others only by
the switches in its environment:

- ``default``: tasks commit in the JVM (:mod:`eop_spark.exactly_once.partitioned.jvm_writer`);
- ``python``: tasks in Python workers (``EOP_NO_JVM_WRITER=1``), every speed-up on;
- ``python, no native produce``: and ``EOP_NO_NATIVE_PRODUCE=1``;
- ``python, no producer hub``: and ``EOP_NO_PRODUCER_HUB=1``;
- ``python, no quick ACKs``: and ``EOP_NO_QUICK_ACK=1``;
- ``python, no worker daemon``: and ``EOP_NO_WORKER_DAEMON=1`` (workers fork from
  pyspark's own daemon, so without the hub, the quick ACKs and the workers' malloc
  thresholds either) with ``GLIBC_TUNABLES`` empty (the JVM's allocator as glibc sets it).

The contenders run in rounds, one copy each per round, in an order that rotates from
one round to the next, so what else the machine does hits every contender alike.
Each copy is measured over its batches after the first (the first carries the JVM's
start-up and its JIT): the rows of those batches divided by the time from the first
batch's commit to the last's (the runner's ``batch`` log lines), and the CPU seconds of
the runner's process tree (runner, Spark's JVM, Python workers) over the same stretch,
sampled when the runner logs those two batches. Printed per contender: the median
rate, the median over rounds of its rate divided by the default's in the same round,
and the median CPU per million records; then the default's spread (slowest round
over fastest): a ratio that differs from 1 by less than that is within the noise.

    .venv/bin/python -m bench.speedups                   # 1,000,000 records, 5 rounds
    .venv/bin/python -m bench.speedups --records 20000 --rounds 1 --warm-up-rounds 0
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.data_plane import (
    BROKER_OVERRIDES,
    PARTITIONS,
    cpu_seconds,
    disk_needed,
    drop,
    fill,
    in_work_dir,
    paired_ratio,
)
from devenv.kafka import KafkaBroker
from devenv.runners import TEST_SPARK, Pipeline, Runner
from eop_spark.exactly_once.partitioned.jvm_writer import NO_JVM_WRITER_ENV
from eop_spark.runtime.class_archive_training import ensure_archive
from eop_spark.speedups import native_produce, producer_hub
from eop_spark.speedups.malloc_tuning import TUNABLES_ENV
from eop_spark.speedups.worker_daemon import NO_QUICK_ACK_ENV, NO_WORKER_DAEMON_ENV

#: Micro-batches per copy: the first is start-up, the other seven are measured.
BATCHES = 8
RECORD_SIZE = 100
PYTHON_TASKS = {NO_JVM_WRITER_ENV: "1"}
#: Each contender's name and the environment its runner gets on top of the benchmark's.
CONTENDERS: dict[str, dict[str, str]] = {
    "default (JVM writer)": {},
    "python": PYTHON_TASKS,
    "python, no native produce": PYTHON_TASKS | {native_produce.DISABLE_ENV: "1"},
    "python, no producer hub": PYTHON_TASKS | {producer_hub.DISABLE_ENV: "1"},
    "python, no quick ACKs": PYTHON_TASKS | {NO_QUICK_ACK_ENV: "1"},
    "python, no worker daemon": PYTHON_TASKS | {NO_WORKER_DAEMON_ENV: "1", TUNABLES_ENV: ""},
}
DEFAULT = next(iter(CONTENDERS))
#: The runner's Spark: the tests' local[2], with the data-plane benchmark's driver memory.
SPARK = TEST_SPARK | {"driver": {"memory": "4g"}}
#: How often the runner's log is read for its batches (and its CPU sampled).
POLL_S = 0.05


@dataclass(frozen=True)
class Copy:
    """One contender's copy: its measured batches' rows, time and CPU, and the process's life."""

    rows: int  # rows of the batches after the first
    seconds: float  # from the first batch's commit to the last's
    cpu_s: float  # CPU of the runner's process tree over about the same stretch
    run_s: float  # the runner process's life, start-up and stop included

    @property
    def rate(self) -> float:
        """Records/s of the measured batches."""
        return self.rows / self.seconds


def copy_once(
    broker: KafkaBroker, work: Path, name: str, records: int, env: dict[str, str]
) -> Copy:
    """Copy the input topic ``in`` to ``out-<name>`` with a runner in ``env``; its figures."""
    pipeline = Pipeline(broker, work / name, "in", f"out-{name}", name=name)
    pipeline.work.mkdir(parents=True)
    broker.create_topic(pipeline.sink_topic, PARTITIONS)
    config = pipeline.config(
        trigger={"availableNow": True},
        spark=SPARK,
        source={
            "kafka": {
                "bootstrapServers": broker.bootstrap_servers,
                "topics": ["in"],
                "maxOffsetsPerTrigger": max(1, records // BATCHES),
            }
        },
        sink={
            "kafka": {
                "bootstrapServers": broker.bootstrap_servers,
                "topic": pipeline.sink_topic,
                "commitMode": "partitioned",
                "transactionTimeout": "300s",
            }
        },
    )
    try:
        runner = pipeline.start(config, env=env)
        first_cpu, last_cpu = _cpu_at_batches(runner)
        code = runner.wait(600)
        if code != 0:
            raise RuntimeError(f"{name}: the runner exited with {code}\n{runner.tail()}")
        run_s = time.time() - runner.started
        batches = runner.batches()
    finally:
        pipeline.cleanup()
        drop(broker, pipeline.sink_topic)
    copied = sum(b["rows_out"] for b in batches)
    if copied != records or len(batches) < 2:
        raise RuntimeError(f"{name}: {len(batches)} batches wrote {copied} of {records} records")
    return Copy(
        rows=sum(b["rows_out"] for b in batches[1:]),
        seconds=batches[-1]["committed_at"] - batches[0]["committed_at"],
        cpu_s=last_cpu - first_cpu,
        run_s=run_s,
    )


def _cpu_at_batches(runner: Runner) -> tuple[float, float]:
    """The runner tree's CPU seconds when its first batch is logged, and when its last is.

    The last is the one after which the source has nothing left: the runner logs
    :data:`BATCHES` batches, or one more when the offsets do not divide evenly.
    """
    first: float | None = None
    last = 0.0
    seen = 0
    while runner.alive:
        batches = runner.batches()
        if len(batches) > seen:
            seen = len(batches)
            last = cpu_seconds(runner.proc.pid)[0][0]
            first = last if first is None else first
        time.sleep(POLL_S)
    if first is None:
        raise RuntimeError(f"the runner exited before its first batch\n{runner.tail()}")
    return first, last


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5, help="measured copies per contender")
    parser.add_argument(
        "--warm-up-rounds", type=int, default=1, help="unmeasured rounds first (the broker's JIT)"
    )
    parser.add_argument("--work", type=Path, help="work directory (default: a temp dir)")
    return in_work_dir(parser.parse_args(argv), run_benchmark)


def run_benchmark(args: argparse.Namespace, work: Path) -> int:
    """Fill the input, run the rounds in ``work`` and print the figures."""
    records, names = args.records, list(CONTENDERS)
    work.mkdir(parents=True, exist_ok=True)
    needed, free = disk_needed(records, [RECORD_SIZE]), shutil.disk_usage(work).free
    if needed > free:
        print(f"the broker needs ~{needed / 1e9:.1f} GB in {work}: use --work", file=sys.stderr)
        return 2
    print(
        f"eop speed-up benchmark: {records:,} records x {RECORD_SIZE} B, {PARTITIONS} partitions,"
        f" {BATCHES} batches a copy, {args.rounds} rounds (+{args.warm_up_rounds} unmeasured)",
        flush=True,
    )
    copies: dict[str, list[Copy]] = {name: [] for name in names}
    started = time.monotonic()
    with KafkaBroker(work / "kafka", overrides=BROKER_OVERRIDES) as broker:
        ensure_archive()  # runners map the JVM class archive, as in the image
        broker.create_topic("in", PARTITIONS)
        fill(broker, "in", records, RECORD_SIZE)
        for round_ in range(-args.warm_up_rounds, args.rounds):
            turn = round_ % len(names)
            for name in names[turn:] + names[:turn]:
                label = "warm-up" if round_ < 0 else f"round {round_}"
                tag = f"r{round_ + args.warm_up_rounds}-{names.index(name)}"
                copy = copy_once(broker, work, tag, records, CONTENDERS[name])
                print(
                    f"  {label:<8} {name:<26} {copy.rate:>10,.0f} rec/s  CPU {copy.cpu_s:6.1f} s"
                    f"  runner {copy.run_s:5.1f} s",
                    flush=True,
                )
                if round_ >= 0:
                    copies[name].append(copy)
    _print_table(copies)
    print(f"\nthe whole run took {time.monotonic() - started:.0f} s")
    return 0


def _print_table(copies: dict[str, list[Copy]]) -> None:
    """Per contender: median rate, paired ratio to the default, CPU per million records."""
    default = [c.rate for c in copies[DEFAULT]]
    print(
        f"\nbatches 2-{BATCHES} of each copy, medians over {len(default)} rounds\n"
        f"{'contender':<26} {'records/s':>10} {'/ default':>10} {'CPU s per 1M':>13}"
    )
    for name, runs in copies.items():
        rates = [c.rate for c in runs]
        per_million = statistics.median(c.cpu_s / c.rows * 1e6 for c in runs)
        print(
            f"{name:<26} {statistics.median(rates):>10,.0f} "
            f"{paired_ratio(rates, default):>10.2f} {per_million:>13.1f}"
        )
    if len(default) < 2:
        print("\nnoise: one round gives no spread (run two or more)")
        return
    spread = min(default) / max(default)
    print(
        f"\nnoise: the default's slowest round / its fastest = {spread:.2f} "
        f"(a ratio between {spread:.2f} and {1 / spread:.2f} is within it)"
    )


if __name__ == "__main__":
    sys.exit(main())
