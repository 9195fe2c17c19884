"""Which JVM class archive a runner maps: explicit, the image's, the dev cache's, or none."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from eop_spark.speedups import class_archive


def test_the_cache_archive_is_keyed_by_spark_jdk_and_class_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EOP_CACHE", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    path = class_archive.cache_archive()
    assert path.parent.parent == tmp_path / "spark-cds"
    assert path.name.startswith(class_archive.java_key())
    # Another checkout's virtualenv (pyspark's jars elsewhere) has an archive of its own: the
    # JVM refuses to map an archive written with another class path.
    other = tmp_path / "other-venv" / "pyspark" / "__init__.py"
    monkeypatch.setattr(
        class_archive.importlib.util,
        "find_spec",
        lambda name: SimpleNamespace(origin=str(other)),
    )
    assert class_archive.cache_archive() != path


def test_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(class_archive, "IMAGE_ARCHIVE", tmp_path / "image.jsa")
    monkeypatch.delenv("EOP_SPARK_CLASS_ARCHIVE", raising=False)
    assert class_archive.find_archive() is None
    cached = class_archive.cache_archive()
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    assert class_archive.find_archive() == cached
    (tmp_path / "image.jsa").write_bytes(b"x")
    assert class_archive.find_archive() == tmp_path / "image.jsa"
    explicit = tmp_path / "explicit.jsa"
    monkeypatch.setenv("EOP_SPARK_CLASS_ARCHIVE", str(explicit))
    assert class_archive.find_archive() is None  # named but missing: none, not another one
    explicit.write_bytes(b"x")
    assert class_archive.find_archive() == explicit
    monkeypatch.setenv("EOP_SPARK_CLASS_ARCHIVE", "")
    assert class_archive.find_archive() is None


def test_the_cache_archive_follows_spark_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JVM started from ``$SPARK_HOME`` has that home's jars on its class path: the archive
    is keyed by it, whichever virtualenv pyspark's Python side comes from."""
    monkeypatch.setenv("EOP_CACHE", str(tmp_path))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "home"))
    shared = class_archive.cache_archive()
    other = tmp_path / "other-venv" / "pyspark" / "__init__.py"
    monkeypatch.setattr(
        class_archive.importlib.util,
        "find_spec",
        lambda name: SimpleNamespace(origin=str(other)),
    )
    assert class_archive.cache_archive() == shared
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "another-home"))
    assert class_archive.cache_archive() != shared
