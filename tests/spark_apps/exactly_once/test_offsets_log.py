"""Reading Spark's offsets log: formats as Spark 4 writes them, and a checkpoint directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eop_spark.exactly_once.offsets_log import (
    CheckpointFormatError,
    LocalFiles,
    OffsetsLog,
    batch_ids,
    is_local,
    parse_initial_offsets_file,
    parse_offsets_file,
)

METADATA = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {"a": "b"}})


def offsets_file(source_line: str) -> str:
    return f"v1\n{METADATA}\n{source_line}"


def test_parse_offsets_file() -> None:
    assert parse_offsets_file(offsets_file('{"in":{"1":5,"0":7}}')) == {("in", 0): 7, ("in", 1): 5}
    assert parse_offsets_file(offsets_file("-")) == {}


def test_parse_initial_offsets_skips_the_leading_nul_byte() -> None:
    # Spark's Kafka source writes a NUL before "v1" in sources/0/0.
    assert parse_initial_offsets_file('\x00v1\n{"in":{"0":0}}') == {("in", 0): 0}


@pytest.mark.parametrize(
    "text", ["v9\nx\n{}", "", f"v1\n{METADATA}\n{{}}\n{{}}", f"v1\n{METADATA}"]
)
def test_unknown_versions_and_multiple_sources_are_refused(text: str) -> None:
    with pytest.raises(CheckpointFormatError):
        parse_offsets_file(text)


def test_batch_ids_ignore_crc_and_temp_files() -> None:
    assert batch_ids(["1", ".1.crc", "0", "10", "tmp"]) == [0, 1, 10]


def test_is_local() -> None:
    assert is_local("/data/ckpt") and is_local("file:///data/ckpt") and is_local("rel/dir")
    assert not is_local("s3a://bucket/ckpt") and not is_local("hdfs://nn/ckpt")


def make_checkpoint(root: Path) -> None:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "sources" / "0").mkdir(parents=True)
    (root / "metadata").write_text('{"id":"q-123"}')
    (root / "sources" / "0" / "0").write_text('\x00v1\n{"in":{"0":0,"1":0}}')
    (root / "offsets" / "0").write_text(offsets_file('{"in":{"0":10,"1":12}}'))
    (root / "offsets" / "1").write_text(offsets_file('{"in":{"0":20,"1":12}}'))
    (root / "offsets" / ".1.crc").write_text("x")
    (root / "commits" / "0").write_text("v1\n{}")


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_offsets_log_of_a_checkpoint(tmp_path: Path, prefix: str) -> None:
    make_checkpoint(tmp_path / "gen-0")
    log = OffsetsLog(f"{prefix}{tmp_path}/gen-0", LocalFiles())
    assert not log.is_new()
    assert log.query_id() == "q-123"
    assert log.batches() == [0, 1] and log.committed_batches() == [0]
    assert log.start_offsets(0) == {("in", 0): 0, ("in", 1): 0}
    assert log.end_offsets(0) == log.start_offsets(1) == {("in", 0): 10, ("in", 1): 12}
    assert log.end_offsets(1) == {("in", 0): 20, ("in", 1): 12}
    with pytest.raises(CheckpointFormatError):
        log.end_offsets(2)


def test_a_missing_checkpoint_is_new(tmp_path: Path) -> None:
    assert OffsetsLog(str(tmp_path / "nothing"), LocalFiles()).is_new()
