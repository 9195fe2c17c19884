"""``python -m eop_spark`` and ``eop run``: a bad run config fails at once, one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from devenv.runners import REPO, runner_env
from eop_operator.cli import main as eop_main
from eop_spark.__main__ import main as eop_spark_main
from eop_spark.contract.run_config import RunConfig
from eop_spark.runtime import runner


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eop_spark", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=runner_env(),
        cwd=REPO,
        check=False,
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid run config"),
        (json.dumps({"pipeline": "a.b"}), "source: Field required"),
        (
            json.dumps(
                {
                    "pipeline": "a.b",
                    "source": {"kafka": {"bootstrapServers": "h:1"}},
                    "transform": {"sql": "SELECT 1"},
                    "sink": {"kafka": {"bootstrapServers": "h:1", "topic": "o"}},
                    "transactionalIdPrefix": "p",
                    "progressGroup": "g",
                    "checkpointRoot": "/c",
                }
            ),
            "exactly one of topics or topicPattern",
        ),
    ],
)
def test_malformed_config_is_one_line_and_exit_2(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(content)
    result = run_cli("run", "--config", str(path))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("eop: error: invalid run config") and message in lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    result = run_cli("run", "--config", str(tmp_path / "nope.json"))
    assert result.returncode == 2
    assert result.stderr.startswith("eop: error: cannot read run config")


RUN_JSON = {
    "pipeline": "a.b",
    "source": {"kafka": {"bootstrapServers": "h:1", "topics": ["i"]}},
    "transform": {"sql": "SELECT value FROM source"},
    "sink": {"kafka": {"bootstrapServers": "h:1", "topic": "o"}},
    "transactionalIdPrefix": "p",
    "progressGroup": "g",
    "checkpointRoot": "/c",
}


@pytest.mark.parametrize("entry", [eop_spark_main, eop_main], ids=["python-m-eop_spark", "eop"])
def test_both_entries_override_the_run_config_by_one_rule(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    entry: Callable[[list[str]], int],
) -> None:
    """``python -m eop_spark run`` and the image's ``eop run --config``: the same overrides."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps(RUN_JSON))
    started: list[RunConfig] = []

    def run(config: RunConfig, *, log_format: str) -> int:
        started.append(config)
        return 0

    monkeypatch.setattr(runner, "run", run)
    assert (
        entry(["run", "--config", str(path), "--checkpoint-root", "/other", "--generation", "3"])
        == 0
    )
    (config,) = started
    assert config.checkpoint_location == "/other/gen-3"
    # An override the run config refuses is refused as the file's own setting would be.
    assert entry(["run", "--config", str(path), "--generation", "-1"]) == 2
    assert started == [config]
    assert capsys.readouterr().err.splitlines() == [
        f"eop: error: invalid run config {path}: generation: "
        "Input should be greater than or equal to 0"
    ]
