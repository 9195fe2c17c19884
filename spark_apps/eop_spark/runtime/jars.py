"""Find the jars pyspark does not ship: the Kafka connector, and S3A for object storage.

The Kafka connector, first match wins: ``$EOP_SPARK_JARS`` (a directory),
``/opt/eop/jars`` (the application image), ``${EOP_CACHE:-~/.cache/eop}/spark-kafka/
<pyspark version>/jars`` (what ``devenv/fetch-jars.sh spark`` fetches).

Hadoop's S3A connector, only for a checkpoint in object storage (``s3a://``):
``$EOP_S3A_JARS``, ``/opt/eop/jars/s3a`` (the image), ``${EOP_CACHE:-~/.cache/eop}/
spark-s3a/<pyspark version>/jars`` (``devenv/fetch-jars.sh s3a``).
"""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

from eop_spark.contract.errors import EnvironmentNotReady

IMAGE_JARS_DIR = Path("/opt/eop/jars")
#: The URI scheme of checkpoints in object storage that the image serves (Hadoop's S3A).
S3A_SCHEME = "s3a"


def _cache() -> Path:
    return Path(os.environ.get("EOP_CACHE", Path.home() / ".cache" / "eop"))


def candidate_dirs() -> list[Path]:
    """The directories searched for the Kafka connector, in order."""
    dirs = [IMAGE_JARS_DIR, _cache() / "spark-kafka" / version("pyspark") / "jars"]
    explicit = os.environ.get("EOP_SPARK_JARS")
    return [Path(explicit), *dirs] if explicit else dirs


def _first_jars(env: str, dirs: list[Path], missing: str, fetch: str) -> list[Path]:
    """The jars of the first directory of ``dirs`` that has any (``env`` names the first)."""
    explicit = os.environ.get(env)
    if explicit and not sorted(Path(explicit).glob("*.jar")):
        raise EnvironmentNotReady(f"{env}={explicit} holds no jars")
    for directory in dirs:
        jars = sorted(directory.glob("*.jar"))
        if jars:
            return jars
    looked = ", ".join(str(d) for d in dirs)
    raise EnvironmentNotReady(f"{missing} (looked in {looked}): run devenv/fetch-jars.sh {fetch}")


def connector_jars() -> list[Path]:
    """The connector jars of the first candidate directory that has any."""
    return _first_jars(
        "EOP_SPARK_JARS", candidate_dirs(), "the Spark Kafka connector jars are missing", "spark"
    )


def s3a_dirs() -> list[Path]:
    """The directories searched for the S3A connector, in order."""
    dirs = [IMAGE_JARS_DIR / "s3a", _cache() / "spark-s3a" / version("pyspark") / "jars"]
    explicit = os.environ.get("EOP_S3A_JARS")
    return [Path(explicit), *dirs] if explicit else dirs


def checkpoint_jars(checkpoint_location: str) -> list[Path]:
    """What Spark needs to reach the checkpoint: S3A's jars for ``s3a://``, else none."""
    if not checkpoint_location.startswith(f"{S3A_SCHEME}://"):
        return []
    return _first_jars(
        "EOP_S3A_JARS",
        s3a_dirs(),
        f"checkpoint {checkpoint_location} needs Hadoop's S3A connector, whose jars are missing",
        "s3a",
    )
