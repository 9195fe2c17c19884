"""Run the suite as its lanes side by side: ``python -m tests.lanes [PYTEST ARGS...]``.

Each lane (:data:`tests.plugins.lifetimes.LANES`, chosen per test module by
:func:`~tests.plugins.lifetimes.lane_of`) is a pytest process of its own with its own
components: one runs the tests of the control plane and the local clusters, one those that
break brokers or runners for minutes (the replicated Kafka clusters, the chaos runs), one
the rest (one broker, Spark, the object store). A test's JVMs and components leave some of
2 cores idle while it waits (on a pod to start, a coordinator to move, a timeout to pass),
so the lanes together take far less than one after the other.

Each lane's output goes to ``.eop/suite/<lane>.log``, and to the terminal line by line with
the lane's name in front; each lane's own summary (failures, its suite clock) is printed
again at the end, and every test's phases and CPU are in ``.eop/suite/<lane>.json``. The
exit status is 0 only when every lane passed. The ceiling of ``tests/plugins/suite_clock.py``
holds for each lane, as each runs from start to end of the whole run. SIGINT or SIGTERM
stops every lane: each gets SIGINT (pytest tears its components down), and a lane still
running :data:`ESCALATION` seconds later gets SIGTERM, then SIGKILL, so that a stop always
ends the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

from tests.plugins.lifetimes import LANES

REPO = Path(__file__).resolve().parent.parent
#: pytest's exit status when it selected no test.
NO_TESTS = 5
#: After a stop was asked: (seconds, signal) for the process groups of lanes still running.
ESCALATION = ((10.0, signal.SIGTERM), (20.0, signal.SIGKILL))
#: Seconds to wait for a lane's output to end once the lane has exited (a process it left
#: behind may hold the pipe).
PUMP_GRACE_S = 30.0


def _command(lane: str, out: Path, args: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "--lane", lane,
        # Each lane its own temporary tree; no shared cache file written by both at once.
        "--basetemp", str(out / f"tmp-{lane}"), "-p", "no:cacheprovider",
        "--suite-clock", str(out / f"{lane}.json"),
        *args,
    ]  # fmt: skip


def _pump(lane: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Copy the lane's output to its log and, prefixed, to our stdout."""
    assert proc.stdout is not None
    width = max(len(name) for name in LANES)
    with log.open("wb") as out:
        for line in proc.stdout:
            out.write(line)
            out.flush()
            text = line.decode(errors="replace").rstrip("\n")
            sys.stdout.write(f"[{lane:<{width}}] {text}\n")
            sys.stdout.flush()


def _summary(log: Path) -> str:
    """The lane's own summary: from pytest's short test summary (or its last section) on."""
    lines = log.read_text(errors="replace").splitlines()
    for marker in ("suite clock", "short test summary info"):
        starts = [i for i, line in enumerate(lines) if marker in line and line.startswith("=")]
        if starts:
            return "\n".join(lines[starts[0] :])
    return "\n".join(lines[-15:])


def _signal(procs: Iterable[subprocess.Popen[bytes]], signum: int) -> None:
    """Send ``signum`` to the process group of each lane still running."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)


def _wait(procs: dict[str, subprocess.Popen[bytes]], stop_asked: list[float]) -> dict[str, int]:
    """Each lane's exit status, once all have exited; after a stop was asked, the lanes still
    running get the signals of :data:`ESCALATION` when their time comes."""
    sent: set[int] = set()
    while any(proc.poll() is None for proc in procs.values()):
        if stop_asked:
            waited = time.monotonic() - stop_asked[0]
            for after, signum in ESCALATION:
                if waited >= after and signum not in sent:
                    sent.add(signum)
                    _signal(procs.values(), signum)
        time.sleep(0.2)
    return {lane: int(proc.returncode) for lane, proc in procs.items()}


def main(argv: list[str], root: Path = REPO) -> int:
    """Start every lane in ``root`` with ``argv`` as extra pytest arguments; wait; the combined
    status. Logs and temporary directories go to ``root/.eop/suite``."""
    out = root / ".eop" / "suite"
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    pumps = []
    stop_asked: list[float] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        stop_asked.append(time.monotonic())
        _signal(procs.values(), signal.SIGINT)  # pytest tears down on SIGINT

    # Before the lanes start: a lane inherits an ignored SIGINT (as a background job of a
    # shell has it) but not a handler, so with ours in place each lane's pytest has Python's.
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    for lane in LANES:
        proc = subprocess.Popen(
            _command(lane, out, argv),
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a signal to us is forwarded, once, to each lane
        )
        procs[lane] = proc
        pump = threading.Thread(target=_pump, args=(lane, proc, out / f"{lane}.log"), daemon=True)
        pump.start()
        pumps.append(pump)

    codes = _wait(procs, stop_asked)
    for pump in pumps:
        pump.join(PUMP_GRACE_S)
    for lane in LANES:
        print(f"\n==== lane {lane}: exit {codes[lane]} ({out / f'{lane}.log'})")
        print(_summary(out / f"{lane}.log"))
    minutes = (time.monotonic() - began) / 60
    # A lane with no test selected (pytest's 5, e.g. for a path in the other lane) is no failure.
    failed = [lane for lane, code in codes.items() if code not in (0, NO_TESTS)]
    print(f"\n==== lanes {', '.join(LANES)}: {minutes:.1f} min; " + (
        f"FAILED: {', '.join(failed)}" if failed else "all passed"
    ))  # fmt: skip
    if failed:
        return codes[failed[0]]
    return NO_TESTS if all(code == NO_TESTS for code in codes.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
