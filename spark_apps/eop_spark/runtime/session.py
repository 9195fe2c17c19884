"""Build the SparkSession of a run: the connector jars, quiet logs, loopback in local mode."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import eop_spark
from eop_spark.contract.owned_settings import RPC_SECURITY_CONF, SPARK_CONF
from eop_spark.contract.run_config import SCRATCH_ENV, RunConfig
from eop_spark.exactly_once.offsets_log import is_local
from eop_spark.exactly_once.partitioned import jvm_writer
from eop_spark.runtime.jars import S3A_SCHEME, checkpoint_jars
from eop_spark.speedups import class_archive, worker_daemon
from eop_spark.speedups.malloc_tuning import TUNABLES_ENV, glibc_tunables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: Spark's checkpoint file manager on the FileSystem API (see :func:`session_conf`).
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
#: spark-hadoop-cloud's checkpoint file manager for object stores (see :func:`session_conf`).
OBJECT_STORE_CHECKPOINTS = (
    "org.apache.spark.internal.io.cloud.AbortableStreamBasedCheckpointFileManager"
)

#: Spark's own logs go to stdout next to the runner's, warnings and up: stderr is
#: kept for the one error line a failed run ends with. The partitioned sink's JVM writer
#: says which transactional ids a JVM took (once each). On Kubernetes the driver says when an
#: executor registered, was requested or was removed (once each). Executors log the same way.
LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_OUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.kafka.name = org.apache.kafka
logger.kafka.level = error
logger.kafka010.name = org.apache.spark.sql.kafka010
logger.kafka010.level = error
logger.eop.name = io.exactlyonce.eop
logger.eop.level = info
logger.executors.name = org.apache.spark.scheduler.cluster
logger.executors.level = info
"""


def _cores(config: RunConfig) -> int:
    spark = config.spark
    if spark.on_kubernetes:
        return spark.executor.cores * spark.executor.instances
    match = re.fullmatch(r"local\[(\d+)\]", spark.master)
    return int(match.group(1)) if match else 1


def session_conf(
    config: RunConfig, jars: list[Path], log4j2: Path, java_options: str = ""
) -> dict[str, str]:
    """The Spark configuration of a run: the runner's defaults, then ``spec.spark.conf``.

    Of the settings eop owns (:data:`~eop_spark.contract.owned_settings.SPARK_CONF`), the
    runner's values hold over ``spec.spark.conf``: a spec may not hold them, but a run
    configuration not made by eop could. ``java_options`` go to the driver JVM after the
    runner's own (before the user's).
    """
    spark = config.spark
    conf = {
        "spark.app.name": f"eop-{config.pipeline}",
        "spark.master": spark.master,
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.driver.memory": spark.driver.memory,
        "spark.ui.showConsoleProgress": "false",
        # Event-time windows and JSON timestamps should not depend on the host's zone.
        "spark.sql.session.timeZone": "UTC",
        # Stateful queries keep this number for the checkpoint's life: size it to the cores
        # instead of Spark's 200, which makes every micro-batch run 200 tiny tasks.
        "spark.sql.shuffle.partitions": str(max(2, 2 * _cores(config))),
        "spark.driver.extraJavaOptions": " ".join(
            o for o in (f"-Dlog4j2.configurationFile=file:{log4j2}", java_options) if o
        ),
        # Any other byte limit than Int.MaxValue (Spark 4.0's default is 256 MB) makes the
        # JVM measure the Arrow batch after every row it adds: a fifth of the driver's CPU.
        "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
        # No Spark UI: a driver with executors as pods listens on the pod's IP (SPARK_LOCAL_IP,
        # which its RPC needs), so the UI would answer every pod of the cluster. A spec may
        # turn it on (spark.ui.enabled, then `kubectl port-forward`), never its kill buttons.
        "spark.ui.enabled": "false",
        "spark.ui.killEnabled": "false",
    }
    if os.environ.get(worker_daemon.NO_WORKER_DAEMON_ENV) != "1":
        # Python workers fork from eop's daemon: it keeps Spark's zips off their path and
        # their libraries out of the per-task gc.collect() (see eop_spark.speedups.worker_daemon).
        conf["spark.python.daemon.module"] = worker_daemon.__name__
    if is_local(config.checkpoint_location):
        # Spark's default manager goes through Hadoop's FileContext, whose local file system
        # runs `readlink` in a new process for each path a rename looks at (Hadoop's native
        # library is not in pyspark): ~20 processes per micro-batch for the offsets and
        # commits files, ~70 ms of each batch here. The FileSystem API renames in the JVM
        # (rename(2)), the same write-then-rename with the same checksum files.
        conf["spark.sql.streaming.checkpointFileManagerClass"] = FILE_SYSTEM_CHECKPOINTS
    elif config.checkpoint_location.startswith(f"{S3A_SCHEME}://"):
        # Spark's default manager writes a temporary file and renames it, which S3A does as
        # copy + delete (not atomic: a driver killed between the two leaves a half-done
        # rename, and each batch file is uploaded twice). This one writes each file straight
        # to its name in one upload that becomes visible only when it completes, and aborts
        # the upload of a file that fails: a reader sees the whole file or none of it
        # (docs/exactly-once.md, "Checkpoints in object storage").
        conf["spark.sql.streaming.checkpointFileManagerClass"] = OBJECT_STORE_CHECKPOINTS
    if spark.on_kubernetes:
        conf |= {
            **RPC_SECURITY_CONF,
            # What the driver JVM gets from build_session (see eop_spark.speedups.malloc_tuning).
            f"spark.executorEnv.{TUNABLES_ENV}": glibc_tunables(),
            "spark.executor.instances": str(spark.executor.instances),
            "spark.executor.cores": str(spark.executor.cores),
            "spark.executor.memory": spark.executor.memory,
        }
    else:
        conf |= {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        }
    user = dict(spark.conf)
    if "spark.driver.extraJavaOptions" in user:
        user["spark.driver.extraJavaOptions"] = (
            f"{conf['spark.driver.extraJavaOptions']} {user['spark.driver.extraJavaOptions']}"
        )
    owned = {key: value for key, value in conf.items() if SPARK_CONF.owns(key)}
    return conf | user | owned


