"""The output contract of Spark's Kafka sink, checked before anything runs."""

from __future__ import annotations

import pytest

from eop_spark.contract.errors import ConfigError
from eop_spark.exactly_once.sink_contract import (
    PROVENANCE_COLUMNS,
    OutputLayout,
    has_provenance,
    output_layout,
)

HEADERS = "array<struct<key:string,value:binary>>"


def test_value_alone_or_with_every_optional_column() -> None:
    assert output_layout([("value", "binary")]) == OutputLayout()
    full = output_layout(
        [
            ("key", "string"),
            ("value", "string"),
            ("headers", HEADERS),
            ("partition", "int"),
            ("topic", "string"),
            ("extra", "double"),
        ]
    )
    assert full == OutputLayout(has_key=True, has_headers=True, has_partition=True)
    assert full.columns() == ["value", "key", "headers", "partition"]


def test_missing_value_names_the_columns_there_are() -> None:
    with pytest.raises(ConfigError, match=r"no 'value' column \(columns: key, n\)"):
        output_layout([("key", "string"), ("n", "bigint"), ("__eop_src_offset", "bigint")])


@pytest.mark.parametrize(
    "fields",
    [
        [("value", "int")],
        [("value", "string"), ("key", "array<string>")],
        [("value", "string"), ("partition", "bigint")],
        [("value", "string"), ("headers", "map<string,string>")],
    ],
)
def test_wrong_types_are_config_errors(fields: list[tuple[str, str]]) -> None:
    with pytest.raises(ConfigError, match="needs"):
        output_layout(fields)


def test_provenance() -> None:
    assert has_provenance([("value", "string"), *((c, "x") for c in PROVENANCE_COLUMNS)])
    assert not has_provenance([("value", "string"), ("__eop_src_topic", "string")])
