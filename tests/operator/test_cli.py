"""The eop command as a user runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from eop_operator.cli import EXIT_INVALID, main


def test_render_prints_the_objects(
    manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["render", str(path), "--image", "img:1"]) == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Service", "StatefulSet"]


def test_render_of_a_bad_manifest_is_one_clear_line(
    manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    del manifest["spec"]["sink"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["render", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "spec.sink: Field required" in err


def test_crd_prints_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "CustomResourceDefinition"
