"""The Python worker daemon drops Spark's archives from the path only when it is safe."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eop_spark import worker_daemon


def spark_home(root: Path) -> Path:
    (root / "python" / "lib").mkdir(parents=True)
    (root / "jars").mkdir()
    for archive in ("python/lib/pyspark.zip", "python/lib/py4j-src.zip", "jars/spark-core.jar"):
        (root / archive).write_bytes(b"PK")
    return root


def test_only_existing_archives_under_spark_home_count(tmp_path: Path) -> None:
    home = spark_home(tmp_path / "spark")
    (tmp_path / "user.zip").write_bytes(b"PK")
    path = [
        str(home / "python/lib/pyspark.zip"),
        str(home / "jars/spark-core.jar"),
        str(home / "python/lib/missing.zip"),
        str(tmp_path / "user.zip"),
        str(tmp_path),
    ]
    assert worker_daemon.spark_archives(path, str(home)) == path[:2]
    assert worker_daemon.spark_archives(path, None) == []


def test_archives_leave_the_path_when_pyspark_imports_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = spark_home(tmp_path / "spark")
    archive = str(home / "python/lib/pyspark.zip")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(sys, "path", [archive, *sys.path])
    monkeypatch.setitem(sys.path_importer_cache, archive, None)
    assert worker_daemon.drop_spark_archives() == [archive]  # this venv has pyspark and py4j
    assert archive not in sys.path
    assert archive not in sys.path_importer_cache


def test_archives_stay_when_pyspark_lives_only_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = spark_home(tmp_path / "spark")
    archive = str(home / "python/lib/pyspark.zip")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setattr(sys, "path", [archive, str(tmp_path)])
    assert worker_daemon.drop_spark_archives() == []
    assert sys.path == [archive, str(tmp_path)]
