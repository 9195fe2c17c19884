"""Watch a pipeline's driver pods for the whole of a test: never two drivers at once.

A ``kubectl get pods --watch`` on the driver's labels records every change the API server
makes to them, in order. After each change the watch counts the pods whose driver container
may run: the API server says ``running`` and the pod is not yet deleted. A pod on a lost
node keeps ``running`` (no kubelet reports otherwise) until Kubernetes deletes it, so the
count is on the safe side: a new driver started before the old pod was gone counts two.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from devenv.cluster import LocalCluster


@dataclass(frozen=True)
class PodChange:
    """One watch event of a driver pod."""

    at: float
    kind: str
    name: str
    uid: str
    node: str
    phase: str
    running: bool
    deleting: bool

    @classmethod
    def of(cls, at: float, kind: str, pod: dict[str, Any]) -> PodChange:
        """Read a watch event's pod."""
        meta, status = pod.get("metadata", {}), pod.get("status", {})
        states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
        return cls(
            at=at,
            kind=kind,
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            node=str(pod.get("spec", {}).get("nodeName") or ""),
            phase=str(status.get("phase", "")),
            running=any("running" in s for s in states),
            deleting=meta.get("deletionTimestamp") is not None,
        )

    def __str__(self) -> str:
        flags = " running" if self.running else ""
        flags += " deleting" if self.deleting else ""
        return f"{self.kind} {self.name} {self.uid[:8]} on {self.node or '-'} {self.phase}{flags}"


class DriverWatch(threading.Thread):
    """Records the driver pods of ``pipeline`` in ``ns`` until :meth:`stop`.

    ``most_running``: the most pods with a running driver container at any one time;
    ``changes``: every event, for the failure message and the timings.
    """

    def __init__(self, cluster: LocalCluster, ns: str, pipeline: str) -> None:
        """Prepare; :meth:`start` begins watching (and returns once the watch is listed)."""
        super().__init__(name=f"driver-watch-{pipeline}", daemon=True)
        self.cluster, self.ns, self.pipeline = cluster, ns, pipeline
        self.changes: list[PodChange] = []
        self.most_running = 0
        self.restarts = 0  # how often kubectl's watch had to be started again
        self._pods: dict[str, PodChange] = {}
        self._proc: subprocess.Popen[str] | None = None
        self._stopping = threading.Event()
        self._listed = threading.Event()

    def start(self) -> None:
        """Start the thread; wait until the watch has listed the pods."""
        super().start()
        if not self._listed.wait(30):
            raise AssertionError(f"the watch of {self.pipeline}'s driver pods did not start")

    def run(self) -> None:
        """Watch; start ``kubectl`` again if it ends before :meth:`stop`."""
        selector = f"exactlyonce.io/pipeline={self.pipeline},app.kubernetes.io/component=driver"
        argv = [str(self.cluster.binaries.kubectl), f"--kubeconfig={self.cluster.kubeconfig}"]
        argv += ["get", "pods", "-n", self.ns, "-l", selector]
        argv += ["--watch", "--output-watch-events", "-o", "json"]
        while not self._stopping.is_set():
            self._proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=self.cluster.env(),
            )
            self._read(self._proc)
            self._proc.wait()
            if not self._stopping.is_set():
                self.restarts += 1
                time.sleep(0.5)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        # The first events list what exists (none: nothing to wait for).
        threading.Timer(3.0, self._listed.set).start()
        for line in proc.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # an object not yet complete
                buffer = buffer.lstrip()[end:]
                self._record(str(event.get("type", "")), event.get("object") or {})

    def _record(self, kind: str, pod: dict[str, Any]) -> None:
        change = PodChange.of(time.monotonic(), kind, pod)
        self._listed.set()
        self.changes.append(change)
        if kind == "DELETED":
            self._pods.pop(change.uid, None)
        else:
            self._pods[change.uid] = change
        self.most_running = max(self.most_running, self.running_now())

    def running_now(self) -> int:
        """Pods whose driver container runs as far as the API server knows."""
        return sum(1 for p in self._pods.values() if p.running)

    def stop(self) -> None:
        """Stop watching."""
        self._stopping.set()
        if self._proc is not None:
            self._proc.terminate()
        self.join(10)

    def timeline(self, since: float = 0.0) -> str:
        """The changes seen since ``since`` (time.monotonic()), one per line, for messages."""
        return "\n".join(f"{c.at - since:+7.1f}s {c}" for c in self.changes if c.at >= since)
