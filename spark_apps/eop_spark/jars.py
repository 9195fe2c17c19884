"""Find the Spark Kafka connector jars (pyspark does not ship them).

Looked up, first match wins: ``$EOP_SPARK_JARS`` (a directory), ``/opt/eop/jars``
(the application image), ``${EOP_CACHE:-~/.cache/eop}/spark-kafka/<pyspark
version>/jars`` (what ``devenv/fetch-jars.sh spark`` fetches).
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

from eop_spark.errors import EnvironmentNotReady

IMAGE_JARS_DIR = Path("/opt/eop/jars")


def candidate_dirs() -> list[Path]:
    """The directories searched, in order."""
    cache = Path(os.environ.get("EOP_CACHE", Path.home() / ".cache" / "eop"))
    dirs = [IMAGE_JARS_DIR, cache / "spark-kafka" / version("pyspark") / "jars"]
    explicit = os.environ.get("EOP_SPARK_JARS")
    return [Path(explicit), *dirs] if explicit else dirs


def connector_jars() -> list[Path]:
    """The connector jars of the first candidate directory that has any."""
    explicit = os.environ.get("EOP_SPARK_JARS")
    if explicit and not sorted(Path(explicit).glob("*.jar")):
        raise EnvironmentNotReady(f"EOP_SPARK_JARS={explicit} holds no jars")
    for directory in candidate_dirs():
        jars = sorted(directory.glob("*.jar"))
        if jars:
            return jars
    looked = ", ".join(str(d) for d in candidate_dirs())
    raise EnvironmentNotReady(
        f"the Spark Kafka connector jars are missing (looked in {looked}): "
        "run devenv/fetch-jars.sh spark"
    )
