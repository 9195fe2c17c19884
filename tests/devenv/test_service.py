"""A dev-environment component whose start fails leaves nothing of itself running."""

from __future__ import annotations

import subprocess
import sys
from typing import Self

import pytest

from devenv.processes import Service


class _TwoProcesses(Service):
    """Starts one long-lived process, then fails before the second (as one node of three)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> Self:
        self.procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        raise RuntimeError("the second one never became ready")

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def test_a_start_that_fails_stops_what_it_started() -> None:
    service = _TwoProcesses()
    with pytest.raises(RuntimeError, match="never became ready"), service:
        pass
    assert [p.poll() for p in service.procs] != [None], "the first process runs on"
