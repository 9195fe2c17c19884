"""Benchmark: from `kubectl apply` of a pipeline to its StatefulSet existing and status written.

Starts a real control plane (etcd, kube-apiserver, controller-manager), installs
the CRD, runs `eop operator` as a subprocess, then creates N pipelines, first
one at a time (latency without contention), then all in one `kubectl apply`
(a burst), then restarts the operator with those pipelines live (their
StatefulSets deleted while it was down: the time until every one is back is
the time until the new operator has looked at every pipeline).  Two pollers
record when each StatefulSet first appears and when each pipeline's status
first carries a spec hash.  Prints p50/p99 of both, the CPU seconds the
operator and the API server spent in each phase, and the operator's peak
resident memory (VmHWM).  ``--count-requests`` turns on the API server's audit
log and prints the operator's requests per pipeline in each phase, by verb
and resource.

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
import json
import os
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

from devenv.kube import ControlPlane, build_binaries
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
    """TLS as the cluster admin (the pollers and the concurrent creator)."""
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


class Poller(threading.Thread):
    """List a collection every few milliseconds; record when each object first satisfies ``done``.

    Polling rather than a watch keeps the measurement free of stream buffering;
    a list of a hundred objects costs the API server a few milliseconds.
    """

    def __init__(self, cp: ControlPlane, path: str, done: Any, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url = f"{cp.server}{path}"
        self.context = _https(cp)
        self.done = done
        self.every = every
        self.seen: dict[str, float] = {}

    def run(self) -> None:
        while True:
            try:
                with urllib.request.urlopen(self.url, context=self.context, timeout=30) as reply:
                    items = json.load(reply)["items"]
            except OSError:  # a new CRD's storage answers 429 for a moment
                items = []
            now = time.monotonic()
            for obj in items:
                # Key by pipeline: the StatefulSet of pipeline p is p-driver.
                name = (
                    obj["metadata"].get("labels", {}).get(PIPELINE_LABEL, obj["metadata"]["name"])
                )
                if name not in self.seen and self.done(obj):
                    self.seen[name] = now
            time.sleep(self.every)


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


#: Audit only completed requests, metadata only: enough to count them.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata"}],
}


def _client_of(agent: str) -> str | None:
    """Which part of the operator sent a request (None: kubectl, the pollers, the control plane)."""
    if agent.startswith("kopf/"):
        return "kopf"
    if agent.startswith("Python/") and "aiohttp" in agent:
        return "eop"  # eop_operator.kube.client: aiohttp's default user agent
    return None


class Phase:
    """CPU seconds of the operator and the API server, and the operator's requests, in a phase."""

    def __init__(self, operator: int, apiserver: int, audit: Path | None) -> None:
        self.pids = (operator, apiserver)
        self.audit = audit
        self.cpu = [_cpu_seconds(pid) for pid in self.pids]
        self.offset = audit.stat().st_size if audit and audit.exists() else 0

    def end(self, pipelines: int) -> list[str]:
        """Lines describing the phase so far."""
        used = [_cpu_seconds(pid) - before for pid, before in zip(self.pids, self.cpu, strict=True)]
        lines = [f"CPU: operator {used[0]:.1f} s, kube-apiserver {used[1]:.1f} s"]
        if self.audit is None:
            return lines
        counts: collections.Counter[str] = collections.Counter()
        with self.audit.open() as log:
            log.seek(self.offset)
            for line in log:
                entry = json.loads(line)
                client = _client_of(entry.get("userAgent", ""))
                if client is None:
                    continue
                ref = entry.get("objectRef", {})
                resource = ref.get("resource", "?") + (
                    f"/{ref['subresource']}" if ref.get("subresource") else ""
                )
                counts[f"{client} {entry['verb']} {resource}"] += 1
        total = sum(counts.values())
        lines.append(f"operator requests: {total} ({total / pipelines:.1f} per pipeline)")
        lines += [f"  {n / pipelines:5.1f}/pipeline  {what}" for what, n in counts.most_common(12)]
        return lines


def _start_operator(cp: ControlPlane, log: Path) -> subprocess.Popen[bytes]:
    with log.open("a") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "eop_operator.cli", "operator", "--all-namespaces",
             "--default-image", "eop-spark:bench"],
            stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)},
        )  # fmt: skip


def _wait_all(names: list[str], *watchers: Poller, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(name in w.seen for w in watchers for name in names):
            return
        time.sleep(0.05)
    missing = {w.url: [n for n in names if n not in w.seen] for w in watchers}
    raise SystemExit(f"timed out waiting for {missing}; operator log:\n{log.read_text()[-3000:]}")


PHASES = ("one-by-one", "burst", "restart")


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
    args = parser.parse_args()
    phases = tuple(p for p in PHASES if p in args.phases.split(","))
    if "restart" in phases and "burst" not in phases:
        parser.error("--phases: restart needs burst (it restarts with the burst's pipelines live)")

    with tempfile.TemporaryDirectory() as tmp:
        audit: Path | None = None
        extra: list[str] = []
        if args.count_requests:
            audit, policy = Path(tmp) / "audit.log", Path(tmp) / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(AUDIT_POLICY))
            extra = [f"--audit-policy-file={policy}", f"--audit-log-path={audit}"]
        with ControlPlane(
            Path(tmp) / "kube", binaries=build_binaries(quiet=True), extra_apiserver_args=extra
        ) as cp:
            _run(cp, args.pipelines, Path(tmp), audit, phases=phases, create=args.create)


