"""A local Kubernetes cluster with real kubelets and containerd: one node on loopback, or
several nodes on a pod network of their own.

::

    python -m devenv.cluster up [--dir DIR]     # start (idempotent), build + import the images
    python -m devenv.cluster status             # what runs, the node
    python -m devenv.cluster load-images        # devenv/images.sh all + import into containerd
    python -m devenv.cluster down [--purge]     # stop everything (--purge: delete DIR too)
    export KUBECONFIG=$(python -m devenv.cluster kubeconfig)

    python -m devenv.cluster up --nodes 3 --no-images    # the multi-node cluster
    python -m devenv.cluster node-lose node2 --nodes 3   # lose a node; node-restore boots it
    python -m devenv.cluster exec node1 --nodes 3 -- ip route

DIR is ``--dir``, else ``$EOP_CLUSTER_DIR``, else ``~/.cache/eop/cluster`` (``$EOP_CACHE``);
with ``--nodes`` > 1: ``$EOP_NODES_CLUSTER_DIR``, else ``~/.cache/eop/cluster-nodes``.

What runs (see docs/local-cluster.md for every flag and why):

* the control plane of :mod:`devenv.kube` (etcd, kube-apiserver on the fixed port
  127.0.0.1:6443, controller-manager, scheduler);
* a containerd of our own (Debian's ``containerd`` + ``runc``) with its config, root, state
  and socket under DIR, the CRI plugin on, cgroupfs, and a locally built pause image as the
  sandbox image (no registry is reachable);
* a kubelet registering node ``127.0.0.1`` (see :data:`NODE_NAME`), cgroup v1, host network;
* :mod:`devenv.hostpath_provisioner` serving the default StorageClass ``eop-hostpath``
  (``WaitForFirstConsumer``: see :func:`devenv.hostpath_provisioner.storage_class_manifest`).

With several nodes (:mod:`devenv.podnet`), the supervisor moves into a network namespace of
its own (the cluster network, bridge and gateway ``10.88.0.1``) where the control plane runs;
each node ``nodeN`` (``10.88.0.(10+N)``) is a containerd, a kubelet and a kube-proxy in the network
and mount namespaces of a holder process, its pods on the CNI bridge (``10.244.N.0/24``);
CoreDNS serves ``cluster.local``; :mod:`devenv.netns_forward` forwards the host's
``127.0.0.1:<port>`` to the apiserver and, on request, the gateway to host services
(:meth:`LocalCluster.expose_host_port`).

``up`` starts the supervisor (:mod:`devenv.cluster_supervisor`, as ``_supervise``) in a
private mount namespace; it starts, watches and stops every component. Logs:
``DIR/logs/<component>.log``. What each component is told: :mod:`devenv.cluster_configs`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devenv.cgroups import remove_cgroups
from devenv.cluster_configs import (
    CGROUP_ROOT,
    NODE_LEASE_SECONDS,
    NODE_MONITOR_GRACE_SECONDS,
    NODE_NAME,
    OUT_OF_SERVICE_TAINT,
    TOLERATION_SECONDS,
    ClusterNode,
)
from devenv.cluster_images import (
    ImageError,
    build_coredns_image,
    build_pause_image,
    build_toolbox_image,
)
from devenv.kube import ControlPlaneError, KubeBinaries, build_binaries, run_helm, run_kubectl
from devenv.netns_forward import Endpoint, Forward, read_forward
from devenv.podnet import GATEWAY, NetnsError, node_layout
from devenv.processes import cmdline, free_port, kill_and_wait, log_tail, pid_alive, start_time
from devenv.versions import cache_root

__all__ = [
    "CGROUP_ROOT",
    "DEFAULT_APISERVER_PORT",
    "GATEWAY",
    "NODE_LEASE_SECONDS",
    "NODE_MONITOR_GRACE_SECONDS",
    "NODE_NAME",
    "OUT_OF_SERVICE_TAINT",
    "TOLERATION_SECONDS",
    "ClusterError",
    "ClusterNode",
    "LocalCluster",
    "default_cluster_dir",
    "main",
]

REPO = Path(__file__).resolve().parents[1]
IMAGES_SCRIPT = REPO / "devenv" / "images.sh"

#: The apiserver's port: fixed, so the kubeconfig and in-cluster settings survive restarts.
DEFAULT_APISERVER_PORT = 6443

_LOOPBACK = "127.0.0.1"
_APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "util-linux")
#: More for the multi-node cluster: kube-proxy's iptables, the toolbox image's busybox.
_APT_PACKAGES_NODES = ("iptables", "busybox-static", "iproute2")


class ClusterError(RuntimeError):
    """The local cluster failed to start, stop or answer."""


def default_cluster_dir(nodes: int = 1) -> Path:
    """``$EOP_CLUSTER_DIR``, else ``<cache>/cluster`` (``~/.cache/eop/cluster``); for more
    than one node ``$EOP_NODES_CLUSTER_DIR``, else ``<cache>/cluster-nodes``."""
    if nodes > 1:
        env = os.environ.get("EOP_NODES_CLUSTER_DIR")
        return Path(env) if env else cache_root() / "cluster-nodes"
    env = os.environ.get("EOP_CLUSTER_DIR")
    return Path(env) if env else cache_root() / "cluster"


def _log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- packages


def ensure_packages(extra: Sequence[str] = ()) -> None:
    """apt-get install containerd, runc, the CNI plugins, unshare (and ``extra``) when missing."""
    missing = []
    for pkg in (*_APT_PACKAGES, *extra):
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, check=False
        )
        if "install ok installed" not in result.stdout:
            missing.append(pkg)
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(f"needs root to apt-get install {' '.join(missing)}")
    _log(f"apt-get install {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Another of the project's builds may be installing packages at the same moment.
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    subprocess.run(["apt-get", *wait, "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", *wait, "install", "-y", "-qq", *missing], check=True, env=env)


# ----------------------------------------------------------------------------- the cluster


def build_images() -> dict[str, str]:
    """``devenv/images.sh all`` (a no-op when the images are current): their refs,
    ``{"operator": ref, "spark": ref}``. Needs no running cluster."""
    began = time.monotonic()
    result = subprocess.run(
        ["bash", str(IMAGES_SCRIPT), "all"], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"{IMAGES_SCRIPT} all failed ({result.returncode})")
    refs = {}
    for line in result.stdout.split():
        for name in ("operator", "spark"):
            if line.startswith(f"localhost/eop-{name}:"):
                refs[name] = line
    if set(refs) != {"operator", "spark"}:
        raise ClusterError(f"{IMAGES_SCRIPT} printed no image refs: {result.stdout!r}")
    _log(f"images built in {time.monotonic() - began:.1f}s: {' '.join(refs.values())}")
    return refs


class LocalCluster:
    """Paths, client helpers and life cycle of the cluster in ``work_dir``.

    The object is cheap: it holds no process. :meth:`up` starts the supervisor (or finds it
    running), :meth:`down` stops it; :meth:`kubectl`, :meth:`helm` and :meth:`ctr` talk to
    whatever runs in ``work_dir``.

    ``nodes`` > 1 is the multi-node cluster on a pod network (see docs/local-cluster.md);
    without ``work_dir`` it lives in :func:`default_cluster_dir` for that many nodes. Left
    out, the node count is that of the cluster last started in the dir (else 1).
    """

    def __init__(
        self,
        work_dir: Path | str | None = None,
        *,
        apiserver_port: int | None = None,
        nodes: int | None = None,
    ) -> None:
        """``work_dir`` defaults to :func:`default_cluster_dir`."""
        if nodes is not None:
            node_layout(nodes)  # validates the count
        default = default_cluster_dir(nodes or 1)
        self.dir = Path(work_dir).resolve() if work_dir else default.resolve()
        self._apiserver_port = apiserver_port
        self._nodes = nodes
        self.binaries = KubeBinaries.from_cache()

    # ------------------------------------------------------------------ paths

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (stable while the apiserver port stays the same)."""
        return self.dir / "kubeconfig"

    @property
    def log_dir(self) -> Path:
        """``<component>.log`` of every component, and ``pods/`` (container logs)."""
        return self.dir / "logs"

    @property
    def run_dir(self) -> Path:
        """Pid files and ``state.json``."""
        return self.dir / "run"

    @property
    def control_plane_dir(self) -> Path:
        """The :class:`devenv.kube.ControlPlane` work dir (pki, etcd data)."""
        return self.dir / "control-plane"

    @property
    def volumes_dir(self) -> Path:
        """Where the hostPath provisioner makes the volumes' directories (first node)."""
        return self.nodes()[0].volumes_dir

    @property
    def state_file(self) -> Path:
        """The supervisor's state: phase, pids, ports, errors."""
        return self.run_dir / "state.json"

    @property
    def node_count(self) -> int:
        """The nodes asked for, else those of the cluster last started here, else 1."""
        if self._nodes:
            return self._nodes
        count = self.state().get("node_count")
        return int(count) if count else 1

    @property
    def pod_network(self) -> bool:
        """Whether this is the multi-node cluster: nodes in network namespaces, a pod network,
        kube-proxy and cluster DNS."""
        return self.node_count > 1

    @property
    def gateway(self) -> str:
        """Where pods reach the control plane and :meth:`expose_host_port`'s forwards."""
        if not self.pod_network:
            raise ClusterError("the single-node cluster has no pod network (pods use 127.0.0.1)")
        return GATEWAY

    @property
    def cgroup_base(self) -> str:
        """The cgroup of every node's pods: ``/eop`` for the single-node cluster in its default
        dir, else ``/eop-<hash of the dir>``: clusters in two dirs never kill each other's pods
        (``down`` kills whatever is left in its cgroups)."""
        if not self.pod_network and self.dir == (cache_root() / "cluster").resolve():
            return CGROUP_ROOT
        return f"{CGROUP_ROOT}-{hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]}"

    def nodes(self) -> list[ClusterNode]:
        """The nodes of this cluster (whether they run or not)."""
        if not self.pod_network:
            return [
                ClusterNode(
                    name=NODE_NAME,
                    address=_LOOPBACK,
                    dir=self.dir,
                    log_dir=self.log_dir,
                    var_log=self.dir / "node" / "var-log",
                    volumes_dir=self.dir / "volumes",
                    cgroup_root=self.cgroup_base,
                )
            ]
        nodes = []
        for addr in node_layout(self.node_count):
            node_dir = self.dir / "nodes" / addr.name
            nodes.append(
                ClusterNode(
                    name=addr.name,
                    address=addr.address,
                    dir=node_dir,
                    log_dir=self.log_dir / addr.name,
                    var_log=node_dir / "var-log",
                    volumes_dir=node_dir / "volumes",
                    cgroup_root=f"{self.cgroup_base}/{addr.name}",
                    pod_cidr=addr.pod_cidr,
                    pod_gateway=addr.pod_gateway,
                )
            )
        return nodes

    def node(self, name: str) -> ClusterNode:
        """The node called ``name``; ClusterError names the nodes there are."""
        for node in self.nodes():
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes())
        raise ClusterError(f"no node {name!r} in {self.dir} (nodes: {names})")

    @property
    def apiserver_port(self) -> int:
        """The apiserver port on 127.0.0.1: from the running state, else the one asked for,
        else 6443 (one node) or the port the multi-node cluster used last."""
        if self._apiserver_port:
            return self._apiserver_port
        port = self.state().get("apiserver_port")
        if port:
            return int(port)
        if self.pod_network:
            with contextlib.suppress(OSError, ValueError):
                return int((self.dir / "apiserver-port").read_text())
        return DEFAULT_APISERVER_PORT

    @property
    def server(self) -> str:
        """The apiserver URL."""
        return f"https://{_LOOPBACK}:{self.apiserver_port}"

    def log_path(self, component: str) -> Path:
        """Log of ``component``: supervisor, etcd, kube-apiserver, containerd, kubelet, ...
        (``node1/kubelet`` for a node of the multi-node cluster)."""
        cp_components = (
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        )
        if component in cp_components:
            return self.control_plane_dir / "logs" / f"{component}.log"
        return self.log_dir / f"{component}.log"

    # ------------------------------------------------------------------ state

    def state(self) -> dict[str, Any]:
        """The supervisor's last written state (``{}`` if none)."""
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return state

    def supervisor_pid(self) -> int | None:
        """Pid of the running supervisor, or None."""
        try:
            pid = int((self.run_dir / "supervisor.pid").read_text())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and "_supervise" in cmdline(pid):
            return pid
        return None

    def is_running(self) -> bool:
        """True when the supervisor runs and reported the cluster ready."""
        return self.supervisor_pid() is not None and self.state().get("phase") == "ready"

    def _pid_files(self) -> list[Path]:
        return sorted(self.run_dir.rglob("*.pid")) if self.run_dir.is_dir() else []

    def _pid_from_file(self, pid_file: Path) -> int | None:
        """The live process a pid file names: ``PID STARTTIME``, or ``PID`` of a process whose
        command line names this cluster's dir."""
        try:
            pid_s, *start = pid_file.read_text().split()
            pid = int(pid_s)
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        if start:
            return pid if start_time(pid) == start[0] else None
        return pid if str(self.dir) in " ".join(cmdline(pid)) else None

    # ------------------------------------------------------------------ clients

    def env(self) -> dict[str, str]:
        """``os.environ`` with ``KUBECONFIG`` set and kubectl/helm on ``PATH``."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        path = f"{self.binaries.kubectl.parent}{os.pathsep}{self.binaries.helm.parent}"
        env["PATH"] = f"{path}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self,
        *args: str,
        check: bool = False,
        input: str | None = None,
        timeout: float | None = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl with the admin kubeconfig; output captured as text."""
        return run_kubectl(
            self.binaries.kubectl,
            self.kubeconfig,
            args,
            env=self.env(),
            check=check,
            input=input,
            timeout=timeout,
        )

    def helm(
        self, *args: str, check: bool = False, timeout: float | None = 600.0
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against the cluster (its cache/config/data dirs under ``DIR/helm``)."""
        return run_helm(
            self.binaries.helm,
            self.kubeconfig,
            args,
            env=self.env(),
            helm_home=self.dir / "helm",
            check=check,
            timeout=timeout,
        )

    def ctr(
        self,
        *args: str,
        check: bool = False,
        timeout: float | None = 600.0,
        node: ClusterNode | str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr -n k8s.io`` (the CRI's namespace) against a node's containerd (default:
        the first node's)."""
        if node is None:
            node = self.nodes()[0]
        elif isinstance(node, str):
            node = self.node(node)
        return subprocess.run(
            ["ctr", f"--address={node.containerd_socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def apply(self, *objects: Mapping[str, Any]) -> None:
        """``kubectl apply`` the objects (server-side)."""
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        result = self.kubectl(
            "apply", "--server-side", "--field-manager=eop-devenv", "-f", "-", input=manifest
        )
        if result.returncode != 0:
            raise ClusterError(f"kubectl apply failed: {result.stderr.strip()}")

    # ------------------------------------------------------------------ multi-node

    def node_states(self) -> dict[str, str]:
        """Each node's state as the supervisor sees it: ``ready``, ``lost``, ``starting``."""
        nodes = self.state().get("nodes", {})
        return {name: str(info.get("state", "")) for name, info in nodes.items()}

    @property
    def toolbox_image(self) -> str:
        """``localhost/eop-toolbox:<hash>`` (busybox: ``sh``, ``nc``, ``wget``, ``httpd``...),
        imported into every node of the multi-node cluster."""
        ref = self.state().get("images", {}).get("toolbox")
        if not ref:
            raise ClusterError("no toolbox image: the multi-node cluster is not running")
        return str(ref)

    def expose_host_port(self, port: int, *, timeout: float = 15.0) -> str:
        """Let pods reach ``127.0.0.1:port`` of the machine: returns ``"10.88.0.1:port"``.

        The supervisor's forwarder listens on the gateway address in the cluster's network
        namespace and connects each connection to the host's loopback. Idempotent; it lasts
        until :meth:`unexpose_host_port` or the cluster stops.
        """
        rule = Forward(
            listen=Endpoint("cluster", GATEWAY, port), target=Endpoint("host", _LOOPBACK, port)
        )
        self._add_forward(f"host-{port}", rule, timeout)
        return f"{self.gateway}:{port}"

    def unexpose_host_port(self, port: int) -> None:
        """Stop forwarding the gateway's ``port`` (open connections go on)."""
        (self.run_dir / "forwards" / f"host-{port}.json").unlink(missing_ok=True)

    def _add_forward(self, name: str, rule: Forward, timeout: float) -> None:
        if not self.pod_network or self.supervisor_pid() is None:
            raise ClusterError(f"the multi-node cluster in {self.dir} is not running")
        rules = self.run_dir / "forwards"
        rules.mkdir(parents=True, exist_ok=True)
        tmp = rules / f".{name}.tmp"
        tmp.write_text(json.dumps(rule.to_json()))
        tmp.replace(rules / f"{name}.json")
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                status = json.loads((self.run_dir / "forwards.json").read_text())
                entry = status.get("forwards", {}).get(name, {})
                if entry.get("listening") and read_forward(entry) == rule:
                    return
                if entry.get("error"):
                    raise ClusterError(f"forward {name}: {entry['error']}")
            if time.monotonic() > deadline:
                raise ClusterError(f"forward {name} not listening after {timeout:.0f}s")
            time.sleep(0.1)

    def lose_node(self, name: str, *, out_of_service: bool = True, timeout: float = 60.0) -> None:
        """Lose node ``name`` as a machine is lost: its link is cut, its kubelet, containerd,
        kube-proxy and every container are SIGKILLed. With ``out_of_service`` the cluster then
        taints the Node ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute``, as a
        cloud's automation does for a machine known to be down: once the node is NotReady its
        pods are force-deleted and can start elsewhere (see docs/local-cluster.md)."""
        self.node(name)
        self._request("lose", timeout, node=name, out_of_service=out_of_service)

    def restore_node(self, name: str, *, timeout: float = 180.0) -> None:
        """Boot a lost node again (link, containerd, kubelet, kube-proxy); returns once it is
        Ready, its out-of-service taint removed."""
        self.node(name)
        self._request("restore", timeout, node=name)

    def _request(self, action: str, timeout: float, **args: Any) -> dict[str, Any]:
        """Ask the supervisor to do ``action`` and wait for its reply."""
        if not self.pod_network or self.supervisor_pid() is None:
            raise ClusterError(f"the multi-node cluster in {self.dir} is not running")
        requests = self.run_dir / "requests"
        requests.mkdir(parents=True, exist_ok=True)
        rid = uuid.uuid4().hex[:12]
        tmp = requests / f".{rid}.tmp"
        tmp.write_text(json.dumps({"action": action, **args}))
        tmp.replace(requests / f"{rid}.request.json")
        reply_file = requests / f"{rid}.reply.json"
        deadline = time.monotonic() + timeout
        while not reply_file.exists():
            if self.supervisor_pid() is None:
                raise ClusterError(f"the supervisor exited during {action}; see {self.log_dir}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{action} {args} did not finish in {timeout:.0f}s")
            time.sleep(0.1)
        reply: dict[str, Any] = json.loads(reply_file.read_text())
        reply_file.unlink(missing_ok=True)
        if reply.get("error"):
            raise ClusterError(f"{action} {args}: {reply['error']}")
        return reply

    def exec_argv(self, where: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node ``where``'s network and mount namespaces (``cluster``: the
        cluster network namespace), e.g. ``["ip", "route"]``."""
        if where == "cluster":
            pid = self.supervisor_pid()
        else:
            pid = self._pid_from_file(self.run_dir / where / "holder.pid")
            self.node(where)
        if pid is None:
            raise ClusterError(f"{where} is not running")
        return ["nsenter", f"--target={pid}", "--net", "--mount", "--", *argv]

    # ------------------------------------------------------------------ life cycle

    def up(self, *, images: bool = True, build: bool = True, timeout: float = 300.0) -> None:
        """Start the cluster (or find it running) and, with ``images``, load the images."""
        if self.is_running():
            running = int(self.state().get("node_count", 1))
            if self._nodes and running != self._nodes:
                raise ClusterError(
                    f"{self.dir} runs {running} node(s), not {self._nodes}: `down` it first"
                )
            _log(f"already running (supervisor pid {self.supervisor_pid()}); {self.server}")
        else:
            self._start(build=build, timeout=timeout)
        if images:
            self.load_images()

    def _choose_apiserver_port(self) -> int:
        """One node: the fixed 6443 (or the one asked for). Several: the one asked for, else
        the one used last if it is free, else a free one; kept in ``DIR/apiserver-port``."""
        if not self.pod_network:
            return self._apiserver_port or DEFAULT_APISERVER_PORT
        port = self._apiserver_port
        if not port:
            with contextlib.suppress(OSError, ValueError):
                last = int((self.dir / "apiserver-port").read_text())
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind((_LOOPBACK, last))
                port = last
        port = port or free_port()
        (self.dir / "apiserver-port").write_text(f"{port}\n")
        return port

    def _start(self, *, build: bool, timeout: float) -> None:
        began = time.monotonic()
        self._nodes = self.node_count  # before the old state goes
        pid = self.supervisor_pid()
        if pid is None:
            self.cleanup_leftovers()
            ensure_packages(_APT_PACKAGES_NODES if self.pod_network else ())
            if build:  # the one-node cluster needs neither kube-proxy nor CoreDNS
                build_binaries(() if self.pod_network else ("cluster",), quiet=True)
            needed = ["kube_apiserver", "kube_controller_manager", "kube_scheduler", "kubelet"]
            needed += ["kubectl", "etcd"] + (["kube_proxy"] if self.pod_network else [])
            if missing := self.binaries.missing(needed):
                raise ClusterError(f"missing binaries {missing}; run devenv/build-kube.sh")
            build_pause_image()
            if self.pod_network:
                build_coredns_image()
                build_toolbox_image()
            for d in (self.log_dir, self.run_dir):
                d.mkdir(parents=True, exist_ok=True)
            self.state_file.unlink(missing_ok=True)
            port = self._choose_apiserver_port()
            log_file = (self.log_dir / "supervisor.log").open("ab")
            argv = [
                # A private mount namespace: the cluster's mounts never reach the machine.
                "unshare",
                "--mount",
                "--propagation=private",
                "--",
                sys.executable,
                "-m",
                "devenv.cluster",
                "_supervise",
                f"--dir={self.dir}",
                f"--apiserver-port={port}",
                f"--nodes={self.node_count}",
            ]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=env,
                start_new_session=True,  # outlives `up`
            )
            log_file.close()
            pid = popen.pid
            (self.run_dir / "supervisor.pid").write_text(f"{pid}\n")
            _log(f"supervisor pid {pid}; logs in {self.log_dir}")
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            state = self.state()
            phase = state.get("phase", "")
            if state.get("step") and state.get("step") != last:
                last = str(state["step"])
                _log(last)
            if phase == "ready" and state.get("pid") == pid:
                break
            if phase == "failed" or not pid_alive(pid):
                raise ClusterError(
                    f"cluster failed to start: {state.get('error', 'supervisor exited')}\n"
                    f"--- {self.log_dir / 'supervisor.log'}:\n"
                    f"{log_tail(self.log_dir / 'supervisor.log')}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not ready after {timeout:.0f}s (step: {last})")
            time.sleep(0.3)
        names = ", ".join(n.name for n in self.nodes())
        _log(f"up in {time.monotonic() - began:.1f}s: {self.server}, node(s) {names}")

    def down(self, *, purge: bool = False, timeout: float = 90.0) -> None:
        """Stop the supervisor (it tears the components down), then clean up leftovers."""
        pid = self.supervisor_pid()
        if pid is not None:
            _log(f"stopping supervisor {pid}")
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if pid_alive(pid):
                _log("supervisor did not stop in time: killing it")
                os.kill(pid, signal.SIGKILL)
        self.cleanup_leftovers()
        state = self.state()
        if state.get("phase") in ("starting", "ready"):  # its supervisor died: cleaned up now
            state.update(phase="stopped", step="stopped by `down` after the supervisor died")
            self.state_file.write_text(json.dumps(state, indent=2) + "\n")
        if purge and self.dir.exists():
            _log(f"removing {self.dir}")
            shutil.rmtree(self.dir)
        _log("down")

    def cleanup_leftovers(self) -> None:
        """Kill what a dead supervisor left behind: components, shims, containers, cgroups.

        On the multi-node cluster that also ends its network: its namespaces live only as long
        as the processes in them (node holders, the supervisor, containers).
        """
        pids = [p for f in self._pid_files() if (p := self._pid_from_file(f)) is not None]
        pids.extend(self.shim_pids())
        if pids:
            _log(f"killing leftover processes {sorted(pids)}")
            kill_and_wait(pids, timeout=5.0)
        if left := remove_cgroups(self.cgroup_base):
            _log(f"could not remove cgroups: {left}")
        for pid_file in self._pid_files():
            pid_file.unlink(missing_ok=True)
        # The single node's shims' sockets live in /run/containerd/s (hard-coded in containerd
        # 1.6); remove the directories when nothing else uses them (rmdir fails on a non-empty
        # one). The multi-node cluster's nodes have a /run of their own.
        for d in (Path("/run/containerd/s"), Path("/run/containerd")):
            with contextlib.suppress(OSError):
                d.rmdir()

    def shim_pids(self, nodes: Sequence[ClusterNode] | None = None) -> list[int]:
        """containerd shims started by our containerds (they name its socket)."""
        socks = {str(n.containerd_socket) for n in (self.nodes() if nodes is None else nodes)}
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = cmdline(int(entry.name))
                if argv and "containerd-shim" in argv[0] and socks.intersection(argv):
                    found.append(int(entry.name))
        return found

    # ------------------------------------------------------------------ images

    @property
    def loaded_images_file(self) -> Path:
        """The eop images :meth:`load_images` imported (ref -> archive): a restored node of
        the multi-node cluster gets them too."""
        return self.dir / "images.json"

    def load_images(self, *, prune: bool = True) -> dict[str, str]:
        """``devenv/images.sh all``, then import both archives into every running node.

        An image whose ref is already imported is skipped. With ``prune``, other tags of
        ``localhost/eop-operator`` and ``localhost/eop-spark`` are removed from containerd
        (``images.sh`` keeps one tag per image too). Returns ``{"operator": ref, "spark": ref}``.
        """
        if not self.is_running():
            raise ClusterError(f"the cluster in {self.dir} is not running")
        refs = build_images()
        images_dir = cache_root() / "images"
        archives = {
            ref: images_dir / f"eop-{name}-{ref.rsplit(':', 1)[1]}.tar"
            for name, ref in refs.items()
        }
        states = self.node_states()
        for node in self.nodes():
            if self.pod_network and states.get(node.name) != "ready":
                _log(f"{node.name} is {states.get(node.name) or 'down'}: not importing")
                continue
            present = set(self.ctr("images", "ls", "-q", check=True, node=node).stdout.split())
            snapshotter = str(self.state().get("snapshotter", "overlayfs"))
            for ref, archive in archives.items():
                if ref in present:
                    _log(f"already imported: {ref}")
                    continue
                start = time.monotonic()
                self.ctr(
                    "images",
                    "import",
                    f"--snapshotter={snapshotter}",
                    str(archive),
                    check=True,
                    node=node,
                )
                where = f" into {node.name}" if self.pod_network else ""
                _log(f"imported {ref}{where} in {time.monotonic() - start:.1f}s")
            if prune:
                stale = [
                    r
                    for r in present
                    if r.startswith(("localhost/eop-operator:", "localhost/eop-spark:"))
                    and r not in refs.values()
                ]
                if stale:
                    self.ctr("images", "rm", *stale, node=node)
                    _log(f"removed older images: {' '.join(sorted(stale))}")
                self._remove_orphaned_image_ids(node)
        if self.pod_network:
            self.loaded_images_file.write_text(
                json.dumps({ref: str(a) for ref, a in archives.items()}, indent=2) + "\n"
            )
        return refs

    def _remove_orphaned_image_ids(self, node: ClusterNode) -> None:
        """Remove the CRI's ``sha256:<image id>`` refs whose image has no name left.

        The CRI names every image it sees a second time, by its id; removing the tag leaves
        that ref, which keeps the whole image (layers and unpacked snapshot, ~1.5 GB for the
        Spark image) in the node's containerd for good: each older tree's images piled up.
        """
        listing = self.ctr("images", "ls", check=True, node=node).stdout.splitlines()[1:]
        targets = [(fields[0], fields[2]) for line in listing if len(fields := line.split()) > 2]
        named = {digest for ref, digest in targets if not ref.startswith("sha256:")}
        orphans = [r for r, digest in targets if r.startswith("sha256:") and digest not in named]
        if orphans:
            self.ctr("images", "rm", "--sync", *orphans, node=node)
            _log(f"removed {len(orphans)} images no name refers to any more")


# ----------------------------------------------------------------------------- CLI


def _status(cluster: LocalCluster) -> int:
    state = cluster.state()
    pid = cluster.supervisor_pid()
    phase = state.get("phase", "absent") if pid else "stopped"
    if not pid and state.get("phase") in ("starting", "ready"):
        phase = f"crashed (supervisor gone while {state['phase']}; `down` cleans up leftovers)"
    print(f"dir:        {cluster.dir}")
    print(f"phase:      {phase}" + (f" (supervisor pid {pid})" if pid else ""))
    if state.get("error"):
        print(f"error:      {state['error']}")
    if not pid:
        return 1
    print(f"apiserver:  {cluster.server}")
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"logs:       {cluster.log_dir}")
    if cluster.pod_network:
        print(f"gateway:    {GATEWAY} (pods reach exposed host ports here)")
        for name, info in state.get("nodes", {}).items():
            print(f"  {name:<8} {info.get('address', ''):<12} {info.get('pod_cidr', ''):<15} "
                  f"{info.get('state', '')}")  # fmt: skip
    for pid_file in cluster._pid_files():
        with contextlib.suppress(OSError, ValueError):
            p = int(pid_file.read_text().split()[0])
            name = str(pid_file.relative_to(cluster.run_dir))[: -len(".pid")]
            alive = cluster._pid_from_file(pid_file) is not None or pid_alive(p)
            print(f"  {name:<24} {p:>8} {'running' if alive else 'DEAD'}")
    result = cluster.kubectl("get", "nodes", "-o", "wide", timeout=15)
    print(result.stdout or result.stderr, end="")
    return 0 if phase == "ready" else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devenv.cluster {up,down,status,load-images,kubeconfig,node-lose,...}``."""
    parser = argparse.ArgumentParser(
        prog="python -m devenv.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--dir", type=Path, default=None, help="cluster dir (see above)")
        p.add_argument(
            "--nodes",
            type=int,
            default=None,
            help="node count (up; default 1); without --dir also picks the default dir",
        )
        return p

    up = add("up", help="start the cluster (idempotent) and load the images")
    up.add_argument("--no-images", action="store_true", help="skip devenv/images.sh + import")
    up.add_argument("--no-build", action="store_true", help="do not run build-kube.sh")
    up.add_argument(
        "--apiserver-port", type=int, default=None, help="default 6443 (one node), else free"
    )
    up.add_argument("--timeout", type=float, default=300.0)
    down = add("down", help="stop everything")
    down.add_argument("--purge", action="store_true", help="also delete the cluster dir")
    add("status", help="show the components and the nodes")
    add("load-images", help="build the images and import them into the cluster")
    add("kubeconfig", help="print the admin kubeconfig path")
    lose = add("node-lose", help="lose a node: cut its link, SIGKILL all of it")
    lose.add_argument("node")
    lose.add_argument(
        "--no-out-of-service",
        action="store_true",
        help="do not taint it out-of-service (its StatefulSet pods then stay Terminating)",
    )
    restore = add("node-restore", help="boot a lost node again")
    restore.add_argument("node")
    expose = add("expose", help="let pods reach the host's 127.0.0.1:PORT at the gateway")
    expose.add_argument("port", type=int)
    run = add("exec", help="run a command in a node's (or `cluster`) namespaces")
    run.add_argument("where", help="a node name, or `cluster` for the cluster network")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")
    sup = add("_supervise", help=argparse.SUPPRESS)
    sup.add_argument("--apiserver-port", type=int, default=DEFAULT_APISERVER_PORT)
    args = parser.parse_args(argv)

    port = getattr(args, "apiserver_port", None)
    try:
        cluster = LocalCluster(args.dir, apiserver_port=port, nodes=args.nodes)
        if args.command == "up":
            cluster.up(images=not args.no_images, build=not args.no_build, timeout=args.timeout)
            print(f"export KUBECONFIG={cluster.kubeconfig}")
            return 0
        if args.command == "down":
            cluster.down(purge=args.purge)
            return 0
        if args.command == "status":
            return _status(cluster)
        if args.command == "load-images":
            for ref in cluster.load_images().values():
                print(ref)
            return 0
        if args.command == "kubeconfig":
            print(cluster.kubeconfig)
            return 0
        if args.command == "node-lose":
            began = time.monotonic()
            cluster.lose_node(args.node, out_of_service=not args.no_out_of_service)
            print(f"{args.node} lost in {time.monotonic() - began:.1f}s")
            return 0
        if args.command == "node-restore":
            began = time.monotonic()
            cluster.restore_node(args.node)
            print(f"{args.node} Ready again in {time.monotonic() - began:.1f}s")
            return 0
        if args.command == "expose":
            print(cluster.expose_host_port(args.port))
            return 0
        if args.command == "exec":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            return subprocess.run(cluster.exec_argv(args.where, command or ["sh"])).returncode
        if args.command == "_supervise":
            from devenv.cluster_supervisor import Supervisor  # it imports this module

            return Supervisor(cluster, args.apiserver_port).run()
    except (
        ClusterError,
        ControlPlaneError,
        ImageError,
        NetnsError,
        subprocess.CalledProcessError,
    ) as exc:
        detail = ""
        if isinstance(exc, subprocess.CalledProcessError):
            detail = f"\n{exc.stdout or ''}{exc.stderr or ''}"
        print(f"error: {exc}{detail}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
