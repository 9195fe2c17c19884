"""The driver lifecycle on a real API server: upgrades, WAL recovery, rollback, fallback,
crash loops, suspend/resume and restartNonce.

etcd, kube-apiserver and kube-controller-manager are real (its StatefulSet
controller creates and deletes the driver pods); no kubelet runs, so the test
plays the kubelet: it marks pods Ready, makes them fail with a termination
message, and holds a pod in Terminating with a finalizer.  A watch on the
driver pods runs for each whole test and checks that no two exist at once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane
from eop_operator.reconcile.cadence import first_verify_in
from tests.integration.operators import OperatorProcess, audit_mark, operator_requests, wait_for

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "exactlyoncepipelines.exactlyonce.io.yaml"
HASH = "exactlyonce.io/spec-hash"
HOLD = "eop.test/hold"

pytestmark = pytest.mark.kube


class PodWatch:
    """Watches the driver pods of a pipeline for a whole test; records the most alive at once."""

    def __init__(self, cp: ControlPlane, namespace: str, name: str) -> None:
        self.alive: dict[str, str] = {}  # uid -> spec hash
        self.created: list[tuple[str, str]] = []  # (uid, spec hash) in creation order
        self.most = 0
        self.overlaps: list[dict[str, str]] = []
        self.proc = subprocess.Popen(
            [
                str(cp.kubectl_path),
                f"--kubeconfig={cp.kubeconfig}",
                "get",
                "pods",
                "-n",
                namespace,
                "-l",
                f"exactlyonce.io/pipeline={name}",
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break
                buffer = buffer.lstrip()[end:]
                self._record(event)

    def _record(self, event: dict[str, Any]) -> None:
        pod = event["object"]
        uid = pod["metadata"]["uid"]
        spec_hash = pod["metadata"].get("annotations", {}).get(HASH, "")
        if event["type"] == "DELETED":
            self.alive.pop(uid, None)
            return
        if uid not in self.alive and event["type"] == "ADDED":
            self.created.append((uid, spec_hash))
        self.alive[uid] = spec_hash
        self.most = max(self.most, len(self.alive))
        if len(self.alive) > 1:
            self.overlaps.append(dict(self.alive))

    def hashes(self) -> list[str]:
        """Spec hashes of the pods created, in order, without repeats."""
        seen: list[str] = []
        for _, spec_hash in self.created:
            if not seen or seen[-1] != spec_hash:
                seen.append(spec_hash)
        return seen

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        assert self.most <= 1, f"two driver pods at once: {self.overlaps[:3]}"


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> None:
    """The generated CRD (server-side, so a chart-installed copy is simply taken over)."""
    control_plane.install_crd(CRD)


@pytest.fixture
def operator(
    control_plane: ControlPlane, crd: None, kube_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """A running operator for the test's namespace."""
    log = tmp_path / "operator.log"
    op = OperatorProcess(control_plane.kubeconfig, log, "--namespace", kube_namespace)
    wait_for(op.alive, "the operator's liveness endpoint")
    yield op
    op.stop()
    text = op.log.read_text()
    assert "Traceback" not in text, text[-5000:]


