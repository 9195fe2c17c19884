"""Background processes of the dev environment: logged to a file, tied to their parent; run
as context managers and served in the foreground until Ctrl-C; and looking at, and ending,
processes by pid."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

PR_SET_PDEATHSIG = 1

#: Flags for the dev environment's JVMs (brokers, tools, test runners' Spark drivers): the
#: client compiler only, and one garbage collector thread. Their life is minutes of small
#: batches, where the optimising compiler's threads cost more CPU than its code saves; on a
#: 2-core machine they took a Spark session's start and first queries from ~35 s to ~15 s.
#: Flags only: what runs, and how it behaves, is the same.
QUICK_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different ports on 127.0.0.1 that nobody listens on right now."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM the child when the thread that started it ends (Linux).

    It fires when the spawning *thread* exits, so only use it for processes
    started from a thread that lives as long as they should.
    """
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn_logged(
    argv: Sequence[str],
    log: Path,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
    pass_fds: Sequence[int] = (),
) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Start ``argv`` with stdout and stderr appended to ``log`` under a header line.

    ``pass_fds`` stay open in the child (with their numbers). Returns the process and the open
    log file (the caller closes it once the process has ended).
    """
    log_file = log.open("ab")
    log_file.write(f"\n==== {time.strftime('%F %T')} {' '.join(argv)}\n".encode())
    log_file.flush()
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=new_session,
        pass_fds=tuple(pass_fds),
        preexec_fn=die_with_parent,
    )
    return popen, log_file


def terminate(popen: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM a child and wait for it; SIGKILL it if it is still there after ``timeout``."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


class Service(ABC):
    """A component of the dev environment that :meth:`start` brings up and :meth:`stop` ends.

    ``with Service(...) as service`` starts it on entry and stops it on exit; a start that
    fails stops what it started before the error propagates (``__exit__`` never runs then).
    """

    @abstractmethod
    def start(self) -> Self:
        """Bring the component up; return once it is usable."""

    @abstractmethod
    def stop(self) -> None:
        """End the component (idempotent)."""

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            # A part that came up (one node of three, a process before its readiness check)
            # would otherwise run on, unowned, for the rest of the session.
            with contextlib.suppress(Exception):
                self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def stop_on_signals() -> threading.Event:
    """An event that SIGINT (Ctrl-C) and SIGTERM set from now on, for an ``up`` command.

    Call it from the main thread before starting what the command serves, so that a signal
    during start-up ends the command once the start is over instead of interrupting it.
    """
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve_until_stopped(
    stop: threading.Event, alive: Callable[[], bool], interval: float = 1.0
) -> bool:
    """Wait until ``stop`` is set (True) or, checked every ``interval`` s, ``alive()`` is not
    (False: what the command serves has exited by itself)."""
    while not stop.wait(interval):
        if not alive():
            return False
    return True


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of the log ``path`` (or why there are none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def cmdline(pid: int) -> list[str]:
    """The command line of process ``pid`` (empty if it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def kill_and_wait(pids: Sequence[int], timeout: float = 10.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        alive = [p for p in pids if pid_alive(p)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(pid_alive(p) for p in alive):
            time.sleep(0.1)


def sigkill_and_wait(pids: Sequence[int], timeout: float = 5.0) -> None:
    """SIGKILL ``pids`` (a machine losing power) and wait until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, names it uniquely."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[19]
    except (OSError, IndexError):
        return None
