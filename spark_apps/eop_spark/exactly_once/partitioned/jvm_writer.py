"""The partitioned sink's task in the executor JVM: building its jar, and its client settings.

``PartitionedWriter.java`` (next to this file) runs the same protocol as
:func:`eop_spark.exactly_once.partitioned.task.commit_partition` over the batch's rows where
Spark keeps them, with the Java Kafka producer: no Arrow batches, no socket to a
Python worker, no librdkafka.  Side by side it copied a million records at 0.90
(100 B) and 0.93 (1 KiB) of Spark's own sink's rate, where the Python task
path reached 0.86 and 0.78 (see docs/performance.md).

The jar is named after a hash of the source, so a changed source never meets an
old jar.  The image builds it into ``/opt/eop/jars`` (this file run alone,
``python jvm_writer.py OUT_DIR CONNECTOR_JARS_DIR``, next to the Java source);
the dev environment builds it on first use into
``${EOP_CACHE:-~/.cache/eop}/jvm-writer/<pyspark version>/``, with the JDK's
``javac`` against pyspark's jars and the Kafka connector's (so a jar compiled
against one Spark release never runs on another).  Without a JDK nor a built jar the
partitioned sink keeps its Python tasks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "PartitionedWriter.java"
#: The class the runner calls through py4j.
CLASS = "io.exactlyonce.eop.PartitionedWriter"
#: Set to 1 to keep the partitioned sink's tasks in Python workers.
NO_JVM_WRITER_ENV = "EOP_NO_JVM_WRITER"


#: The Java producer's own ``buffer.memory`` default, the most eop gives each producer.
JAVA_BUFFER_MEMORY = 32 << 20
#: The least.
MIN_BUFFER_MEMORY = 1 << 20
#: ``batch.size`` is at most this share of ``buffer.memory``: one task's producer of 62,500
#: 1 KiB records took 4.0-5.4 s with 4 batches of 1 MB in 4 MiB, 0.6-1.6 s with 16 of 256 KiB
#: (and 1.3-2.6 s with 32 MiB and 1 MB batches; alternating, one JVM).
BATCHES_IN_BUFFER = 16
#: The share of a task JVM's heap all its producers' buffers may keep together.
HEAP_SHARE = 4


def producer_defaults(heap_bytes: int, partitions: int) -> dict[str, str]:
    """The Java producer's own defaults eop changes (user options override them).

    The batching of the librdkafka producers (``client_config.producer_config``),
    and a shorter retry backoff: a new producer's first sendOffsetsToTransaction
    looks the group coordinator up and waited out one backoff, ~104 ms with the
    default 100 ms, ~12 ms with 10.

    And a ``buffer.memory`` that lets the producers of ``partitions`` ids keep
    at most a quarter of the ``heap_bytes`` of the JVM that runs them. Each id's
    producer lives as long as the JVM, and its buffer pool keeps every buffer
    of ``batch.size`` it ever allocated (up to ``buffer.memory``, 32 MiB by
    default) for reuse: a task that appends faster than the broker takes
    (1 KiB records, large batches) fills it, so 16 partitions would keep 512 MiB
    of a 1 GiB heap for good (measured: 33 buffers of 1 MB pooled after one
    task of 62,500 1 KiB records). Between 1 and 32 MiB each; ``batch.size`` at
    most a sixteenth of it: with only a few batches in the buffer the producer
    waits for room (see :data:`BATCHES_IN_BUFFER`).
    """
    # Imported here: the image's jar stage runs this file alone, without eop_spark.
    from eop_spark.kafka.client_config import producer_config

    batching = producer_config({}, "-", 60_000)
    share = heap_bytes // HEAP_SHARE // max(1, partitions)
    memory = min(JAVA_BUFFER_MEMORY, max(MIN_BUFFER_MEMORY, share))
    return {
        "linger.ms": str(batching["linger.ms"]),
        "batch.size": str(min(int(batching["batch.size"]), memory // BATCHES_IN_BUFFER)),
        "buffer.memory": str(memory),
        "retry.backoff.ms": "10",
    }


def tasks_run_in_driver(spark: Any) -> bool:
    """Whether the driver's JVM runs the tasks (local mode)."""
    return str(spark.sparkContext.master).startswith("local")


def task_heap_bytes(spark: Any) -> int:
    """The heap of the JVMs that run the tasks: the driver's in local mode, else an executor's."""
    jvm = spark.sparkContext._jvm
    if tasks_run_in_driver(spark):
        return int(jvm.java.lang.Runtime.getRuntime().maxMemory())
    memory = spark.sparkContext.getConf().get("spark.executor.memory", "1g")
    return int(jvm.org.apache.spark.network.util.JavaUtils.byteStringAsBytes(memory))


#: Properties that carry credentials or transport security: a librdkafka name among them that
#: the Java client does not know means the Java client would connect without them.
SECURITY_PREFIXES = ("sasl.", "ssl.", "security.")


def jar_name() -> str:
    """``eop-jvm-writer-<hash of the source>.jar``."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"eop-jvm-writer-{digest}.jar"


def cache_dir() -> Path:
    """Where the dev environment keeps the jars built against this pyspark's Spark."""
    from importlib.metadata import version

    root = Path(os.environ.get("EOP_CACHE", Path.home() / ".cache" / "eop"))
    return root / "jvm-writer" / version("pyspark")


