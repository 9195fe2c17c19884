"""``eop executor``: what an executor pod runs (the driver's Kubernetes backend creates it).

Spark makes each executor pod from the image with the argument ``executor`` and puts its
settings in the environment: the driver's URL, the executor's id, cores and memory, the
application id, its pod's IP and name, ``SPARK_JAVA_OPT_<n>`` (the settings an executor needs
before it can talk to the driver: ``spark.authenticate*``, ``spark.network.*``, ``spark.rpc.*``)
and ``SPARK_CLASSPATH``. Spark's own images start the executor JVM from a shell script; this is
that step for the eop image, with two differences:

* ``-Dspark.master`` from :data:`MASTER_ENV` (the pod template sets it): an executor reads the
  RPC key from ``spark.authenticate.secret.file`` only when it knows it runs on Kubernetes,
  and it learns the master from the driver, which it must first authenticate to;
* this process stays as the container's first process: it passes SIGTERM and SIGINT to the
  JVM and reaps every child that ends (a Python worker whose daemon died would otherwise stay
  a zombie under a JVM that never waits for it), and exits with the JVM's code.

The JVM's class path is pyspark's jars plus the connector jars the driver has (the image's
``/opt/eop/jars``, with the partitioned sink's JVM writer), so the sink's tasks find their
classes before the driver's copies arrive.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from eop_spark.contract.errors import EXIT_CONFIG, EnvironmentNotReady
from eop_spark.runtime.jars import connector_jars
from eop_spark.runtime.session import LOG4J2_PROPERTIES

#: Spark's executor entry point on Kubernetes.
BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
#: The master URL, set by the operator's executor pod template.
MASTER_ENV = "EOP_SPARK_MASTER"
#: The environment Spark gives an executor pod, and the backend's option each one is.
_ARGUMENTS = (
    ("--driver-url", "SPARK_DRIVER_URL"),
    ("--executor-id", "SPARK_EXECUTOR_ID"),
    ("--cores", "SPARK_EXECUTOR_CORES"),
    ("--app-id", "SPARK_APPLICATION_ID"),
    ("--hostname", "SPARK_EXECUTOR_POD_IP"),
    ("--resourceProfileId", "SPARK_RESOURCE_PROFILE_ID"),
    ("--podName", "SPARK_EXECUTOR_POD_NAME"),
)
_JAVA_OPT_PREFIX = "SPARK_JAVA_OPT_"


class MissingSetting(RuntimeError):
    """The pod lacks a variable Spark sets on executor pods (not started by a driver?)."""


def spark_home() -> Path:
    """pyspark's installation: its ``jars/`` and what Python workers need."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise MissingSetting("pyspark is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def java_options(env: Mapping[str, str]) -> list[str]:
    """``SPARK_JAVA_OPT_<n>`` in the order of ``n``, then ``-Dspark.master``."""
    indexed = [
        (int(name.removeprefix(_JAVA_OPT_PREFIX)), value)
        for name, value in env.items()
        if name.startswith(_JAVA_OPT_PREFIX) and name.removeprefix(_JAVA_OPT_PREFIX).isdigit()
    ]
    options = [value for _, value in sorted(indexed)]
    master = env.get(MASTER_ENV)
    if master and not any(o.startswith("-Dspark.master=") for o in options):
        options.append(f"-Dspark.master={master}")
    return options


def executor_command(
    env: Mapping[str, str], java: str, home: Path, jars: list[Path], log4j2: Path
) -> list[str]:
    """The executor JVM's command line from the pod's environment."""
    missing = [name for _, name in _ARGUMENTS if not env.get(name)]
    if missing or not env.get("SPARK_EXECUTOR_MEMORY"):
        names = ", ".join(missing or ["SPARK_EXECUTOR_MEMORY"])
        raise MissingSetting(f"{names} not set: `eop executor` runs in pods a Spark driver makes")
    memory = env["SPARK_EXECUTOR_MEMORY"]
    classpath = [p for p in env.get("SPARK_CLASSPATH", "").split(os.pathsep) if p]
    classpath += [str(home / "jars" / "*"), *(str(jar) for jar in jars)]
    arguments = [item for option, name in _ARGUMENTS for item in (option, env[name])]
    return [
        java,
        *java_options(env),
        f"-Xms{memory}",
        f"-Xmx{memory}",
        f"-Dlog4j2.configurationFile=file:{log4j2}",
        "-cp",
        os.pathsep.join(classpath),
        BACKEND,
        *arguments,
    ]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found:
        raise MissingSetting("no java on PATH (nor JAVA_HOME)")
    return found


def supervise(command: list[str], env: Mapping[str, str]) -> int:
    """Run ``command``, pass it SIGTERM/SIGINT, reap every child; its exit code."""
    child = subprocess.Popen(command, env=dict(env))

    def forward(signum: int, _: object) -> None:
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # no child left (cannot happen before the JVM's own end)
            return child.returncode if child.returncode is not None else 1
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode


def main() -> int:
    """Start the executor JVM for this pod; return its exit code."""
    try:
        home = spark_home()
        with tempfile.TemporaryDirectory(prefix="eop-executor-") as scratch:
            log4j2 = Path(scratch) / "log4j2.properties"
            log4j2.write_text(LOG4J2_PROPERTIES)
            env = {**os.environ, "SPARK_HOME": str(home)}
            command = executor_command(env, _java(), home, connector_jars(), log4j2)
            return supervise(command, env)
    except (MissingSetting, EnvironmentNotReady) as exc:
        print(f"eop executor: {exc}", file=sys.stderr)
        return EXIT_CONFIG
