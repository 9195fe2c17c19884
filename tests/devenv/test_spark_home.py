"""The dev cache's Spark home: one per pyspark build, shared by every checkout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devenv import spark_home


def _pyspark(root: Path, jar_bytes: bytes = b"jar") -> Path:
    """A pyspark package's Spark home parts under ``root``."""
    package = root / "site-packages" / "pyspark"
    for part in spark_home.PARTS:
        (package / part).mkdir(parents=True)
    (package / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (package / "jars" / "spark-core.jar").write_bytes(jar_bytes)
    (package / "python" / "pyspark.zip").write_bytes(b"zip")
    return package


def test_two_checkouts_share_one_spark_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    first = _pyspark(tmp_path / "checkout-1")
    monkeypatch.setattr(spark_home, "pyspark_home", lambda: first)
    home = spark_home.shared_spark_home()
    assert home.parent == tmp_path / "cache" / "spark-home"
    assert (home / "bin" / "spark-submit").read_text() == "#!/bin/sh\n"
    assert (home / "jars" / "spark-core.jar").read_bytes() == b"jar"
    assert (home / "python" / "pyspark.zip").is_file()
    made = os.stat(home / "jars" / "spark-core.jar").st_mtime_ns

    # Another checkout with the same pyspark build: the same home, its jars untouched (the
    # class archive checks their times and sizes).
    second = _pyspark(tmp_path / "checkout-2")
    monkeypatch.setattr(spark_home, "pyspark_home", lambda: second)
    assert spark_home.shared_spark_home() == home
    assert os.stat(home / "jars" / "spark-core.jar").st_mtime_ns == made

    # Another build of Spark's jars: a home of its own.
    third = _pyspark(tmp_path / "checkout-3", jar_bytes=b"another jar")
    monkeypatch.setattr(spark_home, "pyspark_home", lambda: third)
    assert spark_home.shared_spark_home() != home


def test_an_interrupted_copy_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    package = _pyspark(tmp_path / "checkout")
    monkeypatch.setattr(spark_home, "pyspark_home", lambda: package)
    home = spark_home.shared_spark_home()
    (home / spark_home.COMPLETE).unlink()  # as if the copy had stopped half way
    (home / "jars" / "spark-core.jar").unlink()
    assert spark_home.shared_spark_home() == home
    assert (home / "jars" / "spark-core.jar").read_bytes() == b"jar"
