"""Build the JVM class archive (:mod:`eop_spark.speedups.class_archive`) with a training run.

``python -m eop_spark.runtime.class_archive_training [PATH]`` builds one: a
short training run (a session, SQL, a streaming query with ``foreachBatch``
and ``mapInArrow``) whose JVM dumps the classes it loaded when it exits.  The
archive is written to a temporary file and renamed only after that JVM exited
cleanly: a truncated archive would crash every JVM that maps it.  The image
builds one at ``/opt/eop/spark-classes.jsa``; the dev environment in its cache
(the default ``PATH``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eop_spark.contract.run_config import RunConfig
from eop_spark.runtime.jars import connector_jars
from eop_spark.runtime.session import build_session
from eop_spark.speedups.class_archive import cache_archive

#: How long a training run may take.
TRAIN_TIMEOUT_S = 600
#: This module, run in a fresh process for the training (its spec's name: ``__name__`` is
#: ``__main__`` when it runs as ``python -m``).
TRAINING_MODULE = __spec__.name if __spec__ is not None else __name__


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_archive(path: Path | None = None) -> Path:
    """Build the archive at ``path`` (default: the dev cache) unless it exists; return it."""
    target = path or cache_archive()
    with _lock(target):
        if not target.is_file():
            build_archive(target)
    return target


def build_archive(target: Path) -> None:
    """Run the training in a fresh process and move its archive to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eop-cds-", dir=target.parent) as work:
        partial = Path(work) / "classes.jsa"
        subprocess.run(
            [sys.executable, "-m", TRAINING_MODULE, "--train", str(partial)],
            check=True,
            timeout=TRAIN_TIMEOUT_S,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if not partial.is_file():
            raise RuntimeError(f"the training JVM wrote no class archive to {partial}")
        os.replace(partial, target)


def _count(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa  # type: ignore[import-untyped]

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"rows": rows}])


def train(partial: Path) -> None:
    """The training run: what a runner does up to its first batch, on a file source."""
    work = Path(tempfile.mkdtemp(prefix="eop-cds-train-"))
    try:
        (work / "in").mkdir()
        (work / "in" / "part-0.txt").write_text("".join(f"{i}\n" for i in range(1000)))
        config = RunConfig.offline(
            "eop.class-archive",
            str(work / "checkpoints"),
            "SELECT value AS key, value FROM source",
        )
        jars = connector_jars()
        spark = build_session(config, jars, archive_at_exit=partial)
        # The Kafka source's analysis loads the connector and most of Spark SQL's machinery.
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option(
            "subscribe", "none"
        ).load().createOrReplaceTempView("kafka_source")
        spark.sql("SELECT key, value, topic, partition, offset FROM kafka_source").schema  # noqa: B018
        spark.readStream.format("text").load(str(work / "in")).createOrReplaceTempView("source")
        stream = spark.sql(config.transform.sql or "")

        def body(df: Any, _batch_id: int) -> None:
            df.select("key", "value").mapInArrow(_count, "rows long").collect()

        query = (
            stream.writeStream.foreachBatch(body)
            .option("checkpointLocation", config.checkpoint_location)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        _stop_jvm(spark)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _stop_jvm(spark: Any) -> None:
    """Stop Spark and wait for its JVM to exit (it writes the archive on the way out)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    process = getattr(gateway, "proc", None)
    if process is None:
        raise RuntimeError("the Spark JVM was not started by this process")
    process.stdin.close()  # the gateway JVM exits when its stdin closes
    if process.wait(TRAIN_TIMEOUT_S) != 0:
        raise RuntimeError(f"the training JVM exited with {process.returncode}")


def main(argv: list[str] | None = None) -> int:
    """``[PATH]``: build the archive (default: the dev cache); ``--train PATH``: internal."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--train"]:
        train(Path(args[1]))
        return 0
    print(ensure_archive(Path(args[0]) if args else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
