"""The import contracts hold: the rooms of the code import only what docs/architecture.md says.

``make lint`` runs the same check; this keeps ``make test`` from passing on a tree
that breaks one (the contracts are in ``pyproject.toml``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_import_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