class Pipeline:
    """One pipeline under test, with the kubelet's part played by the test."""

    def __init__(self, cp: ControlPlane, namespace: str, name: str, **spec: Any) -> None:
        self.cp, self.ns, self.name = cp, namespace, name
        self.spec: dict[str, Any] = {
            "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
            "transform": {"sql": "SELECT key, value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "out"}},
            **spec,
        }
        self.watch = PodWatch(cp, namespace, name)
        self._last_failed = ""

    def apply(self, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``kubectl apply`` the pipeline with ``spec`` as it is now."""
        manifest = {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": self.spec,
        }
        return self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=check)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.cp.kubectl("get", kind, name, "-n", self.ns, "-o", "json")
        return json.loads(result.stdout) if result.returncode == 0 else None

    def status(self) -> dict[str, Any]:
        return dict((self.get("eop", self.name) or {}).get("status", {}))

    def run_json(self) -> dict[str, Any]:
        config_map = self.get("configmap", f"{self.name}-config")
        assert config_map is not None
        return dict(json.loads(config_map["data"]["run.json"]))

    def statefulset(self) -> dict[str, Any]:
        sts = self.get("statefulset", f"{self.name}-driver")
        assert sts is not None
        return sts

    def pod(self) -> dict[str, Any] | None:
        return self.get("pod", f"{self.name}-driver-0")

    def events(self) -> list[str]:
        return [reason for reason, _ in self.event_messages()]

    def event_messages(self) -> list[tuple[str, str]]:
        """The pipeline's events, oldest first: (reason, message)."""
        items = json.loads(
            self.cp.kubectl(
                "get",
                "events",
                "-n",
                self.ns,
                "--field-selector",
                f"involvedObject.name={self.name},involvedObject.kind=ExactlyOncePipeline",
                "-o",
                "json",
                check=True,
            ).stdout
        )["items"]
        # Timestamps have whole seconds: within one second, the order the apiserver stored
        # them in (etcd's revision, which resourceVersion is on this one-node control plane).
        ordered = sorted(
            items,
            key=lambda e: (e.get("firstTimestamp") or "", int(e["metadata"]["resourceVersion"])),
        )
        return [(e["reason"], e.get("message", "")) for e in ordered]

    def wait_event(self, reason: str, timeout: float = 60) -> None:
        wait_for(lambda: reason in self.events(), f"event {reason}", timeout)

    def pod_of(self, spec_hash: str, timeout: float = 60) -> dict[str, Any]:
        """Wait for the driver pod of ``spec_hash``."""

        def probe() -> dict[str, Any] | None:
            pod = self.pod()
            meta = (pod or {}).get("metadata", {})
            if meta.get("annotations", {}).get(HASH) == spec_hash and not meta.get(
                "deletionTimestamp"
            ):
                return pod
            return None

        try:
            return wait_for(probe, f"a driver pod of spec hash {spec_hash}", timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None

    def diagnosis(self) -> str:
        """What the operator and the StatefulSet controller did, for a failure message."""
        status = self.status()
        sts = self.get("statefulset", f"{self.name}-driver") or {}
        pods = json.loads(
            self.cp.kubectl("get", "pods", "-n", self.ns, "-o", "json", check=True).stdout
        )["items"]
        seen = {
            "events": self.events(),
            "upgrade": status.get("upgrade"),
            "specHash": status.get("specHash"),
            "conditions": [(c["type"], c["status"], c["reason"]) for c in status["conditions"]],
            "statefulset": {
                "replicas": sts.get("spec", {}).get("replicas"),
                "templateHash": (sts.get("spec", {}).get("template", {}).get("metadata", {}))
                .get("annotations", {})
                .get(HASH),
                "status": sts.get("status"),
            },
            "pods": [
                {
                    "name": p["metadata"]["name"],
                    "hash": p["metadata"].get("annotations", {}).get(HASH),
                    "deletionTimestamp": p["metadata"].get("deletionTimestamp"),
                    "finalizers": p["metadata"].get("finalizers"),
                    "phase": p.get("status", {}).get("phase"),
                }
                for p in pods
            ],
        }
        log = self.cp.log_path("kube-controller-manager")
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        mine = [line for line in lines if self.ns in line][-25:]
        return (
            f"the pipeline: {json.dumps(seen, indent=1)}\n"
            "kube-controller-manager on this namespace:\n" + "\n".join(mine)
        )

    def _status_patch(self, pod: str, status: dict[str, Any]) -> None:
        self.cp.kubectl(
            "patch",
            "pod",
            pod,
            "-n",
            self.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            check=True,
        )

    def make_ready(self, spec_hash: str, *, restarts: int = 0, last_message: str = "") -> None:
        """The kubelet's part: the driver container runs and is Ready.

        With ``restarts``, it has just been restarted after ending with ``last_message``.
        """
        pod = self.pod_of(spec_hash)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        container: dict[str, Any] = {
            "name": "driver",
            "ready": True,
            "restartCount": restarts,
            "image": "localhost/eop-spark:test",
            "imageID": "",
            "state": {"running": {"startedAt": now}},
        }
        if restarts:
            ended = {"exitCode": 4, "message": last_message, "startedAt": now, "finishedAt": now}
            container["lastState"] = {"terminated": ended}
        self._status_patch(
            pod["metadata"]["name"],
            {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                "containerStatuses": [container],
            },
        )

    def fail(self, spec_hash: str, message: str, exit_code: int = 4) -> str:
        """The driver exits with ``message`` in its termination log; returns the pod uid."""
        pod = self.pod_of(spec_hash)
        # finishedAt has one-second precision, like the kubelet's: each failure gets its own.
        while (now := time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())) == self._last_failed:
            time.sleep(0.05)
        self._last_failed = now
        self._status_patch(
            pod["metadata"]["name"],
            {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "driver",
                        "ready": False,
                        "restartCount": 0,
                        "image": "localhost/eop-spark:test",
                        "imageID": "",
                        "state": {
                            "terminated": {
                                "exitCode": exit_code,
                                "message": message,
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            },
        )
        return str(pod["metadata"]["uid"])

    def running(self) -> str:
        """Play the kubelet until the driver of the current spec runs; return its spec hash."""

        def target() -> str | None:
            pipeline = self.get("eop", self.name) or {}
            status = dict(pipeline.get("status", {}))
            # Until the operator has seen the spec just applied, the status is the old one's.
            if status.get("observedGeneration") != pipeline.get("metadata", {}).get("generation"):
                return None
            upgrade = status.get("upgrade")
            if upgrade is None:
                return status.get("specHash")
            return upgrade["toHash"] if upgrade["step"] == "Starting" else None

        spec_hash = wait_for(target, "the new driver to be applied")
        self.make_ready(spec_hash)
        wait_for(
            lambda: self.status().get("phase") == "Running" and not self.status().get("upgrade"),
            "phase Running",
        )
        return spec_hash

    def template_hash(self) -> str:
        return str(self.statefulset()["spec"]["template"]["metadata"]["annotations"][HASH])


@pytest.fixture
def pipeline(
    control_plane: ControlPlane, kube_namespace: str, operator: OperatorProcess
) -> Iterator[Callable[..., Pipeline]]:
    made: list[Pipeline] = []

    def make(name: str, **spec: Any) -> Pipeline:
        p = Pipeline(control_plane, kube_namespace, name, **spec)
        made.append(p)
        p.apply()
        return p

    yield make
    for p in made:
        p.watch.close()


def test_a_driver_pod_made_while_the_controller_lags_runs_the_new_spec(
    pipeline: Callable[..., Pipeline], operator: OperatorProcess
) -> None:
    """An upgrade's new pod comes from the new template even if the controller lags behind.

    The operator applies the new template once the old driver's pod is gone,
    but the StatefulSet controller may still count that pod in its status
    (its watch is a moment late).  Its pod must run the new spec all the
    same; a pod of the old spec would also never get replaced while Pending.
    Here the operator is stopped and the test takes its two steps itself,
    with the controller paused in between so the lag is certain.
    """
    p = pipeline("lag")
    p.running()
    operator.stop()
    sts = f"{p.name}-driver"
    p.cp.kubectl("scale", "statefulset", sts, "-n", p.ns, "--replicas=0", check=True)
    wait_for(lambda: p.pod() is None, "the old driver pod to go")
    controller = p.cp.pids["kube-controller-manager"]
    os.kill(controller, signal.SIGSTOP)
    try:
        # What the controller would see if its watch had not caught up with the deletion.
        lagging = {"status": {"replicas": 1, "currentReplicas": 1}}
        p.cp.kubectl(
            "patch",
            "statefulset",
            sts,
            "-n",
            p.ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(lagging),
            check=True,
        )
        new_template = {
            "spec": {"replicas": 1, "template": {"metadata": {"annotations": {HASH: "new"}}}}
        }
        p.cp.kubectl(
            "patch",
            "statefulset",
            sts,
            "-n",
            p.ns,
            "--type=merge",
            "-p",
            json.dumps(new_template),
            check=True,
        )
    finally:
        os.kill(controller, signal.SIGCONT)
    p.pod_of("new")


def test_each_upgrade_mode_restarts_the_driver_as_documented(
    pipeline: Callable[..., Pipeline],
) -> None:
    p = pipeline("modes")
    first = p.running()
    assert p.status()["checkpoint"]["generation"] == 0
    assert "Submitted" in p.events()

    # last-state: graceful stop, then the same checkpoint generation.
    p.spec["transform"]["sql"] = "SELECT key, upper(value) AS value FROM source"
    p.apply()
    p.wait_event("Upgrading")
    second = p.running()
    assert second != first
    run = p.run_json()
    assert run["generation"] == 0 and "resetProgress" not in run
    assert run["transform"]["sql"].startswith("SELECT key, upper")
    assert p.statefulset()["spec"]["replicas"] == 1

    # committed-offsets: a new generation that starts from the progress group.
    p.spec["upgrade"] = {"mode": "committed-offsets"}
    p.spec["transform"]["sql"] = "SELECT key, lower(value) AS value FROM source"
    p.apply()
    third = p.running()
    run = p.run_json()
    assert run["generation"] == 1 and "resetProgress" not in run
    assert p.status()["checkpoint"] == {
        "generation": 1,
        "path": "/var/lib/eop/checkpoint/gen-1",
        "resetProgress": False,
    }

    # stateless: a new generation that reprocesses from startingOffsets, and says so.
    p.spec["upgrade"] = {"mode": "stateless"}
    p.spec["transform"]["sql"] = "SELECT key, value FROM source WHERE value IS NOT NULL"
    p.apply()
    fourth = p.running()
    run = p.run_json()
    assert run["generation"] == 2 and run["resetProgress"] is True
    assert p.status()["checkpoint"]["resetProgress"] is True
    assert p.events().count("Upgraded") == 3
    # Each new driver was created only after the previous one was gone.
    assert p.watch.hashes() == [first, second, third, fourth]


def _hold(p: Pipeline, pod: dict[str, Any], finalizers: list[str] | None) -> None:
    """Set ``pod``'s finalizers: ``[HOLD]`` keeps a deleted pod Terminating, None lets it go."""
    p.cp.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        p.ns,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"finalizers": finalizers}}),
        check=True,
    )


