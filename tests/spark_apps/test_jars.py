"""Finding the connector jars without any user setting."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from eop_spark.errors import EnvironmentNotReady
from eop_spark.jars import connector_jars


def jar_dir(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "spark-sql-kafka.jar").write_text("")
    return root


def test_eop_spark_jars_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = jar_dir(tmp_path / "explicit")
    jar_dir(tmp_path / "cache" / "spark-kafka" / version("pyspark") / "jars")
    monkeypatch.setenv("EOP_SPARK_JARS", str(explicit))
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    assert connector_jars() == [explicit / "spark-sql-kafka.jar"]


def test_the_cache_keyed_by_the_pyspark_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = jar_dir(tmp_path / "cache" / "spark-kafka" / version("pyspark") / "jars")
    monkeypatch.delenv("EOP_SPARK_JARS", raising=False)
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("eop_spark.jars.IMAGE_JARS_DIR", tmp_path / "no-image")
    assert connector_jars() == [cached / "spark-sql-kafka.jar"]


def test_no_jars_says_how_to_fetch_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EOP_SPARK_JARS", raising=False)
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr("eop_spark.jars.IMAGE_JARS_DIR", tmp_path / "no-image")
    with pytest.raises(EnvironmentNotReady, match=r"run devenv/fetch-jars\.sh spark"):
        connector_jars()
    monkeypatch.setenv("EOP_SPARK_JARS", str(tmp_path))
    with pytest.raises(EnvironmentNotReady, match="holds no jars"):
        connector_jars()
