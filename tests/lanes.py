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
stops every lane (each tears its components down).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from tests.plugins.lifetimes import LANES

REPO = Path(__file__).resolve().parent.parent
#: pytest's exit status when it selected no test.
NO_TESTS = 5


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


def main(argv: list[str], root: Path = REPO) -> int:
    """Start every lane in ``root`` with ``argv`` as extra pytest arguments; wait; the combined
    status. Logs and temporary directories go to ``root/.eop/suite``."""
    out = root / ".eop" / "suite"
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    pumps = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # pytest tears down on SIGINT

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
        pump = threading.Thread(target=_pump, args=(lane, proc, out / f"{lane}.log"))
        pump.start()
        pumps.append(pump)

    codes = {lane: proc.wait() for lane, proc in procs.items()}
    for pump in pumps:
        pump.join()
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
