"""The README's laptop quick start runs as written: a broker, sample impressions, ``eop run``.

The commands come from the README's own code block, so a README that changes
without this test breaks it.  Two things are changed, and only these: the broker's
port (9092 in the README) is a free one, and its directory (``/tmp/kafka``) is the
test's; the commands run from a directory that links to this repository's
``.venv``, ``spark_apps`` and ``devenv``, so ``eop run``'s checkpoint (``./.eop``)
is the test's too.  ``make setup deps`` is what the test environment already did.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from devenv.processes import free_port
from devenv.runners import BrokerAddress, kill_session, read_committed

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Quick start on a laptop"
README_PORT = "9092"
README_DIR = "/tmp/kafka"
SETUP = "make setup deps"


def quick_start_commands() -> list[str]:
    """The commands of the first ``sh`` block after the laptop quick start's heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION) :]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None, f"no sh block under {SECTION!r}"
    commands = []
    for line in block.group(1).replace("\\\n", " ").splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()  # comments: two spaces, then #
        if command:
            commands.append(command)
    return commands


@pytest.mark.slow
def test_the_laptop_quick_start_cleans_the_sample_impressions(tmp_path: Path) -> None:
    commands = quick_start_commands()
    assert [c.split()[:2] for c in commands] == [
        ["make", "setup"],
        [".venv/bin/python", "-m"],
        [".venv/bin/python", "-m"],
        [".venv/bin/eop", "run"],
    ], commands
    setup, broker_cmd, produce_cmd, run_cmd = commands
    assert setup == SETUP
    assert broker_cmd.endswith("&"), "the broker runs in the background"
    assert all(README_PORT in c for c in (broker_cmd, produce_cmd, run_cmd))
    assert README_DIR in broker_cmd
    port = str(free_port())

    def local(command: str) -> str:
        return command.replace(README_PORT, port).replace(README_DIR, str(tmp_path / "kafka"))

    work = tmp_path / "repo"
    work.mkdir()
    for name in (".venv", "spark_apps", "devenv"):
        (work / name).symlink_to(ROOT / name)
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, command: str) -> subprocess.Popen[bytes]:
        # exec: the command is the process the test signals, as a shell's job would be.
        with (logs / f"{name}.out").open("wb") as out:
            return subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=work,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def log(name: str) -> str:
        return (logs / f"{name}.out").read_text(errors="replace")[-4000:]

    broker = start("broker", local(broker_cmd).removesuffix("&").strip())
    runner = None
    try:
        produced = subprocess.run(
            ["bash", "-c", local(produce_cmd)],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert produced.returncode == 0, produced.stdout + produced.stderr + log("broker")
        match = re.search(r"wrote (\d+) impressions to (\S+) \((\d+) kept", produced.stdout)
        assert match is not None, produced.stdout
        written, kept = int(match.group(1)), int(match.group(3))
        assert written == int(shlex.split(produce_cmd)[-1])
        assert 0 < kept < written  # the sample holds bots and broken events to drop

        runner = start("eop-run", local(run_cmd))
        brokers = BrokerAddress(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 420
        output: list[tuple[bytes | None, bytes | None]] = []
        while len(output) < kept:
            assert runner.poll() is None, f"eop run exited ({runner.returncode})\n{log('eop-run')}"
            assert time.monotonic() < deadline, f"{len(output)} of {kept}\n{log('eop-run')}"
            time.sleep(2)
            output = read_committed(brokers, "impressions-clean")
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(120) == 0, log("eop-run")
        keys = Counter(key for key, _ in output)
        assert len(output) == kept and max(keys.values()) == 1, keys.most_common(3)
        assert all(key is not None and key.startswith(b"i-") for key in keys)
    finally:
        for process in (runner, broker):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    kill_session(process.pid)
