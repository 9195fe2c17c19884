"""Benchmark: from `kubectl apply` of a pipeline to its StatefulSet existing and status written.

Starts a real control plane (etcd, kube-apiserver, controller-manager), installs
the CRD, runs `eop operator` as a subprocess, then creates N pipelines, first
one at a time (latency without contention), then all in one `kubectl apply`
(a burst), then restarts the operator with those pipelines live (their
StatefulSets deleted while it was down: the time until every one is back is
the time until the new operator has looked at every pipeline).  Two watches
record when each StatefulSet first appears and when each pipeline's status
first carries a spec hash.  Prints p50/p99 of both, the CPU seconds the
operator and the API server spent in each phase, and the operator's peak
resident memory (VmHWM).  ``--count-requests`` turns on the API server's audit
log and prints the operator's requests per pipeline in each phase, by verb
and resource, with the API server's mean time to answer each.

``kubectl apply`` creates a manifest's objects one after the other, so most of
a burst's latency on a loaded machine is kubectl's; ``--create concurrent``
creates the burst's pipelines as a GitOps controller with parallel workers
does (server-side apply, 16 at a time).  Either way the burst also prints
"pipeline exists -> StatefulSet exists" and "-> status written": the
operator's share.  ``--phases burst,restart`` leaves out the slow first phase.

    .venv/bin/python -m bench.operator_apply [--pipelines 100] [--count-requests]
        [--create kubectl|concurrent] [--phases one-by-one,burst,restart]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import datetime
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from devenv.kube import ControlPlane, audit_entries, build_binaries
from eop_operator.kube.client import FIELD_MANAGER
from eop_operator.render.naming import PIPELINE_LABEL

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "exactlyoncepipelines.exactlyonce.io.yaml"


def _pipeline(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name},
        "spec": {
            "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
        },
    }


def _https(cp: ControlPlane) -> ssl.SSLContext:
    """TLS as the cluster admin (the watches and the concurrent creator)."""
    context = ssl.create_default_context(cafile=str(cp.ca_cert))
    context.load_cert_chain(cp.pki_dir / "admin.crt", cp.pki_dir / "admin.key")
    return context


#: Parallel workers of ``--create concurrent`` (Argo CD's and Flux's are of this order).
CREATE_WORKERS = 16


def _create_concurrently(cp: ControlPlane, namespace: str, names: list[str]) -> None:
    """Server-side apply each pipeline, ``CREATE_WORKERS`` requests at a time."""
    context = _https(cp)
    base = f"{cp.server}/apis/exactlyonce.io/v1alpha1/namespaces/{namespace}/exactlyoncepipelines"

    def create(name: str) -> None:
        request = urllib.request.Request(
            f"{base}/{name}?fieldManager=bench&force=true",
            data=json.dumps(_pipeline(name)).encode(),
            method="PATCH",
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        with urllib.request.urlopen(request, context=context, timeout=60) as reply:
            reply.read()

    with concurrent.futures.ThreadPoolExecutor(CREATE_WORKERS) as pool:
        list(pool.map(create, names))


class Watcher(threading.Thread):
    """Watch a collection; record when each object first meets each condition.

    A watch costs the API server little (a list polled every 100 ms of a hundred
    pipelines cost it about a third of its CPU in a burst); each event is one
    line the API server flushes at once, read here as it comes.
    """

    def __init__(self, cp: ControlPlane, path: str, conditions: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url = f"{cp.server}{path}?watch=1"
        self.context = _https(cp)
        self.conditions = conditions
        self.seen: dict[str, dict[str, float]] = {condition: {} for condition in conditions}

    def run(self) -> None:
        while True:  # the API server ends a watch after a while: watch again
            try:
                with urllib.request.urlopen(self.url, context=self.context, timeout=600) as reply:
                    for line in reply:
                        self._record(json.loads(line)["object"], time.monotonic())
            except OSError:  # a new CRD's storage answers 429 for a moment
                time.sleep(0.1)

    def _record(self, obj: dict[str, Any], now: float) -> None:
        # Key by pipeline: the StatefulSet of pipeline p is p-driver.
        meta = obj.get("metadata", {})
        name = meta.get("labels", {}).get(PIPELINE_LABEL, meta.get("name"))
        for condition, done in self.conditions.items():
            if name not in self.seen[condition] and done(obj):
                self.seen[condition][name] = now


def _quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"p50 {statistics.median(ordered) * 1000:7.0f} ms   p99 {p99 * 1000:7.0f} ms   "
        f"max {ordered[-1] * 1000:7.0f} ms"
    )


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client_of(agent: str) -> str | None:
    """Which part of the operator sent a request (None: kubectl, the watches, the control plane)."""
    if agent.startswith("kopf/"):
        return "kopf"
    if agent.startswith(FIELD_MANAGER):
        return "eop"  # eop_operator.kube.client
    return None


def _seconds(stamp: str) -> float:
    """An audit log's RFC 3339 time stamp (microseconds) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Phase:
    """CPU seconds of the operator and the API server, and the operator's requests, in a phase."""

    def __init__(self, operator: int, apiserver: int, audit: Path | None) -> None:
        self.pids = (operator, apiserver)
        self.audit = audit
        self.cpu = [_cpu_seconds(pid) for pid in self.pids]
        self.offset = audit.stat().st_size if audit and audit.exists() else 0

    def cpu_line(self) -> str:
        """CPU seconds so far."""
        used = [_cpu_seconds(pid) - before for pid, before in zip(self.pids, self.cpu, strict=True)]
        return f"CPU: operator {used[0]:.1f} s, kube-apiserver {used[1]:.1f} s"

    def end(self, pipelines: int) -> list[str]:
        """Lines describing the phase so far."""
        lines = [self.cpu_line()]
        if self.audit is None:
            return lines
        counts: collections.Counter[str] = collections.Counter()
        seconds: dict[str, float] = collections.defaultdict(float)
        for entry in audit_entries(self.audit, self.offset):
            client = _client_of(entry.get("userAgent", ""))
            if client is None or entry["verb"] == "watch":
                continue
            ref = entry.get("objectRef", {})
            resource = ref.get("resource", "?") + (
                f"/{ref['subresource']}" if ref.get("subresource") else ""
            )
            what = f"{client} {entry['verb']} {resource}"
            counts[what] += 1
            seconds[what] += _seconds(entry["stageTimestamp"]) - _seconds(
                entry["requestReceivedTimestamp"]
            )
        total = sum(counts.values())
        lines.append(f"operator requests: {total} ({total / pipelines:.1f} per pipeline)")
        lines += [
            f"  {n / pipelines:5.1f}/pipeline  {what:<40} {seconds[what] / n * 1000:6.0f} ms each"
            for what, n in counts.most_common(10)
        ]
        return lines