def find_jar(dirs: Iterable[Path]) -> Path | None:
    """This source's jar in the first of ``dirs`` that has it."""
    for directory in dirs:
        candidate = directory / jar_name()
        if candidate.is_file():
            return candidate
    return None


def build(out_dir: Path, classpath: Iterable[Path]) -> Path:
    """Compile the writer against ``classpath`` (directories of jars) into ``out_dir``."""
    javac = shutil.which("javac")
    if javac is None:
        raise FileNotFoundError("javac not found: the JVM writer needs a JDK to build")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / jar_name()
    with tempfile.TemporaryDirectory(prefix="eop-jvm-writer-") as work:
        classes = Path(work) / "classes"
        cp = os.pathsep.join(str(d / "*") for d in classpath)
        subprocess.run(
            [javac, "-nowarn", "--release", "17", "-d", str(classes), "-cp", cp, str(SOURCE)],
            check=True,
            capture_output=True,
            text=True,
        )
        partial = Path(work) / target.name
        with zipfile.ZipFile(partial, "w") as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        shutil.move(str(partial), target)  # whole or not at all
    return target


def compile_classpath(connector_dir: Path) -> list[Path]:
    """pyspark's jars and the Kafka connector's (the Java Kafka client)."""
    import pyspark

    return [Path(pyspark.__file__).resolve().parent / "jars", connector_dir]


def writer_jars(connector_jars: list[Path]) -> list[Path]:
    """The writer's jar for the session (``[]`` if it is switched off or cannot be built)."""
    if os.environ.get(NO_JVM_WRITER_ENV) == "1" or not connector_jars:
        return []
    if not SOURCE.is_file():
        log.warning("the JVM writer's source %s is missing, tasks stay in Python", SOURCE)
        return []
    dirs = sorted({j.parent for j in connector_jars})
    found = find_jar([*dirs, cache_dir()])
    if found is not None:
        return [] if found in connector_jars else [found]  # the image's is among them
    try:
        return [build(cache_dir(), compile_classpath(dirs[0]))]
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        log.warning("the JVM writer is not available, tasks stay in Python: %s", detail.strip())
        return []


def client_names(jvm: Any) -> tuple[frozenset[str], frozenset[str]]:
    """The property names the Java producer and consumer know.

    Joined in the JVM and sent over as one string each: py4j fetches a Java
    set's elements one round trip at a time, ~40 ms for the two on 2 cores at
    every run's first batch.
    """
    kafka = jvm.org.apache.kafka.clients
    join = jvm.java.lang.String.join
    return (
        frozenset(join("\n", kafka.producer.ProducerConfig.configNames()).split("\n")),
        frozenset(join("\n", kafka.consumer.ConsumerConfig.configNames()).split("\n")),
    )


def java_settings(
    spark: Any, client_config: Mapping[str, str], transaction_timeout_ms: int, partitions: int
) -> tuple[dict[str, str], dict[str, str]] | None:
    """The Java producer's and G reader's properties from the sink's librdkafka settings.

    Names both clients share pass through, SASL user names and passwords as
    JAAS (``client_config.java_client_properties``); other librdkafka names are
    left out (they tune librdkafka), unless they are security settings, which
    the Java client would then lack: ``None`` then, and the tasks stay in Python.
    ``partitions``: how many ids the run's tasks hold (see :func:`producer_defaults`).
    """
    # Imported here: the image's jar stage runs this file alone, without eop_spark.
    from eop_spark.kafka.client_config import java_client_properties

    producer_names, reader_names = client_names(spark.sparkContext._jvm)
    producer = producer_defaults(task_heap_bytes(spark), partitions)
    reader: dict[str, str] = {}
    for name, value in java_client_properties(client_config).items():
        known = False
        if name in producer_names:
            producer[name] = str(value)
            known = True
        if name in reader_names:
            reader[name] = str(value)
            known = True
        if not known and name.startswith(SECURITY_PREFIXES):
            log.warning(
                "sink property %s is librdkafka's only: the partitioned sink's tasks stay in "
                "Python (give the Java client's equivalent too to move them to the JVM)",
                name,
            )
            return None
    producer |= {
        "enable.idempotence": "true",
        "transaction.timeout.ms": str(transaction_timeout_ms),
    }
    return producer, reader


def writer_settings(
    topic: str,
    prefix: str,
    group: str,
    run: str,
    producer: dict[str, str],
    reader: dict[str, str],
    progress_topics: dict[str, str] | None = None,
) -> str:
    """The settings JSON ``PartitionedWriter`` reads (its ``Settings`` class).

    ``progress_topics``: source topic -> the topic G keeps its offsets under
    (``ProgressNames.topic_map``); None: under the source names.
    """
    return json.dumps(
        {
            "topic": topic,
            "prefix": prefix,
            "group": group,
            "run": run,
            "producer": producer,
            "reader": reader,
            "progressTopics": progress_topics,
        }
    )


def main(argv: list[str] | None = None) -> int:
    """``python jvm_writer.py OUT_DIR CONNECTOR_JARS_DIR``: build the jar (also ``-m``)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(main.__doc__, file=sys.stderr)
        return 2
    print(build(Path(args[0]), compile_classpath(Path(args[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