def test_an_operator_killed_mid_upgrade_finishes_it_with_one_driver(
    pipeline: Callable[..., Pipeline], operator: OperatorProcess
) -> None:
    p = pipeline("wal", upgrade={"mode": "committed-offsets"})
    old = p.running()
    old_pod = p.pod_of(old)
    # The old driver takes its time to stop (a batch in flight): hold it in Terminating.
    _hold(p, old_pod, [HOLD])
    p.spec["transform"]["sql"] = "SELECT key, upper(value) AS value FROM source"
    p.apply()
    wait_for(lambda: (p.status().get("upgrade") or {}).get("step") == "Stopping", "step Stopping")
    wait_for(lambda: (p.pod() or {}).get("metadata", {}).get("deletionTimestamp"), "terminating")
    operator.kill()

    # The old driver finally stops while no operator runs; a new operator takes over.
    _hold(p, old_pod, None)
    operator.start()
    wait_for(operator.alive, "the restarted operator")
    wait_for(lambda: (p.status().get("upgrade") or {}).get("step") == "Starting", "step Starting")
    # Killed again while the new driver starts: the next operator still completes.
    operator.kill()
    operator.start()
    wait_for(operator.alive, "the restarted operator")
    new = p.running()
    assert new != old
    assert p.run_json()["generation"] == 1
    assert p.events().count("Upgraded") == 1
    assert p.watch.hashes() == [old, new]


