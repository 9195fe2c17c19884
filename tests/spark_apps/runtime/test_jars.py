"""Finding the connector jars without any user setting."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from devenv.versions import versions
from eop_spark.contract.errors import EnvironmentNotReady
from eop_spark.runtime.jars import checkpoint_jars, connector_jars

REPO = Path(__file__).resolve().parents[3]


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
    monkeypatch.setattr("eop_spark.runtime.jars.IMAGE_JARS_DIR", tmp_path / "no-image")
    assert connector_jars() == [cached / "spark-sql-kafka.jar"]


def test_no_jars_says_how_to_fetch_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EOP_SPARK_JARS", raising=False)
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr("eop_spark.runtime.jars.IMAGE_JARS_DIR", tmp_path / "no-image")
    with pytest.raises(EnvironmentNotReady, match=r"run devenv/fetch-jars\.sh spark"):
        connector_jars()
    monkeypatch.setenv("EOP_SPARK_JARS", str(tmp_path))
    with pytest.raises(EnvironmentNotReady, match="holds no jars"):
        connector_jars()


def test_one_spark_version_everywhere() -> None:
    """pyproject's pyspark pin, the installed pyspark and versions.env's SPARK_VERSION agree."""
    spark_version = versions()["SPARK_VERSION"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [d for d in project["optional-dependencies"]["spark"] if re.match(r"pyspark\b", d)]
    assert pins == [f"pyspark=={spark_version}"]
    assert version("pyspark") == spark_version


@pytest.mark.spark
def test_the_connector_is_the_release_of_pyspark(spark_jars: list[Path]) -> None:
    """The fetched connector and its token provider are exactly the installed pyspark's release."""
    names = {jar.name for jar in spark_jars}
    scala = versions()["SCALA_BINARY_VERSION"]
    for artifact in ("spark-sql-kafka-0-10", "spark-token-provider-kafka-0-10"):
        release = [n for n in names if n.startswith(f"{artifact}_{scala}-")]
        assert release == [f"{artifact}_{scala}-{version('pyspark')}.jar"], sorted(names)


def test_only_a_checkpoint_in_object_storage_brings_the_s3a_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EOP_S3A_JARS", raising=False)
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("eop_spark.runtime.jars.IMAGE_JARS_DIR", tmp_path / "no-image")
    assert checkpoint_jars("/var/lib/eop/checkpoint/gen-0") == []
    with pytest.raises(EnvironmentNotReady, match=r"needs Hadoop's S3A.*fetch-jars\.sh s3a"):
        checkpoint_jars("s3a://bucket/eop/ns/p/gen-0")
    cached = tmp_path / "cache" / "spark-s3a" / version("pyspark") / "jars"
    cached.mkdir(parents=True)
    (cached / "hadoop-aws.jar").write_text("")
    assert checkpoint_jars("s3a://bucket/eop/ns/p/gen-0") == [cached / "hadoop-aws.jar"]
