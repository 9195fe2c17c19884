"""Operator processes for integration tests: the chart's RBAC, `eop operator` as a subprocess.

``install_chart`` installs a release (CRD, RBAC, ServiceAccount) and returns a kubeconfig
that authenticates as the release's ServiceAccount, so the operator runs with exactly the
chart's permissions. :class:`OperatorProcess` runs ``eop operator`` with it, serves liveness
and metrics on free ports, and can be killed like a crashed pod.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from devenv.kube import ControlPlane, audit_entries
from devenv.processes import free_port
from eop_operator.kube.client import FIELD_MANAGER

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "eop"


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def audit_mark(cp: ControlPlane) -> int:
    """Where the control plane's audit log ends now (see :func:`operator_requests`)."""
    assert cp.audit_log is not None, "the control plane keeps no audit log"
    return cp.audit_log.stat().st_size if cp.audit_log.exists() else 0


def operator_requests(cp: ControlPlane, namespace: str, since: int) -> Counter[tuple[str, str]]:
    """The operator's own requests (kopf's aside) in ``namespace``: (verb, resource) -> count."""
    assert cp.audit_log is not None, "the control plane keeps no audit log"
    return Counter(
        (entry["verb"], entry["objectRef"]["resource"])
        for entry in audit_entries(cp.audit_log, since)
        if entry.get("userAgent") == FIELD_MANAGER
        and entry.get("objectRef", {}).get("namespace") == namespace
    )


def install_chart(
    cp: ControlPlane, release: str, namespace: str, serve: tuple[str, ...] = ()
) -> Path:
    """Install the chart as ``release`` in ``namespace``; its account's kubeconfig.

    Cluster-wide unless ``serve`` names the namespaces to serve (the chart's namespaced
    mode: a Role and RoleBinding in each): these tests serve pipelines in namespaces made
    per test (tests/charts runs the namespaced default).
    """
    mode = f"watchNamespaces={{{','.join(serve)}}}" if serve else "clusterWide=true"
    cp.helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--create-namespace",
        "--set",
        mode,
        "--wait=false",
        check=True,
    )
    accounts = json.loads(
        cp.kubectl(
            "get",
            "serviceaccounts",
            "-n",
            namespace,
            "-l",
            f"app.kubernetes.io/instance={release}",
            "-o",
            "json",
            check=True,
        ).stdout
    )["items"]
    (account,) = accounts
    return cp.service_account_kubeconfig(namespace, account["metadata"]["name"])


class OperatorProcess:
    """One ``eop operator`` subprocess, its log, and its liveness and metrics endpoints."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        *args: str,
        pod_name: str = "op",
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start it with ``args`` after the usual options; ``env`` adds to this environment."""
        self.log = log
        self.args = args
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "POD_NAME": pod_name,
            **(env or {}),
        }
        self.start()

    def start(self) -> None:
        """Start the process (again, after :meth:`kill`: like a restarted pod); log appended."""
        self.health_port = free_port()
        self.metrics_port = free_port()
        with self.log.open("a") as sink:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eop_operator.cli",
                    "operator",
                    "--default-image",
                    "localhost/eop-spark:test",
                    "--liveness",
                    f"http://127.0.0.1:{self.health_port}/healthz",
                    "--metrics-port",
                    str(self.metrics_port),
                    *self.args,
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def text(self) -> str:
        """The log so far."""
        return self.log.read_text()

    def _get(self, port: int, path: str) -> str | None:
        assert self.proc.poll() is None, f"operator exited:\n{self.text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            return None

    def alive(self) -> bool:
        """Whether the liveness endpoint answers (asserts the process has not exited)."""
        return self._get(self.health_port, "/healthz") is not None

    def metric(self, name: str) -> float | None:
        """The value of an unlabelled metric, or of the first sample starting with ``name``."""
        text = self._get(self.metrics_port, "/metrics") or ""
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def kill(self) -> None:
        """SIGKILL, like a node dying under the pod: no cleanup, no lease release."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM and wait (a no-op once the process is gone)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