def prepare_scratch() -> Path | None:
    """Empty ``$EOP_SCRATCH_DIR`` and make it Spark's local directory; None when unset.

    Spark removes its scratch files (a copy of the connector jars, ~10 MB, and the
    block manager's files) when the driver stops, but not when it is killed, and a
    driver container restarted after a SIGKILL or an OOM kill finds the emptyDir of
    its predecessor: without this, every such restart would leave them behind until
    the pod is deleted.  Only a new driver process calls this, and the directory is
    its own, so whatever is there belongs to a driver that is gone.
    ``SPARK_LOCAL_DIRS`` set in ``spec.driver.env`` still wins.
    """
    value = os.environ.get(SCRATCH_ENV)
    if not value:
        return None
    scratch = Path(value)
    scratch.mkdir(parents=True, exist_ok=True)
    stale = sorted(scratch.iterdir())
    # os.walk lists links without following them: only the files that are there count.
    size = sum(
        os.lstat(os.path.join(root, name)).st_size
        for root, _, names in os.walk(scratch)
        for name in names
    )
    for entry in stale:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    if stale:
        log.info(
            "removed %d entries (%.1f MB) an earlier driver left in %s",
            len(stale),
            size / 1e6,
            scratch,
        )
    os.environ.setdefault("SPARK_LOCAL_DIRS", str(scratch))
    return scratch


def build_session(
    config: RunConfig, jars: list[Path], *, archive_at_exit: Path | None = None
) -> SparkSession:
    """Start (or join, in-process) the SparkSession for ``config``.

    A local driver JVM maps the class archive if there is one (see
    :mod:`eop_spark.speedups.class_archive`); ``archive_at_exit`` makes it write one
    instead, when it exits.
    """
    from pyspark.sql import SparkSession

    if not config.spark.on_kubernetes:
        # Spark probes the host's addresses before reading its conf; keep it on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers run this interpreter (with pyarrow and confluent-kafka) and find eop_spark.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    package_root = str(Path(eop_spark.__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    scratch = prepare_scratch()
    # The JVM reads its log configuration once, at start; the file goes when this process does.
    log4j2_dir = tempfile.mkdtemp(prefix="eop-spark-", dir=scratch)
    atexit.register(shutil.rmtree, log4j2_dir, ignore_errors=True)
    log4j2 = Path(log4j2_dir) / "log4j2.properties"
    log4j2.write_text(LOG4J2_PROPERTIES)
    if archive_at_exit is not None:
        java_options = f"-XX:ArchiveClassesAtExit={archive_at_exit}"
    else:
        java_options = class_archive.java_options(class_archive.find_archive())
    builder = SparkSession.builder
    jars = [
        *jars,
        *jvm_writer.writer_jars(jars),
        *checkpoint_jars(config.checkpoint_location),
    ]
    for key, value in session_conf(config, jars, log4j2, java_options).items():
        builder = builder.config(key, value)
    with _jvm_stderr_to_stdout(), _jvm_environment({TUNABLES_ENV: glibc_tunables()}):
        return builder.getOrCreate()


@contextlib.contextmanager
def _jvm_environment(variables: dict[str, str]) -> Iterator[None]:
    """Set ``variables`` (where unset) for the JVM that starts, and for it only.

    The JVM's children (the Python workers' daemon) inherit them; this
    process's environment is as it was afterwards.  A value already in the
    environment (the user's) is kept.
    """
    added = {k: v for k, v in variables.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _jvm_stderr_to_stdout() -> Iterator[None]:
    """Let the JVM (and the Python workers it forks) inherit stdout as their stderr.

    The JVM writes start-up notes to stderr; the runner's stderr is reserved for
    its one error line.  File descriptor 2 is swapped only while the JVM starts.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(1, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
