"""`eop executor`: the executor JVM's command from the pod Spark made, and its supervision."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eop_spark.runtime.executor import (
    BACKEND,
    MASTER_ENV,
    MissingSetting,
    executor_command,
    spark_home,
    supervise,
)

#: What Spark's Kubernetes backend puts in an executor pod's environment (BasicExecutorFeatureStep).
POD_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.1.2.3:7078",
    "SPARK_EXECUTOR_ID": "2",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_APPLICATION_ID": "spark-0123",
    "SPARK_EXECUTOR_POD_IP": "10.1.2.9",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_EXECUTOR_POD_NAME": "eop-ads-clean-0123-exec-2",
    "SPARK_JAVA_OPT_0": "-Dspark.driver.port=7078",
    "SPARK_JAVA_OPT_10": "-Dspark.network.crypto.enabled=true",
    "SPARK_JAVA_OPT_2": "-Dspark.authenticate=true",
    "SPARK_JAVA_OPT_1": "-Dspark.authenticate.secret.file=/etc/eop/secrets/spark-rpc/key",
    MASTER_ENV: "k8s://https://kubernetes.default.svc",
}


def _command(env: dict[str, str]) -> list[str]:
    return executor_command(
        env, "/usr/bin/java", Path("/spark"), [Path("/opt/eop/jars/a.jar")], Path("/tmp/l.xml")
    )


def test_the_executor_jvm_gets_what_the_driver_put_in_its_pod() -> None:
    command = _command(POD_ENV)
    main = command.index(BACKEND)
    options, arguments = command[1:main], command[main + 1 :]
    # Spark's settings in index order (10 after 2), then the master: an executor reads the
    # RPC key's file only when it knows it runs on Kubernetes, before the driver tells it.
    assert [o for o in options if o.startswith("-Dspark.")] == [
        "-Dspark.driver.port=7078",
        "-Dspark.authenticate.secret.file=/etc/eop/secrets/spark-rpc/key",
        "-Dspark.authenticate=true",
        "-Dspark.network.crypto.enabled=true",
        "-Dspark.master=k8s://https://kubernetes.default.svc",
    ]
    assert "-Xmx512m" in options and "-Xms512m" in options
    classpath = options[options.index("-cp") + 1].split(os.pathsep)
    assert classpath == ["/spark/jars/*", "/opt/eop/jars/a.jar"]
    assert dict(zip(arguments[::2], arguments[1::2], strict=True)) == {
        "--driver-url": POD_ENV["SPARK_DRIVER_URL"],
        "--executor-id": "2",
        "--cores": "1",
        "--app-id": "spark-0123",
        "--hostname": "10.1.2.9",
        "--resourceProfileId": "0",
        "--podName": "eop-ads-clean-0123-exec-2",
    }


def test_outside_a_driver_made_pod_it_says_what_is_missing() -> None:
    env = {k: v for k, v in POD_ENV.items() if k != "SPARK_DRIVER_URL"}
    with pytest.raises(MissingSetting, match="SPARK_DRIVER_URL not set"):
        _command(env)


def test_pyspark_is_the_spark_home() -> None:
    assert (spark_home() / "jars").is_dir()


def test_supervise_passes_sigterm_on_and_reaps_orphans(tmp_path: Path) -> None:
    """The JVM gets the pod's SIGTERM; children it leaves behind do not stay zombies."""
    ready = tmp_path / "ready"
    child = (
        "import os, signal, subprocess, sys, time\n"
        # An orphan: a process whose parent exits at once, so it is re-parented to us.
        "orphan = [sys.executable, '-c', 'import time; time.sleep(0.5)']\n"
        "spawn = f'import subprocess; subprocess.Popen({orphan!r})'\n"
        "subprocess.run([sys.executable, '-c', spawn], check=True)\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    supervisor = (
        "import ctypes, sys\n"
        # Orphans come to us as they do to a container's first process.
        "ctypes.CDLL(None).prctl(36, 1)\n"  # PR_SET_CHILD_SUBREAPER
        "from eop_spark.runtime.executor import supervise\n"
        f"sys.exit(supervise([sys.executable, '-c', {child!r}], {{}}))\n"
    )
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", supervisor], env={**os.environ})
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() - began < 30
        time.sleep(0.05)
    time.sleep(1)  # the grandchild has ended by now
    zombies = [
        line
        for line in subprocess.run(
            ["ps", "-o", "stat=,ppid=", "--ppid", str(proc.pid)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.splitlines()
        if line.strip().startswith("Z")
    ]
    assert not zombies
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 7


def test_supervise_returns_the_exit_code() -> None:
    assert supervise([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3
