"""A Spark home at one place in the dev cache, shared by every checkout's Spark JVMs.

pyspark keeps Spark's launch scripts and jars in the virtualenv (``site-packages/pyspark``).
The JVM class archive of :mod:`eop_spark.speedups.class_archive` maps only into a JVM
started with the class path it was written with, and each checkout has its own
virtualenv: every fresh clone would train its own archive (a minute of a Spark JVM on
2 busy cores, in every CI run). So the dev environment's Spark JVMs (test runners, the
tests' own sessions, the archive's training) start from a copy of pyspark's ``bin/``,
``jars/`` and ``python/`` at ``$EOP_CACHE/spark-home/<pyspark version>-<digest of the
jars>``, made once per cache (hard links where the cache and the virtualenv share a file
system), through ``SPARK_HOME``. The Python side stays the virtualenv's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

from devenv.versions import cache_root

#: What a Spark home needs from pyspark's package: the launch scripts, the jars, the
#: Python archives Spark puts on its Python workers' path.
PARTS = ("bin", "jars", "python")
#: Written last into a finished copy.
COMPLETE = ".complete"


def pyspark_home() -> Path:
    """pyspark's own Spark home: the installed package's directory."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed")
    return Path(spec.origin).resolve().parent


def shared_spark_home() -> Path:
    """The cache's copy of pyspark's Spark home for this pyspark (made if missing)."""
    source = pyspark_home()
    jars = sorted((source / "jars").glob("*.jar"))
    digest = hashlib.sha256(
        "|".join(f"{j.name}:{j.stat().st_size}" for j in jars).encode()
    ).hexdigest()[:12]
    target = cache_root() / "spark-home" / f"{version('pyspark')}-{digest}"
    if (target / COMPLETE).is_file():
        return target
    with _locked(target):
        if not (target / COMPLETE).is_file():
            _copy(source, target)
    return target


@contextlib.contextmanager
def _locked(target: Path) -> Iterator[None]:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _copy(source: Path, target: Path) -> None:
    """Copy (or hard-link) :data:`PARTS` of ``source`` to ``target``, whole or not at all."""
    shutil.rmtree(target, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        for part in PARTS:
            shutil.copytree(source / part, work / part, copy_function=_link_or_copy)
        (work / COMPLETE).touch()
        work.chmod(0o755)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