@pytest.mark.slow
def test_a_driver_not_ready_in_time_is_rolled_back(pipeline: Callable[..., Pipeline]) -> None:
    p = pipeline("rollback", upgrade={"rollback": True, "readinessTimeout": "5s"})
    stable = p.running()
    wait_for(lambda: p.status().get("lastStableSpec"), "the stable spec")
    p.spec["transform"]["sql"] = "SELECT key, broken(value) AS value FROM source"
    p.apply()
    wait_for(lambda: p.status().get("specHash") not in (None, stable), "the new driver")
    p.wait_event("RolledBack", timeout=60)
    rolled_back = p.running()
    run = p.run_json()
    assert run["transform"]["sql"] == "SELECT key, value FROM source"
    assert run["generation"] == 1  # a new generation from the progress group
    status = p.status()
    assert status["rolledBackFingerprint"] and status["phase"] == "Running"
    assert rolled_back != stable  # same spec, next generation


def test_an_incompatible_checkpoint_falls_back_to_committed_offsets(
    pipeline: Callable[..., Pipeline],
) -> None:
    p = pipeline("fallback")
    p.running()
    p.spec["transform"]["sql"] = "SELECT key, count(*) AS value FROM source GROUP BY key"
    p.spec["transform"]["outputMode"] = "update"
    p.apply()
    new = wait_for(
        lambda: (
            (p.status().get("upgrade") or {}).get("step") == "Starting"
            and p.status()["upgrade"]["toHash"]
        ),
        "the new driver",
    )
    p.fail(new, "eop: error: [IncompatibleCheckpoint] Provided schema doesn't match")
    p.wait_event("FellBack")
    p.running()
    assert p.run_json()["generation"] == 1
    assert "Restarted" in p.events()


