"""Bad input fails fast, with one clear line on stderr, and writes nothing readers can see."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devenv.runners import Pipeline, Runner, produce
from tests.spark_apps.conftest import PipelineFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def assert_one_error_line(runner: Runner, exit_code: int, *fragments: str) -> str:
    assert runner.wait(240) == exit_code, runner.tail()
    lines = runner.stderr.splitlines()
    assert len(lines) == 1, runner.tail()
    assert lines[0].startswith("eop: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def with_input(pipeline: Pipeline) -> Pipeline:
    produce(pipeline.broker, pipeline.source_topic, ((f"k{i}", "v", i % 4) for i in range(100)))
    return pipeline


def test_unreachable_broker_fails_within_30s(
    make_pipeline: PipelineFactory, tmp_path: Path
) -> None:
    pipeline = make_pipeline()
    config = pipeline.config()
    config["source"]["kafka"]["bootstrapServers"] = "127.0.0.1:1"
    termination_log = tmp_path / "termination-log"
    started = time.monotonic()
    runner = pipeline.start(config, env={"EOP_TERMINATION_LOG": str(termination_log)})
    line = assert_one_error_line(runner, 3, "cannot reach the source Kafka cluster at 127.0.0.1:1")
    assert time.monotonic() - started < 30
    assert termination_log.read_text().strip() == line


@pytest.mark.parametrize("missing", ["source", "sink"])
def test_missing_topic_is_named(make_pipeline: PipelineFactory, missing: str) -> None:
    pipeline = make_pipeline()
    config = pipeline.config()
    if missing == "source":
        config["source"]["kafka"]["topics"] = ["no-such-input"]
    else:
        config["sink"]["kafka"]["topic"] = "no-such-output"
    started = time.monotonic()
    runner = pipeline.start(config)
    topic = "no-such-input" if missing == "source" else "no-such-output"
    servers = pipeline.broker.bootstrap_servers
    assert_one_error_line(runner, 3, f"{missing} topic '{topic}' does not exist on {servers}")
    assert time.monotonic() - started < 30


def test_bad_transforms_fail_before_writing(make_pipeline: PipelineFactory, tmp_path: Path) -> None:
    invalid_sql = with_input(make_pipeline())
    no_value = with_input(make_pipeline())
    temp = tmp_path / "tmp"
    temp.mkdir()
    # What a killed driver of the pod left in its scratch directory.
    scratch = tmp_path / "scratch"
    (scratch / "spark-stale" / "userFiles-0").mkdir(parents=True)
    # Both need Spark to find out: run them side by side.
    runners = [
        invalid_sql.start(
            invalid_sql.config(transform={"sql": "SELECT value FRM source"}),
            env={"TMPDIR": str(temp)},
        ),
        no_value.start(
            no_value.config(transform={"sql": "SELECT key FROM source"}),
            env={"EOP_SCRATCH_DIR": str(scratch)},
        ),
    ]
    assert_one_error_line(runners[0], 2, "invalid transform SQL", "PARSE_SYNTAX_ERROR")
    assert_one_error_line(runners[1], 2, "no 'value' column (columns: key)")
    assert invalid_sql.output() == [] and no_value.output() == []
    assert invalid_sql.progress() == {} and no_value.progress() == {}
    # A failed run leaves nothing behind in the temporary directory (its Spark log settings).
    assert not list(temp.glob("eop-spark-*"))
    assert not (scratch / "spark-stale").exists()
    assert any(m.startswith("removed 1 entries") for m in runners[1].messages()), runners[1].tail()
