"""Read a Spark checkpoint's offsets log: what each micro-batch reads.

Spark writes ``offsets/N`` *before* batch N runs, and a re-run of batch N
(after a crash) reads exactly the same ranges; the sinks rely on this.  The
files are small text files::

    v1
    {"batchWatermarkMs":0,"batchTimestampMs":...,"conf":{...}}
    {"events":{"0":120,"1":118}}

one line per source after the metadata line (``-`` for a source without
offsets yet).  The first batch starts at the offsets in ``sources/0/0``
(written when the query first resolves its starting offsets).

Parsing is pure; :class:`CheckpointFiles` reads local paths directly and any
other URI (``s3a://``, ``hdfs://``) through Hadoop's FileSystem in the JVM.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from eop_spark.contract.offsets import Offsets, parse_spark_json

_SUPPORTED_VERSIONS = {"v1"}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class CheckpointFormatError(ValueError):
    """A checkpoint file is not in a format this runner understands."""


def _split_version(text: str, what: str) -> list[str]:
    lines = text.splitlines()
    if not lines or lines[0].strip() not in _SUPPORTED_VERSIONS:
        found = lines[0].strip() if lines else "(empty file)"
        raise CheckpointFormatError(f"{what}: unsupported log version {found!r}")
    return lines[1:]


def parse_offsets_file(text: str) -> Offsets:
    """Parse ``offsets/N`` of a query with ONE Kafka source into its end offsets."""
    lines = _split_version(text, "offsets log")
    sources = [line for line in lines[1:] if line.strip()]
    if len(sources) != 1:
        raise CheckpointFormatError(f"offsets log: expected one source, found {len(sources)}")
    if sources[0].strip() == "-":
        return {}
    return parse_spark_json(sources[0])


def parse_initial_offsets_file(text: str) -> Offsets:
    """Parse the Kafka source's ``sources/0/0``: where the first batch of the query starts."""
    # The Kafka source writes a leading NUL byte (kept for Spark 2.1 compatibility).
    body = _split_version(text.lstrip("\x00"), "initial offsets")
    lines = [line for line in body if line.strip()]
    if len(lines) != 1:
        raise CheckpointFormatError("initial offsets: expected one JSON line")
    return parse_spark_json(lines[0])


def batch_ids(names: list[str]) -> list[int]:
    """Batch ids among the file names of an ``offsets/`` or ``commits/`` directory, sorted."""
    return sorted(int(name) for name in names if name.isdigit())


class FileReader(Protocol):
    """Reads text files and lists directories of one checkpoint."""

    def read_text(self, path: str) -> str | None:
        """The file's content, or None if it does not exist."""

    def list_names(self, path: str) -> list[str]:
        """Names in a directory (empty if it does not exist)."""


class LocalFiles:
    """A checkpoint on the local file system (a path or a ``file:`` URI)."""

    def read_text(self, path: str) -> str | None:
        """The file's content, or None if it does not exist."""
        try:
            return Path(_local(path)).read_text()
        except FileNotFoundError:
            return None

    def list_names(self, path: str) -> list[str]:
        """Names in a directory (empty if it does not exist)."""
        directory = Path(_local(path))
        return [p.name for p in directory.iterdir()] if directory.is_dir() else []


class HadoopFiles:
    """A checkpoint on any Hadoop file system, read through the driver's JVM."""

    def __init__(self, spark: Any) -> None:
        self._jvm = spark.sparkContext._jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, path: str) -> tuple[Any, Any]:
        jpath = self._jvm.org.apache.hadoop.fs.Path(path)
        return jpath.getFileSystem(self._conf), jpath

    def read_text(self, path: str) -> str | None:
        """The file's content, or None if it does not exist."""
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return None
        stream = fs.open(jpath)
        try:
            data: bytes = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode()

    def list_names(self, path: str) -> list[str]:
        """Names in a directory (empty if it does not exist)."""
        fs, jpath = self._fs(path)
        if not fs.exists(jpath):
            return []
        return [status.getPath().getName() for status in fs.listStatus(jpath)]


def _local(path: str) -> str:
    for prefix in ("file://", "file:"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def is_local(location: str) -> bool:
    """Whether a checkpoint location is on the local file system."""
    return location.startswith("file:") or not _SCHEME.match(location)


@dataclass(frozen=True)
class OffsetsLog:
    """The offsets log of one checkpoint location."""

    location: str
    files: FileReader

    def _path(self, *parts: str) -> str:
        return "/".join([self.location.rstrip("/"), *parts])

    def query_id(self) -> str:
        """The id of the query this checkpoint belongs to (Spark's ``metadata`` file)."""
        text = self.files.read_text(self._path("metadata"))
        if text is None:
            raise CheckpointFormatError(f"no query metadata in {self.location}")
        return str(json.loads(text.splitlines()[0])["id"])

    def batches(self) -> list[int]:
        """Ids of the batches Spark has planned (written to ``offsets/``), sorted."""
        return batch_ids(self.files.list_names(self._path("offsets")))

    def committed_batches(self) -> list[int]:
        """Ids of the batches Spark has completed (written to ``commits/``), sorted."""
        return batch_ids(self.files.list_names(self._path("commits")))

    def is_new(self) -> bool:
        """Whether no batch was ever planned here: a new query starts at its starting offsets."""
        return not self.batches()

    def end_offsets(self, batch_id: int) -> Offsets:
        """``E_N``: the end (exclusive) offsets of batch ``batch_id``."""
        text = self.files.read_text(self._path("offsets", str(batch_id)))
        if text is None:
            raise CheckpointFormatError(
                f"offsets log of batch {batch_id} not found in {self.location}"
            )
        return parse_offsets_file(text)

    def start_offsets(self, batch_id: int) -> Offsets:
        """``S_N``: where batch ``batch_id`` starts (the previous batch's end, or the initial)."""
        if batch_id > 0:
            previous = self.files.read_text(self._path("offsets", str(batch_id - 1)))
            if previous is None:
                raise CheckpointFormatError(
                    f"offsets log of batch {batch_id - 1} not found in {self.location}"
                )
            return parse_offsets_file(previous)
        initial = self.files.read_text(self._path("sources", "0", "0"))
        return parse_initial_offsets_file(initial) if initial is not None else {}