def test_a_crash_looping_driver_is_degraded(pipeline: Callable[..., Pipeline]) -> None:
    p = pipeline("crashy", failover={"maxRestarts": 2, "window": "10m"})
    spec_hash = p.running()
    for attempt in range(3):
        failed = p.fail(spec_hash, f"eop: error: [Failed] broker went away ({attempt})")

        def replaced(failed: str = failed) -> bool:
            # The StatefulSet controller replaces the failed pod.
            return (p.pod() or {}).get("metadata", {}).get("uid") not in (None, failed)

        wait_for(replaced, "a replacement pod")
    status = wait_for(
        lambda: p.status().get("phase") == "Degraded" and p.status(), "phase Degraded"
    )
    assert status["failover"]["restarts"] == 3
    assert "broker went away (2)" in status["failover"]["lastMessage"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CrashLoop"
    p.wait_event("Degraded")
    assert p.events().count("Restarted") == 3


def test_suspend_resume_and_restart_nonce(pipeline: Callable[..., Pipeline]) -> None:
    p = pipeline("pause")
    first = p.running()
    p.spec["suspend"] = True
    p.apply()
    wait_for(lambda: p.status().get("phase") == "Suspended" and p.pod() is None, "Suspended")
    assert p.statefulset()["spec"]["replicas"] == 0
    p.wait_event("Suspended")

    p.spec["suspend"] = False
    p.apply()
    p.wait_event("Resumed")
    assert p.running() == first  # the same driver spec and checkpoint generation
    assert p.run_json()["generation"] == 0

    p.spec["restartNonce"] = "1"
    p.apply()
    restarted = p.running()
    assert restarted != first
    assert p.run_json()["generation"] == 0  # last-state: the same checkpoint
    upgraded = [e for e in p.events() if e in ("Upgrading", "Upgraded")]
    assert upgraded == ["Upgrading", "Upgraded"]
    assert p.watch.hashes() == [first, restarted]


def _condition(p: Pipeline, kind: str = "Ready") -> dict[str, Any]:
    return next((c for c in p.status().get("conditions", []) if c["type"] == kind), {})


def _reason_column(p: Pipeline) -> str:
    """The REASON column of ``kubectl get eop`` (columns are aligned; some may be empty)."""
    header, row = p.cp.kubectl("get", "eop", p.name, "-n", p.ns, check=True).stdout.splitlines()
    start = header.index("REASON")
    following = re.search(r" \S", header[start:])  # where the next column begins
    end = start + following.end() - 1 if following else len(row)
    return row[start:end].strip()


def _wait_reason(p: Pipeline, reason: str, timeout: float = 60) -> dict[str, Any]:
    """Wait until the Ready condition (and the REASON column) names ``reason``."""
    wait_for(lambda: _condition(p).get("reason") == reason, f"reason {reason}", timeout)
    assert _reason_column(p) == reason
    return _condition(p)


@pytest.mark.slow
def test_every_child_deleted_comes_back_and_a_lost_claim_starts_a_new_generation(
    pipeline: Callable[..., Pipeline],
) -> None:
    p = pipeline("heal")
    first = p.running()
    assert _reason_column(p) == "DriverReady"
    claim = f"{p.name}-checkpoint"
    # Nothing watches ConfigMaps or Services: the periodic look finds them gone.
    for kind, name in (("configmap", f"{p.name}-config"), ("service", f"{p.name}-driver")):
        p.cp.kubectl("delete", kind, name, "-n", p.ns, check=True)
    for kind, name in (("configmap", f"{p.name}-config"), ("service", f"{p.name}-driver")):
        wait_for(lambda k=kind, n=name: p.get(k, n), f"{kind} {name} back", timeout=90)
    assert p.status()["checkpoint"]["generation"] == 0  # nothing lost: the same generation

    # The claim and the pod, as in a lost node: the checkpoint is gone.  The claim's
    # deletion is an event: the operator may have stopped the pod already.
    p.cp.kubectl("delete", "pvc", claim, "-n", p.ns, "--wait=false", check=True)
    p.cp.kubectl(
        "delete", "pod", f"{p.name}-driver-0", "-n", p.ns, "--wait=false", "--ignore-not-found",
        check=True,
    )  # fmt: skip
    p.wait_event("CheckpointLost")
    second = p.running()
    assert second != first
    assert p.run_json()["generation"] == 1
    assert p.status()["checkpoint"]["generation"] == 1
    made = p.get("pvc", claim)
    assert made is not None and not made["metadata"].get("deletionTimestamp")
    # The new generation started only after the old driver was gone.
    assert p.watch.hashes() == [first, second]

    # The StatefulSet: its deletion is an event; it comes back at once.
    p.cp.kubectl("delete", "statefulset", f"{p.name}-driver", "-n", p.ns, check=True)
    wait_for(lambda: p.get("statefulset", f"{p.name}-driver"), "the StatefulSet back", 30)
    assert p.template_hash() == second


@pytest.mark.slow
def test_children_are_applied_again_only_when_deleted_or_changed(
    pipeline: Callable[..., Pipeline], kube_namespace: str
) -> None:
    """Children in sync are not written again; one changed by hand is, at once, and only it."""
    # Every child is also applied again every VERIFY_SECONDS, the first time at a moment
    # spread by the pipeline's name: a name whose first one falls well after this test.
    name = next(
        n for n in (f"steady-{i}" for i in range(100)) if first_verify_in(kube_namespace, n) > 120
    )
    p = pipeline(name)
    spec_hash = wait_for(lambda: p.status().get("specHash"), "the driver to be applied")
    p.pod_of(spec_hash)
    run_json = p.run_json()
    # Its driver never runs here: the operator looks at the pipeline every 10 s.
    mark = audit_mark(p.cp)
    time.sleep(25)
    children = ("configmaps", "persistentvolumeclaims", "services", "statefulsets")
    requests = operator_requests(p.cp, p.ns, mark)
    applied = {r: n for r, n in requests.items() if r[0] == "patch" and r[1] in children}
    assert applied == {}, f"children in sync were applied again: {applied}"

    mark = audit_mark(p.cp)
    config = f"{p.name}-config"
    p.cp.kubectl(
        "patch", "configmap", config, "-n", p.ns, "--type=merge",
        "-p", json.dumps({"data": {"run.json": "{}"}}), check=True,
    )  # fmt: skip
    wait_for(lambda: p.run_json() == run_json, "the ConfigMap as rendered again", 30)
    sts = f"{p.name}-driver"
    p.cp.kubectl("scale", "statefulset", sts, "-n", p.ns, "--replicas=0", check=True)
    wait_for(lambda: p.statefulset()["spec"]["replicas"] == 1, "one replica again", 30)
    patches = operator_requests(p.cp, p.ns, mark)
    assert patches[("patch", "configmaps")] == 1, patches
    assert patches[("patch", "statefulsets")] == 1, patches
    assert patches[("patch", "services")] == patches[("patch", "persistentvolumeclaims")] == 0


def test_a_refused_claim_update_does_not_keep_the_driver_down(
    pipeline: Callable[..., Pipeline],
) -> None:
    p = pipeline("resize")
    p.running()
    # An unbound claim's spec is immutable (as a bound one's size is without expansion).
    p.spec["checkpoint"] = {"volume": {"size": "2Gi"}}
    p.spec["transform"]["sql"] = "SELECT key, upper(value) AS value FROM source"
    p.apply()
    upgraded = p.running()  # the new driver started all the same
    assert p.template_hash() == upgraded
    p.wait_event("ApplyRefused")
    ready = _wait_reason(p, "ApplyRefused")
    assert ready["status"] == "True"
    assert f"PersistentVolumeClaim {p.name}-checkpoint" in ready["message"], ready
    assert "refused by the API server" in ready["message"]


@pytest.mark.slow
def test_causes_from_the_pod_and_its_events_are_in_the_conditions(
    pipeline: Callable[..., Pipeline],
) -> None:
    p = pipeline("causes")
    spec_hash = wait_for(lambda: p.status().get("specHash"), "the driver to be applied")
    pod = p.pod_of(spec_hash)
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    # No scheduler runs here: the claim the pod waits for is what holds it.
    assert "is Pending" in _wait_reason(p, "ClaimPending")["message"]

    def kubelet(status: dict[str, Any]) -> None:
        p.cp.kubectl(
            "patch", "pod", name, "-n", p.ns, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}), check=True,
        )  # fmt: skip

    kubelet(
        {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient cpu.",
                }
            ]
        }
    )
    assert "1 Insufficient cpu" in _wait_reason(p, "Unschedulable")["message"]
    assert p.status()["phase"] == "Pending"

    waiting = {"reason": "ContainerCreating"}
    kubelet(
        {
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "driver", "ready": False, "restartCount": 0, "image": "x",
                    "imageID": "", "state": {"waiting": waiting},
                }
            ],
        }
    )  # fmt: skip
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": p.ns},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": p.ns, "uid": uid},
        "type": "Warning",
        "reason": "FailedCreatePodSandBox",
        "message": "Failed to create pod sandbox: plugin type=bridge failed: no IP addresses",
        "source": {"component": "kubelet"},
        "firstTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "count": 1,
    }
    p.cp.kubectl("create", "-f", "-", input=json.dumps(event), check=True)
    sandbox = _wait_reason(p, "SandboxFailed")
    assert "no IP addresses" in sandbox["message"]
    assert p.status()["phase"] == "Degraded"

    pulling = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "eop:nope"'}
    kubelet(
        {
            "containerStatuses": [
                {
                    "name": "driver", "ready": False, "restartCount": 0, "image": "x",
                    "imageID": "", "state": {"waiting": pulling},
                }
            ],
        }
    )  # fmt: skip
    assert 'pulling image "eop:nope"' in _wait_reason(p, "ImagePullFailed")["message"]


