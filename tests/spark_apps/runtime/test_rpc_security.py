"""Executors work over the RPC security eop sets: authenticated, encrypted with eop's cipher.

On Kubernetes every pipeline's driver and executors talk with ``RPC_SECURITY_CONF``
(eop_spark.contract.owned_settings). Here a driver in ``local-cluster`` mode starts two
executor JVMs that register with it, fetch its settings and run a job with a shuffle between
them, all over that authenticated and encrypted RPC. With a cipher the pinned Spark breaks
(AES-GCM in Spark 4.0.0, SPARK-56227: every message after a channel's first is lost) the
executors never get their settings and the job never runs.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devenv.spark_home import shared_spark_home

#: ~20 s on 2 cores: a driver, a master, a worker and an executor JVM start.
pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: Runs in a Python of its own: a local-cluster driver with two one-core executors.
_DRIVER = """
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from eop_spark.contract.owned_settings import RPC_SECURITY_CONF

builder = (
    SparkSession.builder.master("local-cluster[1,1,512]")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.ui.enabled", "false")
    .config("spark.executor.memory", "512m")
    .config("spark.sql.shuffle.partitions", "4")
    # A refused or deaf executor fails the job within these, not after minutes.
    .config("spark.rpc.askTimeout", "20s")
    .config("spark.rpc.lookupTimeout", "20s")
    .config("spark.authenticate.secret", sys.argv[1])
)
for name, value in RPC_SECURITY_CONF.items():
    builder = builder.config(name, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
rows = (
    spark.range(0, 10_000, numPartitions=4)
    .groupBy((F.col("id") % 7).alias("k"))
    .count()
    .collect()
)
executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
print(json.dumps({
    "cipher": spark.conf.get("spark.network.crypto.cipher"),
    "counts": sorted((r["k"], r["count"]) for r in rows),
    "executors": executors,
}))
spark.stop()
"""


def test_executors_register_and_shuffle_over_eops_encrypted_rpc(tmp_path: Path) -> None:
    from eop_spark.contract.owned_settings import RPC_SECURITY_CONF

    key = base64.b64encode(os.urandom(32)).decode()
    work = tmp_path / "work"  # the worker's: executor logs, not in the shared Spark home
    env = {**os.environ, "SPARK_HOME": str(shared_spark_home()), "SPARK_WORKER_DIR": str(work)}
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, key],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its JVMs (driver, worker, executors) go with it
    )
    try:
        out, err = driver.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        out, err = driver.communicate()
        pytest.fail(f"no result in 120 s: the executors never ran the job\n{_errors(err, work)}")
    assert driver.returncode == 0, _errors(err, work)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["cipher"] == RPC_SECURITY_CONF["spark.network.crypto.cipher"]
    assert result["executors"] == 1
    expected = sorted((k, sum(1 for i in range(10_000) if i % 7 == k)) for k in range(7))
    assert [tuple(c) for c in result["counts"]] == expected


def _errors(driver_stderr: str, work: Path) -> str:
    """The ERROR lines and exceptions of the driver and the executors, without stack frames."""
    logs = [driver_stderr, *(log.read_text(errors="replace") for log in work.glob("*/*/stderr"))]
    lines = (
        line
        for text in logs
        for line in text.splitlines()
        if ("ERROR" in line or "Exception" in line) and not line.lstrip().startswith("at ")
    )
    return "\n".join(dict.fromkeys(lines))[-4000:]
