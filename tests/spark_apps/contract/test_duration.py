"""Spec durations are read once: numbers in the run, the text as written on the wire."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.spec import Duration


def _config(tmp_path: Path, **sink: object) -> RunConfig:
    data = RunConfig.offline("default.p", str(tmp_path / "cp"), "SELECT value FROM source")
    wire = data.model_dump(mode="json", by_alias=True, exclude_none=True)
    wire["sink"]["kafka"].update(sink)
    return RunConfig.model_validate_json(json.dumps(wire))


def test_a_duration_is_a_number_in_the_run_and_its_text_in_run_json(tmp_path: Path) -> None:
    config = _config(tmp_path, transactionTimeout="2m")
    timeout = config.sink.kafka.transaction_timeout
    assert (timeout.ms, timeout.seconds) == (120_000, 120.0)
    wire = config.model_dump(mode="json", by_alias=True)
    assert wire["sink"]["kafka"]["transactionTimeout"] == "2m"
    assert type(config.model_dump()["sink"]["kafka"]["transaction_timeout"]) is str
    # Unset, the defaults are durations too: 60 s, and a 10 s trigger interval.
    config = RunConfig.offline("default.p", str(tmp_path / "cp"), "SELECT value FROM source")
    assert config.sink.kafka.transaction_timeout.ms == 60_000
    assert config.trigger.interval.ms == 10_000


def test_a_duration_reaches_spark_tasks_with_its_milliseconds() -> None:
    shipped = pickle.loads(pickle.dumps(Duration("90s")))
    assert type(shipped) is Duration and shipped == "90s" and shipped.ms == 90_000


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("60", "sink.kafka.transactionTimeout: String should match pattern"),
        ("500ms", "transactionTimeout must be at least 1s"),
    ],
)
def test_a_bad_duration_is_named(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _config(tmp_path, transactionTimeout=value)
    (error,) = caught.value.errors()
    where = ".".join(str(p) for p in error["loc"])
    assert message in f"{where}: {error['msg']}"