def _run(
    cp: ControlPlane, n: int, tmp: Path, audit: Path | None, *, phases: tuple[str, ...], create: str
) -> None:
    """The phases on a started control plane; print the figures."""
    cp.kubectl("apply", "--server-side", "-f", str(CRD), check=True)
    cp.kubectl("wait", "--for=condition=Established", "crd/exactlyoncepipelines.exactlyonce.io")
    for ns in ("one-by-one", "burst"):
        cp.kubectl("create", "namespace", ns, check=True)
    sts = Poller(cp, "/apis/apps/v1/statefulsets", lambda o: True)
    status = Poller(
        cp,
        "/apis/exactlyonce.io/v1alpha1/exactlyoncepipelines",
        lambda o: bool(o.get("status", {}).get("specHash")),
    )
    # When the create of each pipeline is visible: `kubectl apply` sends a burst's
    # objects one after the other, so the last ones exist seconds after the first.
    created = Poller(cp, "/apis/exactlyonce.io/v1alpha1/exactlyoncepipelines", lambda o: True)
    for poller in (sts, status, created):
        poller.start()
    log = tmp / "operator.log"
    apiserver = cp.pids["kube-apiserver"]
    operator = _start_operator(cp, log)
    figures: dict[str, list[str]] = {}
    peak: dict[str, float] = {}
    try:
        time.sleep(5)  # let kopf list and start watching
        if "one-by-one" in phases:
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
            to_sts = [sts.seen[k] - t for k, t in started.items()]
            to_status = [status.seen[k] - t for k, t in started.items()]
            figures["one at a time"] = [
                f"apply -> StatefulSet exists  {_quantiles(to_sts)}",
                f"apply -> status written     {_quantiles(to_status)}",
                *phase.end(n),
            ]
            peak["one at a time"] = _peak_rss_mib(operator.pid)
        names = [f"b{i:03d}" for i in range(n)]
        if "burst" in phases:
            phase = Phase(operator.pid, apiserver, audit)
            t0 = time.monotonic()
            if create == "concurrent":
                _create_concurrently(cp, "burst", names)
            else:
                manifest = yaml.safe_dump_all([_pipeline(name) for name in names])
                cp.kubectl("apply", "-n", "burst", "-f", "-", input=manifest, check=True)
            _wait_all(names, sts, status, created, log=log)
            how = (
                "one kubectl apply" if create == "kubectl" else f"{CREATE_WORKERS} parallel applies"
            )
            figures[f"burst of {n}"] = [
                f"apply -> StatefulSet exists  {_quantiles([sts.seen[k] - t0 for k in names])}",
                f"apply -> status written     {_quantiles([status.seen[k] - t0 for k in names])}",
                f"({how} -> pipeline exists  {_quantiles([created.seen[k] - t0 for k in names])})",
                "pipeline exists -> StatefulSet exists  "
                f"{_quantiles([sts.seen[k] - created.seen[k] for k in names])}",
                "pipeline exists -> status written  "
                f"{_quantiles([status.seen[k] - created.seen[k] for k in names])}",
            ]
            time.sleep(10)  # the steps after the StatefulSet (status, events) settle
            figures[f"burst of {n}"] += [*phase.end(n), "(until 10 s after the last status)"]
            peak["burst"] = _peak_rss_mib(operator.pid)
        if "restart" in phases:
            # A restart with every pipeline live: their StatefulSets go while the operator
            # is down; the new one must look at each pipeline and bring its driver back.
            operator.terminate()
            operator.wait(timeout=30)
            cp.kubectl("delete", "statefulsets", "--all", "-n", "burst", check=True)
            sts.seen.clear()
            time.sleep(1)
            t0 = time.monotonic()
            operator = _start_operator(cp, log)
            phase = Phase(operator.pid, apiserver, audit)
            _wait_all(names, sts, log=log)
            live = n * (2 if "one-by-one" in phases else 1)
            figures[f"restart, {live} live"] = [
                f"start -> StatefulSet exists  {_quantiles([sts.seen[k] - t0 for k in names])}",
                *phase.end(n),
            ]
            peak["restart"] = _peak_rss_mib(operator.pid)
    finally:  # never leave the operator running, whatever failed
        operator.terminate()
        operator.wait(timeout=30)

    print(f"eop operator: {n} pipelines on a real kube-apiserver ({os.cpu_count()} cores)")
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
