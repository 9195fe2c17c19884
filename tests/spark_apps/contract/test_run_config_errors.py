"""A run config the runner cannot use ends it at once: one line naming the setting."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import pytest

from eop_spark.__main__ import main
from eop_spark.contract.errors import EXIT_CONFIG, ConfigError
from eop_spark.contract.run_config import RunConfig


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], **source: object) -> str:
    config = RunConfig.offline("default.p", str(tmp_path / "cp"), "SELECT value FROM source")
    data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["source"]["kafka"].update(source)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    assert main(["run", "--config", str(path)]) == EXIT_CONFIG
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_a_starting_offset_that_is_not_a_number_is_named_not_a_python_exception(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _run(tmp_path, capsys, startingOffsets='{"none": {"0": "abc"}}')
    assert line.startswith("eop: error: invalid run config ")
    assert "source.kafka.startingOffsets: startingOffsets must be earliest, latest or" in line
    assert "offsets are numbers" in line
    assert "invalid literal" not in line and "Value error" not in line


def test_a_topic_pattern_python_cannot_compile_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _run(tmp_path, capsys, topics=None, topicPattern="raw(")
    assert "source.kafka: topicPattern 'raw(' is not a valid regex: missing )" in line


@pytest.mark.parametrize(
    ("module", "function", "expected"),
    [
        ("acme.nowhere", "clean", "transform.python.module 'acme.nowhere' cannot be imported"),
        (
            "eop_spark.examples.impressions",
            "count_impresions",
            "transform.python.function 'count_impresions' is not a function in "
            "eop_spark.examples.impressions",
        ),
    ],
)
def test_a_python_transform_the_image_lacks_is_named_by_its_setting(
    module: str, function: str, expected: str
) -> None:
    from eop_spark.query.transform import _apply_python

    with pytest.raises(ConfigError, match=re.escape(expected)):
        _apply_python(cast(Any, None), module, function)
