"""pytest plugin: which processes the suite's CPU goes to, per kind and per test.

The suite runs on 2 cores, and most of its time is CPU-bound: a test waits on JVMs that
start, compile and run batches, on brokers, on the control plane. This sampler reads every
process's CPU time from ``/proc`` once a second and adds each one's increase to its kind
(:func:`kind_of`: Spark driver JVMs, brokers, the control plane, kubelets and containers,
the operator, ...), for the whole run and for the test running at the time. A process that
exits between two samples loses at most its last second. It counts every process on the
machine, so its figures mean something on a machine that runs only the suite.

``suite_clock`` prints the totals at the end and writes them (and each test's) into its
``--suite-clock`` JSON file.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest

#: Seconds between two samples (the environment's ``EOP_SUITE_CPU_INTERVAL`` sets another).
INTERVAL_S = float(os.environ.get("EOP_SUITE_CPU_INTERVAL", "1.0"))

#: (substring of a command line, kind), first match wins.
KINDS: tuple[tuple[str, str], ...] = (
    ("org.apache.spark.deploy.SparkSubmit", "spark driver JVMs"),
    ("org.apache.spark", "spark JVMs (pods)"),
    ("kafka.Kafka ", "kafka brokers"),
    ("/kafka/", "kafka tools"),
    ("pyspark.daemon", "python workers"),
    ("worker_daemon", "python workers"),
    ("eop_spark", "eop runners (python)"),
    ("eop_operator", "operator"),
    ("kube-apiserver", "control plane"),
    ("kube-controller-manager", "control plane"),
    ("kube-scheduler", "control plane"),
    ("/etcd", "control plane"),
    ("kubelet", "nodes"),
    ("containerd", "nodes"),
    ("runc", "nodes"),
    ("kube-proxy", "nodes"),
    ("coredns", "nodes"),
    ("/weed", "s3"),
    ("pytest", "pytest"),
    ("kubectl", "kubectl and helm"),
    ("helm", "kubectl and helm"),
    ("java", "other JVMs"),
)

_TICKS = os.sysconf("SC_CLK_TCK")


def kind_of(cmdline: str) -> str:
    """The kind a process counts as, from its command line."""
    for needle, kind in KINDS:
        if needle in cmdline:
            return kind
    return "other"


def _cpu_seconds(pid: str) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _cmdline(pid: str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


class CpuSampler:
    """A thread adding each process's CPU seconds to its kind, in total and per test."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.per_test: dict[str, dict[str, float]] = {}
        self.current: str | None = None
        self._seen: dict[str, tuple[str, float]] = {}  # pid -> (kind, cpu seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="suite-cpu", daemon=True)

    def start(self) -> None:
        """Take the first sample (what ran before counts for nothing) and start sampling."""
        self._sample(count=False)
        self._thread.start()

    def stop(self) -> None:
        """Take a last sample and stop."""
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample()

    def _sample(self, *, count: bool = True) -> None:
        seen: dict[str, tuple[str, float]] = {}
        test = self.current
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            cpu = _cpu_seconds(pid)
            if cpu is None:
                continue
            before = self._seen.get(pid)
            kind = before[0] if before else kind_of(_cmdline(pid))
            seen[pid] = (kind, cpu)
            spent = cpu - (before[1] if before else 0.0)
            if not count or spent <= 0:
                continue
            self.total[kind] += spent
            if test is not None:
                per = self.per_test.setdefault(test, defaultdict(float))
                per[kind] += spent
        self._seen = seen


_SAMPLER = pytest.StashKey[CpuSampler]()


def sampler(config: pytest.Config) -> CpuSampler | None:
    """This session's sampler (None where ``/proc`` is missing)."""
    return config.stash.get(_SAMPLER, None)


def pytest_configure(config: pytest.Config) -> None:
    """Start sampling (on Linux)."""
    if Path("/proc/self/stat").exists():
        config.stash[_SAMPLER] = CpuSampler()
        config.stash[_SAMPLER].start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Count what runs meanwhile against this test."""
    cpu = sampler(item.config)
    if cpu is not None:
        cpu.current = item.nodeid
    try:
        return (yield)
    finally:
        if cpu is not None:
            cpu.current = None


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop sampling."""
    cpu = sampler(config)
    if cpu is not None:
        cpu.stop()