def test_a_crash_loop_is_degraded_with_the_runners_message_even_between_crashes(
    pipeline: Callable[..., Pipeline],
) -> None:
    p = pipeline("loop")
    spec_hash = p.running()
    message = "eop: error: [Failed] source.kafka: broker 127.0.0.1:9092 went away"
    p.make_ready(spec_hash, restarts=2, last_message=message)
    ready = _wait_reason(p, "CrashLoop")
    assert ready["status"] == "False"
    assert "broker 127.0.0.1:9092 went away" in ready["message"]
    status = p.status()
    assert status["phase"] == "Degraded"
    assert _condition(p, "Degraded")["status"] == "True"


#: The operator's interpreter loads it first (``sitecustomize``): rendering fails for the
#: pipelines whose name starts with ``render-fails``, as a bug or a broken build would make it.
_RENDER_FAULT = """
import eop_operator.render as render

_render = render.render_pipeline


def _failing(pipeline, **options):
    if pipeline.metadata.name.startswith("render-fails"):
        raise ValueError("cannot render (injected by the test)")
    return _render(pipeline, **options)


render.render_pipeline = _failing
"""


def test_a_render_error_is_a_condition_an_event_and_a_counted_failure(
    control_plane: ControlPlane, crd: None, kube_namespace: str, tmp_path: Path
) -> None:
    """What a platform team sees of a step that fails the same way every time: the pipeline
    Degraded with reason ReconcileFailed and the error (condition, REASON column, a Warning
    event) and ``eop_reconcile_failures_total`` by the error's class (what
    ``EopReconcileFailing`` fires on), while a pipeline beside it runs on."""
    injected = tmp_path / "inject"
    injected.mkdir()
    (injected / "sitecustomize.py").write_text(_RENDER_FAULT)
    path = os.pathsep.join(filter(None, [str(injected), os.environ.get("PYTHONPATH")]))
    op = OperatorProcess(
        control_plane.kubeconfig,
        tmp_path / "operator.log",
        *("--namespace", kube_namespace),
        env={"PYTHONPATH": path},
    )
    failing = Pipeline(control_plane, kube_namespace, "render-fails")
    fine = Pipeline(control_plane, kube_namespace, "renders")
    try:
        wait_for(op.alive, "the operator's liveness endpoint")
        failing.apply()
        fine.apply()
        ready = _wait_reason(failing, "ReconcileFailed")
        assert "ValueError: cannot render (injected by the test)" in ready["message"], ready
        assert failing.status()["phase"] == "Degraded"
        failing.wait_event("ReconcileFailed")
        (message,) = [m for r, m in failing.event_messages() if r == "ReconcileFailed"]
        assert "cannot render" in message
        labels = f'error="ValueError",namespace="{kube_namespace}",pipeline="render-fails"'
        assert (op.metric(f"eop_reconcile_failures_total{{{labels}}}") or 0) >= 2
        assert failing.get("statefulset", "render-fails-driver") is None
        assert fine.statefulset()["metadata"]["name"] == "renders-driver"
        assert op.alive()
    finally:
        op.stop()
        for p in (failing, fine):
            p.watch.close()