def _start_operator(cp: ControlPlane, log: Path, profile: Path | None) -> subprocess.Popen[bytes]:
    """``eop operator`` for every namespace; under cProfile (written at its exit) if asked."""
    python = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profile else [])]
    with log.open("a") as sink:
        return subprocess.Popen(
            [*python, "-m", "eop_operator.cli", "operator", "--all-namespaces",
             "--default-image", "eop-spark:bench"],
            stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)},
        )  # fmt: skip


def _started_at(log: Path) -> float:
    """When the last operator in ``log`` ran its startup handler (epoch seconds)."""
    line = [x for x in log.read_text().splitlines() if "Activity 'started' succeeded" in x][-1]
    stamp = line[1 : line.index("]")]  # kopf's "[2026-01-01 12:00:00,123]", local time
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _wait_all(names: list[str], *seen: dict[str, float], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(name in times for times in seen for name in names):
            return
        time.sleep(0.05)
    missing = [[n for n in names if n not in times] for times in seen]
    raise SystemExit(f"timed out waiting for {missing}; operator log:\n{log.read_text()[-3000:]}")


PHASES = ("one-by-one", "burst", "restart")


@dataclasses.dataclass(frozen=True)
class Options:
    """What the command line asks for."""

    pipelines: int
    phases: tuple[str, ...]
    create: str
    #: Write a cProfile of each operator run here (operator-1.prof, operator-2.prof).
    profile: Path | None


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument(
        "--count-requests", action="store_true", help="audit log: the operator's requests"
    )
    parser.add_argument(
        "--create",
        choices=("kubectl", "concurrent"),
        default="kubectl",
        help="how the burst is created: one `kubectl apply`, or parallel server-side applies",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="comma-separated, of " + ", ".join(PHASES) + " (restart needs burst)",
    )
    parser.add_argument("--operator-log", type=Path, help="keep the operator's log here")
    parser.add_argument("--profile", type=Path, help="cProfile each operator run into DIR")
    args = parser.parse_args()
    phases = tuple(p for p in PHASES if p in args.phases.split(","))
    if "restart" in phases and "burst" not in phases:
        parser.error("--phases: restart needs burst (it restarts with the burst's pipelines live)")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    options = Options(args.pipelines, phases, args.create, args.profile)

    with (
        tempfile.TemporaryDirectory() as tmp,
        ControlPlane(
            Path(tmp) / "kube", binaries=build_binaries(quiet=True), audit=args.count_requests
        ) as cp,
    ):
        try:
            _run(cp, options, Path(tmp), cp.audit_log)
        finally:
            if args.operator_log:
                shutil.copy(Path(tmp) / "operator.log", args.operator_log)


def _run(cp: ControlPlane, options: Options, tmp: Path, audit: Path | None) -> None:
    """The phases on a started control plane; print the figures."""
    n = options.pipelines
    cp.install_crd(CRD)
    for ns in ("one-by-one", "burst"):
        cp.kubectl("create", "namespace", ns, check=True)
    statefulsets = Watcher(cp, "/apis/apps/v1/statefulsets", {"exists": lambda o: True})
    pipelines = Watcher(
        cp,
        "/apis/exactlyonce.io/v1alpha1/exactlyoncepipelines",
        {
            # When the create of each pipeline is visible: `kubectl apply` sends a burst's
            # objects one after the other, so the last ones exist seconds after the first.
            "exists": lambda o: True,
            "status": lambda o: bool(o.get("status", {}).get("specHash")),
        },
    )
    sts, created, status = (
        statefulsets.seen["exists"],
        pipelines.seen["exists"],
        pipelines.seen["status"],
    )
    for watcher in (statefulsets, pipelines):
        watcher.start()
    log = tmp / "operator.log"
    apiserver = cp.pids["kube-apiserver"]
    runs = iter(range(1, 10))

    def start() -> subprocess.Popen[bytes]:
        profile = options.profile / f"operator-{next(runs)}.prof" if options.profile else None
        return _start_operator(cp, log, profile)

    operator = start()
    figures: dict[str, list[str]] = {}
    peak: dict[str, float] = {}
    try:
        time.sleep(5)  # let kopf list and start watching
        if "one-by-one" in options.phases:
            # One at a time: each apply waits for the previous pipeline to be done.
            started: dict[str, float] = {}
            phase = Phase(operator.pid, apiserver, audit)
            for i in range(n):
                name = f"p{i:03d}"
                started[name] = time.monotonic()
                cp.kubectl(
                    "apply",
                    "-n",
                    "one-by-one",
                    "-f",
                    "-",
                    input=yaml.safe_dump(_pipeline(name)),
                    check=True,
                )
                _wait_all([name], sts, status, log=log)
            to_sts = [sts[k] - t for k, t in started.items()]
            to_status = [status[k] - t for k, t in started.items()]
            figures["one at a time"] = [
                f"apply -> StatefulSet exists  {_quantiles(to_sts)}",
                f"apply -> status written     {_quantiles(to_status)}",
                *phase.end(n),
            ]
            peak["one at a time"] = _peak_rss_mib(operator.pid)
        names = [f"b{i:03d}" for i in range(n)]
        if "burst" in options.phases:
            phase = Phase(operator.pid, apiserver, audit)
            t0 = time.monotonic()
            if options.create == "concurrent":
                _create_concurrently(cp, "burst", names)
            else:
                manifest = yaml.safe_dump_all([_pipeline(name) for name in names])
                cp.kubectl("apply", "-n", "burst", "-f", "-", input=manifest, check=True)
            _wait_all(names, sts, status, created, log=log)
            how = "one kubectl apply" if options.create == "kubectl" else "parallel applies"
            figures[f"burst of {n}"] = [
                f"apply -> StatefulSet exists  {_quantiles([sts[k] - t0 for k in names])}",
                f"apply -> status written     {_quantiles([status[k] - t0 for k in names])}",
                f"({how} -> pipeline exists  {_quantiles([created[k] - t0 for k in names])})",
                "pipeline exists -> StatefulSet exists  "
                f"{_quantiles([sts[k] - created[k] for k in names])}",
                "pipeline exists -> status written  "
                f"{_quantiles([status[k] - created[k] for k in names])}",
                f"until then {phase.cpu_line()}",
            ]
            time.sleep(10)  # the steps after the StatefulSet (status, events) settle
            figures[f"burst of {n}"] += [*phase.end(n), "(until 10 s after the last status)"]
            peak["burst"] = _peak_rss_mib(operator.pid)
        if "restart" in options.phases:
            # A restart with every pipeline live: their StatefulSets go while the operator
            # is down; the new one must look at each pipeline and bring its driver back.
            operator.terminate()
            operator.wait(timeout=30)
            cp.kubectl("delete", "statefulsets", "--all", "-n", "burst", check=True)
            sts.clear()
            time.sleep(1)
            t0, wall = time.monotonic(), time.time()
            operator = start()
            phase = Phase(operator.pid, apiserver, audit)
            _wait_all(names, sts, log=log)
            live = n * (2 if "one-by-one" in options.phases else 1)
            ready = _started_at(log) - wall
            figures[f"restart, {live} live"] = [
                f"start -> StatefulSet exists  {_quantiles([sts[k] - t0 for k in names])}",
                f"(start -> kopf started, imports and login: {ready * 1000:.0f} ms)",
                *phase.end(n),
            ]
            peak["restart"] = _peak_rss_mib(operator.pid)
    finally:  # never leave the operator running, whatever failed
        operator.terminate()
        operator.wait(timeout=30)

    load = os.getloadavg()
    print(
        f"eop operator: {n} pipelines on a real kube-apiserver ({os.cpu_count()} cores, "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end)"
    )
    for label, lines in figures.items():
        for i, line in enumerate(lines):
            print(f"  {label if i == 0 else '':>18}  {line}")
    print(
        "  operator peak RSS: "
        + ", ".join(f"{mib:.0f} MiB after {label}" for label, mib in peak.items())
        + " (target < 150 MiB); target p99 < 5000 ms"
    )


if __name__ == "__main__":
    main()
