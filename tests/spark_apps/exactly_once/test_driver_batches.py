"""The coordinated sink's transport of output to the driver: Arrow batches packed into rows."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from eop_spark.exactly_once import coordinated
from eop_spark.exactly_once.coordinated import to_ipc_blobs


def _unpack(blobs: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    out = []
    for blob in blobs:
        for value in blob.column(0).to_pylist():
            with pa.ipc.open_stream(pa.py_buffer(value)) as reader:
                out.extend(reader)
    return out


def _batch(start: int, rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "value": [b"v%06d" % i + b"x" * 90 for i in range(start, start + rows)],
            "key": [None if i % 7 == 0 else b"k%d" % i for i in range(start, start + rows)],
        },
        schema=pa.schema([("value", pa.binary()), ("key", pa.binary())]),
    )


def test_rows_come_back_in_order_with_nulls() -> None:
    batches = [_batch(0, 1000), _batch(1000, 0), _batch(1000, 500)]
    unpacked = _unpack(list(to_ipc_blobs(iter(batches))))
    table = pa.Table.from_batches(unpacked)
    assert table.equals(pa.Table.from_batches(batches))


def test_a_large_batch_is_split_under_the_row_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinated, "BLOB_BYTES", 20_000)
    batch = _batch(0, 2000)  # ~200 kB of values
    blobs = list(to_ipc_blobs(iter([batch])))
    assert len(blobs) >= 10
    assert all(len(b.column(0)[0].as_py()) < 2 * 20_000 for b in blobs)
    assert pa.Table.from_batches(_unpack(blobs)).equals(pa.Table.from_batches([batch]))