@pytest.mark.slow
def test_a_statefulset_that_cannot_create_its_pod_says_why(
    control_plane: ControlPlane, kube_namespace: str, pipeline: Callable[..., Pipeline]
) -> None:
    limits = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "small", "namespace": kube_namespace},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "100m"}}]},
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(limits), check=True)
    p = pipeline("forbidden")
    failed = _wait_reason(p, "FailedCreate")
    assert "forbidden" in failed["message"] and "cpu" in failed["message"]
    assert p.status()["phase"] == "Degraded"


#: The columns docs/lifecycle.md suggests to follow an operator upgrade.
COLUMNS = (
    "NAMESPACE:.metadata.namespace,NAME:.metadata.name,RENDERED-BY:.status.renderedBy,"
    "UPGRADE:.status.upgrade.reason,STEP:.status.upgrade.step,MESSAGE:.status.message"
)


def _said_waiting(p: Pipeline, waiting: set[str]) -> dict[str, str] | None:
    """The namespace's rows of ``COLUMNS`` by pipeline, once each of ``waiting`` says it waits."""
    lines = p.cp.kubectl(
        "get", "eop", "-n", p.ns, "--no-headers", "-o", f"custom-columns={COLUMNS}"
    ).stdout.splitlines()
    rows = {line.split()[1]: line for line in lines if line.strip()}
    said = all("waiting for a restart slot" in rows.get(name, "") for name in waiting)
    return rows if said else None


def test_an_operator_upgrade_restarts_drivers_in_last_state_one_at_a_time(
    pipeline: Callable[..., Pipeline], operator: OperatorProcess
) -> None:
    """A new operator whose rendering differs (here its default Spark image, as after
    `helm upgrade --set-string image.tag=NEW`) restarts each driver of an unchanged spec in
    last-state, whatever its upgrade.mode, one at a time (--operator-upgrade-parallelism 1):
    no stateless reprocess, no new generation, and the waiting drivers keep running as they
    were, their StatefulSets untouched."""
    modes = ("stateless", "committed-offsets", "last-state")
    pipelines = [pipeline(f"opup-{i}", upgrade={"mode": mode}) for i, mode in enumerate(modes)]
    old = {p.name: p.running() for p in pipelines}
    old_pods = {p.name: p.pod_of(old[p.name])["metadata"]["uid"] for p in pipelines}
    operator.stop()
    operator.args = (*operator.args, "--default-image", "localhost/eop-spark:new")
    operator.start()
    wait_for(operator.alive, "the upgraded operator")

    def in_flight() -> list[Pipeline]:
        return [p for p in pipelines if p.status().get("upgrade")]

    restarted: list[str] = []
    while len(restarted) < len(pipelines):
        moving_now = wait_for(
            lambda: [p for p in in_flight() if p.name not in restarted] or None,
            "the next driver to restart for the operator upgrade",
        )
        assert len(moving_now) == 1, f"restarting at once: {[p.name for p in moving_now]}"
        (moving,) = moving_now
        upgrade = moving.status()["upgrade"]
        assert (upgrade["reason"], upgrade["mode"]) == ("OperatorUpgrade", "last-state")
        new = wait_for(lambda m=moving: (m.status().get("upgrade") or {}).get("toHash"), "toHash")
        pod = moving.pod_of(new)
        # One at a time: the others keep their driver and their template as they were.
        assert [p.name for p in in_flight()] == [moving.name]
        for waiting in pipelines:
            if waiting is not moving and waiting.name not in restarted:
                assert waiting.template_hash() == old[waiting.name]
                assert (waiting.pod() or {})["metadata"]["uid"] == old_pods[waiting.name]
        assert pod["spec"]["containers"][0]["image"] == "localhost/eop-spark:new"
        # What docs/lifecycle.md shows to follow an operator upgrade.
        waiting = {p.name for p in pipelines} - {moving.name, *restarted}
        rows = wait_for(partial(_said_waiting, moving, waiting), "the waiting ones to say so")
        assert re.search(r"OperatorUpgrade\s+Starting", rows[moving.name]), rows[moving.name]
        moving.make_ready(new)
        wait_for(lambda m=moving: not m.status().get("upgrade"), "the restart to complete")
        restarted.append(moving.name)

    for p in pipelines:
        status = p.status()
        assert status["phase"] == "Running" and status["renderedBy"]
        # The same checkpoint generation, not reprocessed: state and position kept.
        assert status["checkpoint"]["generation"] == 0 and not status["checkpoint"]["resetProgress"]
        run = p.run_json()
        assert run["generation"] == 0 and "resetProgress" not in run
        assert p.watch.hashes() == [old[p.name], status["specHash"]]
        upgrading = [m for r, m in p.event_messages() if r in ("Upgrading", "Upgraded")]
        assert len(upgrading) == 2 and all(m.startswith("OperatorUpgrade:") for m in upgrading)


