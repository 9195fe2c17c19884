"""``python -m eop_spark``: malformed run configs fail at once with one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devenv.runners import REPO, runner_env
from eop_spark.__main__ import load_config


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


def test_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(
        json.dumps(
            {
                "pipeline": "a.b",
                "source": {"kafka": {"bootstrapServers": "h:1", "topics": ["i"]}},
                "transform": {"sql": "SELECT value FROM source"},
                "sink": {"kafka": {"bootstrapServers": "h:1", "topic": "o"}},
                "transactionalIdPrefix": "p",
                "progressGroup": "g",
                "checkpointRoot": "/c",
            }
        )
    )
    config = load_config(path, "/other", 3)
    assert config.checkpoint_location == "/other/gen-3"
