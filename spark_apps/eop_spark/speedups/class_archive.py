"""A class-data-sharing archive of Spark's classes, so a restarted driver's JVM starts sooner.

A fresh driver JVM spends seconds loading and verifying the thousands of
classes a Spark session and its first streaming query need.  A dynamic CDS
archive (``-XX:ArchiveClassesAtExit``, JDK 13+) holds them pre-parsed; with
it a local session and its first query start about 4 s sooner, which is
most of what a restart after a crash costs beyond the first batch.

``python -m eop_spark.runtime.class_archive_training [PATH]`` builds one: a
short training run of the runtime (:mod:`eop_spark.runtime.class_archive_training`).
Runners use the first archive found (see :func:`find_archive`); none found means
the JVM starts as usual.  An archive of another JDK or Spark build is ignored by the JVM
(``-Xshare:auto``), and the cache key below keeps such archives apart anyway, as it
keeps apart the archives of two checkouts, whose JVMs start with different class paths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from importlib.metadata import version
from pathlib import Path

#: Where the application image keeps its archive.
IMAGE_ARCHIVE = Path("/opt/eop/spark-classes.jsa")


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found else None


def java_key() -> str:
    """A short key naming this JDK build (an archive only fits the JVM that wrote it)."""
    java = _java()
    if java is None:
        return "no-java"
    parts = [str(java)]
    for path in (java, *java.parent.parent.glob("lib/server/libjvm.so")):
        stat = path.stat()
        parts.append(f"{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def classpath_key() -> str:
    """A short key naming where Spark's jars are (``$SPARK_HOME``, else pyspark's package):
    a dynamic archive maps only into a JVM started with the class path it was written with,
    so two Spark homes (two virtualenvs) sharing one cache need one archive each."""
    home = os.environ.get("SPARK_HOME")
    spec = importlib.util.find_spec("pyspark")
    if home:
        where: Path | None = Path(home).resolve() / "jars"
    else:
        where = Path(spec.origin).resolve().parent / "jars" if spec and spec.origin else None
    return hashlib.sha256(str(where).encode()).hexdigest()[:8]


def cache_archive() -> Path:
    """The archive's place in the dev cache: per pyspark version, JDK build and class path."""
    cache = Path(os.environ.get("EOP_CACHE", Path.home() / ".cache" / "eop"))
    return cache / "spark-cds" / version("pyspark") / f"{java_key()}-{classpath_key()}.jsa"


def find_archive() -> Path | None:
    """The archive a runner's JVM should map, if any.

    ``$EOP_SPARK_CLASS_ARCHIVE`` (a path; empty turns archives off), else the
    image's, else the dev cache's.
    """
    explicit = os.environ.get("EOP_SPARK_CLASS_ARCHIVE")
    if explicit is not None:
        return Path(explicit) if explicit and Path(explicit).is_file() else None
    for candidate in (IMAGE_ARCHIVE, cache_archive()):
        if candidate.is_file():
            return candidate
    return None


def java_options(archive: Path | None) -> str:
    """Driver JVM options that map ``archive`` (nothing without one)."""
    if archive is None:
        return ""
    # -Xshare:auto (the default, spelled out): an archive that does not fit is skipped.
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto"