def test_a_driver_that_does_not_stop_gives_its_restart_slot_to_the_next_pipeline(
    pipeline: Callable[..., Pipeline], operator: OperatorProcess
) -> None:
    """An operator-upgrade restart whose old driver pod stays Terminating (a lost node, a
    finalizer) holds its slot (--operator-upgrade-parallelism 1) for readinessTimeout only:
    it is Degraded naming the pod, the next pipeline's restart goes on, and it starts once
    its pod is gone, never beside it."""
    pipelines = [pipeline(f"stuck-{i}", upgrade={"readinessTimeout": "5s"}) for i in range(2)]
    old = {p.name: p.running() for p in pipelines}
    pods = {p.name: p.pod_of(old[p.name]) for p in pipelines}
    for p in pipelines:
        _hold(p, pods[p.name], [HOLD])
    operator.stop()
    operator.args = (*operator.args, "--default-image", "localhost/eop-spark:new")
    operator.start()
    wait_for(operator.alive, "the upgraded operator")

    def moving() -> list[Pipeline]:
        return [p for p in pipelines if (p.status().get("upgrade") or {}).get("step")]

    (stuck,) = wait_for(moving, "the first restart")
    (other,) = [p for p in pipelines if p is not stuck]
    wait_for(lambda: (stuck.pod() or {}).get("metadata", {}).get("deletionTimestamp"), "stopping")
    # Its pod does not go: past readinessTimeout the slot serves the other pipeline.
    wait_for(lambda: len(moving()) == 2, "the next restart while the first pod stays", 30)
    ready = {c["type"]: c for c in stuck.status()["conditions"]}["Ready"]
    assert (stuck.status()["phase"], ready["reason"]) == ("Degraded", "DriverNotStopped"), ready
    assert f"{stuck.name}-driver-0" in ready["message"] and "slot" in ready["message"], ready
    assert stuck.status()["upgrade"]["step"] == "Stopping", "started beside the old pod"
    assert "Degraded" in stuck.events()
    # The pods go at last: both restart in last-state and run the new rendering.
    for p in pipelines:
        _hold(p, pods[p.name], None)
    for p in (other, stuck):
        new = p.running()
        assert new != old[p.name]
        assert p.status()["checkpoint"]["generation"] == 0
        assert p.watch.hashes() == [old[p.name], new]


def _without_rule(crd: dict[str, Any], message: str) -> dict[str, Any]:
    """``crd`` without the CEL rules whose message starts with ``message`` (an older CRD)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                key: (
                    [r for r in value if not str(r.get("message", "")).startswith(message)]
                    if key == "x-kubernetes-validations"
                    else strip(value)
                )
                for key, value in node.items()
            }
        if isinstance(node, list):
            return [strip(item) for item in node]
        return node

    looser: dict[str, Any] = strip(crd)
    assert looser != crd, f"no rule {message!r} in the CRD"
    return looser


def test_a_spec_accepted_before_a_rule_was_tightened_runs_on_with_spec_no_longer_valid(
    control_plane: ControlPlane, pipeline: Callable[..., Pipeline], operator: OperatorProcess
) -> None:
    """Upgraded CRD and operator meet a spec their predecessors accepted that breaks a rule
    they added: it keeps running with SpecNoLongerValid, never Invalid; a change of the
    spec must pass the rule (the API server says so at once)."""
    cp, rule = control_plane, "health.stallTimeout must be longer than trigger.processingTime"
    operator.stop()
    looser = _without_rule(yaml.safe_load(CRD.read_text()), rule)
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
               input=yaml.safe_dump(looser), check=True)  # fmt: skip
    try:
        # Accepted under the older rules (and by the older operator, which wrote its status).
        p = pipeline("ratchet", trigger={"processingTime": "2m"}, health={"stallTimeout": "1m"})
        cp.kubectl("patch", "eop", p.name, "-n", p.ns, "--subresource=status", "--type=merge",
                   "-p", json.dumps({"status": {"phase": "Running", "observedGeneration": 1}}),
                   check=True)  # fmt: skip
    finally:
        cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD), check=True)
    operator.start()
    wait_for(operator.alive, "the upgraded operator")
    p.running()  # the operator runs it (its status writes pass the API server's ratchet)
    status = p.status()
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["SpecNoLongerValid"]["status"] == "True", conditions
    assert rule in conditions["SpecNoLongerValid"]["message"]
    assert conditions["Degraded"]["status"] == "False", conditions
    assert any(r == "SpecNoLongerValid" and rule in m for r, m in p.event_messages())
    assert "InvalidSpec" not in p.events()
    # Any change of the spec must pass every rule.
    p.spec["suspend"] = True
    refused = p.apply(check=False)
    assert refused.returncode != 0 and rule in refused.stderr, refused.stderr
