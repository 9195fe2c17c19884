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
each node ``nodeN`` (``10.88.0.1N``) is a containerd, a kubelet and a kube-proxy in the network
and mount namespaces of a holder process, its pods on the CNI bridge (``10.244.N.0/24``);
CoreDNS serves ``cluster.local``; :mod:`devenv.netns_forward` forwards the host's
``127.0.0.1:<port>`` to the apiserver and, on request, the gateway to host services
(:meth:`LocalCluster.expose_host_port`).

``up`` starts a supervisor process (``_supervise``) in a private mount namespace
(``unshare --mount``): every mount the kubelet and containerd make (overlay snapshots,
tmpfs volumes) stays in it and goes away with it, and it masks the kernel sysctls the kubelet
would otherwise rewrite machine-wide. The supervisor starts the components as its children
(they die with it), writes pid files to ``DIR/run`` and state to ``DIR/run/state.json``,
and tears everything down on SIGTERM. Logs: ``DIR/logs/<component>.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from devenv.cluster_addons import coredns_manifests, kube_proxy_config
from devenv.cluster_images import (
    ImageError,
    build_coredns_image,
    build_pause_image,
    build_toolbox_image,
)
from devenv.hostpath_provisioner import STORAGE_CLASS, storage_class_manifest
from devenv.kube import ControlPlane, ControlPlaneError, KubeBinaries, build_binaries
from devenv.netns_forward import Endpoint, Forward, read_forward
from devenv.podnet import (
    DNS_SERVICE_IP,
    GATEWAY,
    NetnsError,
    add_node_link,
    cut_node_link,
    node_layout,
    setup_cluster_network,
    unshare_network,
)
from devenv.processes import free_port, spawn_logged
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

#: The node's name. The kubelet refuses a loopback ``--node-ip`` ("nodeIP can't be loopback
#: address"), but when ``--hostname-override`` is an IP it takes that as the node's
#: InternalIP as is. So the node is named after its address: the apiserver then reaches the
#: kubelet (logs, exec) at 127.0.0.1, and host-network pods get podIP/hostIP 127.0.0.1, which
#: is where the kubelet's probes go. Any other name would make the kubelet fall back to the
#: machine's non-loopback address.
NODE_NAME = "127.0.0.1"

#: Parent cgroup (in every cgroup v1 hierarchy) of everything the kubelet runs.
CGROUP_ROOT = "/eop"

#: Node loss on the multi-node cluster (the defaults are 40 s lease, 50 s grace, 300 s): a
#: kubelet renews its Lease every NODE_LEASE_SECONDS / 4; the controller-manager marks a node
#: NotReady when it has not for NODE_MONITOR_GRACE_SECONDS; pods tolerate a NotReady or
#: unreachable node for TOLERATION_SECONDS before they are evicted.
NODE_LEASE_SECONDS = 10
NODE_MONITOR_GRACE_SECONDS = 10
TOLERATION_SECONDS = 5
#: The taint of Kubernetes' non-graceful node shutdown: on a NotReady node that carries it,
#: pods are force-deleted (and volumes detached) so that they can start elsewhere.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service=nodeshutdown"

_LOOPBACK = "127.0.0.1"
_APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "util-linux")
#: More for the multi-node cluster: kube-proxy's iptables, the toolbox image's busybox.
_APT_PACKAGES_NODES = ("iptables", "busybox-static", "iproute2")
_CNI_BIN_DIR = Path("/usr/lib/cni")

# Kernel settings the kubelet's container manager sets machine-wide at start-up unless they
# already have these values (protectKernelDefaults=true would make it fail instead). The
# supervisor bind-mounts files with these values over /proc/sys/... inside its own mount
# namespace: the kubelet sees what it wants and the machine's settings stay untouched.
_KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


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


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _pid_alive(pid: int) -> bool:
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


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _kill_and_wait(pids: Sequence[int], timeout: float = 10.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still alive after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        alive = [p for p in pids if _pid_alive(p)]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_pid_alive(p) for p in alive):
            time.sleep(0.1)


def _sigkill_and_wait(pids: Sequence[int], timeout: float = 5.0) -> None:
    """SIGKILL ``pids`` (a machine losing power) and wait until they are gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, names it uniquely."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[19]
    except (OSError, IndexError):
        return None


# ----------------------------------------------------------------------------- cgroups


def _cgroup_mounts(types: tuple[str, ...] = ("cgroup",)) -> list[Path]:
    """Mount points of the cgroup hierarchies of ``types`` (``cgroup`` is v1: ``cpu``,
    ``memory``, ``name=systemd``...; ``cgroup2`` the unified one)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] and right.split()[0] in types:
            mounts.append(Path(left.split()[4]))
    return mounts


def _prepare_cgroup_root(root: str = CGROUP_ROOT) -> None:
    """Create ``root`` (and its parents) in every v1 hierarchy (the kubelet checks it exists)."""
    parts = root.strip("/").split("/")
    for mount in _cgroup_mounts():
        parent = mount
        for part in parts:
            path = parent / part
            path.mkdir(exist_ok=True)
            # A new cpuset cgroup has no CPUs and memory nodes: inherit the parent's.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (path / knob).exists() and not (path / knob).read_text().strip():
                    (path / knob).write_text((parent / knob).read_text())
            parent = path


def _cgroup_dirs(root: str = CGROUP_ROOT) -> list[Path]:
    """Every cgroup below ``root`` (itself included), deepest first.

    runc also mirrors them into the (otherwise unused) cgroup2 mount of this hybrid layout.
    """
    name = root.strip("/")
    dirs: list[Path] = []
    for mount in _cgroup_mounts(("cgroup", "cgroup2")):
        top = mount / name
        if top.is_dir():
            dirs.extend(Path(p) for p, _, _ in os.walk(top))
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids(root: str = CGROUP_ROOT) -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs(root):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def _remove_cgroups(root: str = CGROUP_ROOT, *, signal_first: bool = True) -> list[Path]:
    """Kill what still runs below ``root`` and remove its cgroups.

    With ``signal_first`` processes get SIGTERM and 2 s before SIGKILL, else SIGKILL at once.
    Returns the cgroups that could not be removed.
    """
    pids = sorted(_cgroup_pids(root))
    if signal_first:
        _kill_and_wait(pids, timeout=2.0)
    else:
        _sigkill_and_wait(pids)
    left = []
    for d in _cgroup_dirs(root):
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(d)
    return left


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
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


# ----------------------------------------------------------------------------- the cluster


@dataclass
class _Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes]


@dataclass(frozen=True)
class ClusterNode:
    """One node: its containerd, kubelet (and on the pod network kube-proxy), and their files.

    The single-node cluster's node is ``127.0.0.1`` with its files directly in the cluster dir
    (``containerd/``, ``kubelet/``, ``cni/``, ``logs/containerd.log``...); a node of the
    multi-node cluster has them in ``DIR/nodes/<name>/`` and its logs in ``DIR/logs/<name>/``.
    """

    name: str
    #: Where the apiserver reaches the kubelet, and the containerd streams (exec, logs).
    address: str
    dir: Path
    log_dir: Path
    #: Bound over ``/var/log`` for the kubelet (it links container logs into
    #: ``/var/log/containers``).
    var_log: Path
    volumes_dir: Path
    #: Parent cgroup of the node's pods, in every hierarchy.
    cgroup_root: str
    #: The node's pod CIDR and its gateway (the CNI bridge); None: host network only.
    pod_cidr: str | None = None
    pod_gateway: str | None = None

    @property
    def pod_network(self) -> bool:
        """Whether this node is on the pod network (the multi-node cluster)."""
        return self.pod_cidr is not None

    @property
    def containerd_dir(self) -> Path:
        """containerd's config, root, state and socket."""
        return self.dir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket (the CRI endpoint of the kubelet)."""
        return self.containerd_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's config and ``--root-dir`` (``root/``)."""
        return self.dir / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        """containerd's CNI config dir."""
        return self.dir / "cni" / "net.d"

    @property
    def var_lib(self) -> Path:
        """Bound over ``/var/lib`` in a pod-network node (CNI's result cache and the
        ``host-local`` IP allocations live in ``/var/lib/cni``)."""
        return self.dir / "var-lib"

    def component(self, name: str) -> str:
        """A component's name for its log and pid file: ``kubelet``, or ``node1/kubelet``."""
        return f"{self.name}/{name}" if self.pod_network else name


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
    def containerd_dir(self) -> Path:
        """containerd's config, root, state and socket (of the first node)."""
        return self.nodes()[0].containerd_dir

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket (the CRI endpoint of the kubelet; of the first node)."""
        return self.nodes()[0].containerd_socket

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's config and ``--root-dir`` (``root/``; of the first node)."""
        return self.nodes()[0].kubelet_dir

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
        """The cgroup of every node's pods: ``/eop`` (one node), ``/eop-<hash of the dir>``."""
        if not self.pod_network:
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
                    cgroup_root=CGROUP_ROOT,
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
        if _pid_alive(pid) and "_supervise" in _cmdline(pid):
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
        if not _pid_alive(pid):
            return None
        if start:
            return pid if _start_time(pid) == start[0] else None
        return pid if str(self.dir) in " ".join(_cmdline(pid)) else None

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
        return subprocess.run(
            [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            check=check,
            timeout=timeout,
            env=self.env(),
        )

    def helm(
        self, *args: str, check: bool = False, timeout: float | None = 600.0
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against the cluster (its cache/config/data dirs under ``DIR/helm``)."""
        env = self.env()
        for kind in ("CACHE", "CONFIG", "DATA"):
            env[f"HELM_{kind}_HOME"] = str(self.dir / "helm" / kind.lower())
        return subprocess.run(
            [str(self.binaries.helm), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=env,
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
            if build:
                build_binaries(quiet=True)
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
            if phase == "failed" or not _pid_alive(pid):
                raise ClusterError(
                    f"cluster failed to start: {state.get('error', 'supervisor exited')}\n"
                    f"--- {self.log_dir / 'supervisor.log'}:\n"
                    f"{_tail(self.log_dir / 'supervisor.log')}"
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
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _pid_alive(pid):
                _log("supervisor did not stop in time: killing it")
                os.kill(pid, signal.SIGKILL)
        self.cleanup_leftovers()
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
        pids.extend(self._shim_pids())
        if pids:
            _log(f"killing leftover processes {sorted(pids)}")
            _kill_and_wait(pids, timeout=5.0)
        if left := _remove_cgroups(self.cgroup_base):
            _log(f"could not remove cgroups: {left}")
        for pid_file in self._pid_files():
            pid_file.unlink(missing_ok=True)
        # The single node's shims' sockets live in /run/containerd/s (hard-coded in containerd
        # 1.6); remove the directories when nothing else uses them (rmdir fails on a non-empty
        # one). The multi-node cluster's nodes have a /run of their own.
        for d in (Path("/run/containerd/s"), Path("/run/containerd")):
            with contextlib.suppress(OSError):
                d.rmdir()

    def _shim_pids(self, nodes: Sequence[ClusterNode] | None = None) -> list[int]:
        """containerd shims started by our containerds (they name its socket)."""
        socks = {str(n.containerd_socket) for n in (self.nodes() if nodes is None else nodes)}
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = _cmdline(int(entry.name))
                if argv and "containerd-shim" in argv[0] and socks.intersection(argv):
                    found.append(int(entry.name))
        return found

    # ------------------------------------------------------------------ images

    @property
    def _loaded_images_file(self) -> Path:
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
        built = time.monotonic()
        _log(f"images built in {built - began:.1f}s: {' '.join(refs.values())}")
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
        if self.pod_network:
            self._loaded_images_file.write_text(
                json.dumps({ref: str(a) for ref, a in archives.items()}, indent=2) + "\n"
            )
        return refs


# ----------------------------------------------------------------------------- supervisor


class _Stop(Exception):
    """SIGTERM/SIGINT reached the supervisor."""


class _Supervisor:
    """Runs in the private mount namespace: starts, watches and stops every component.

    On the multi-node cluster it also makes the network (:mod:`devenv.podnet`): it moves
    itself into a new network namespace (the cluster network) and starts each node in a
    namespace of its node's holder process.
    """

    def __init__(self, cluster: LocalCluster, apiserver_port: int) -> None:
        self.c = cluster
        self.apiserver_port = apiserver_port
        self.children: list[_Child] = []
        self.cp: ControlPlane | None = None
        self.multi = cluster.pod_network
        self.layout = {a.name: a for a in node_layout(cluster.node_count)}
        self.state: dict[str, Any] = {
            "phase": "starting",
            "pid": os.getpid(),
            "apiserver_port": apiserver_port,
            "node_count": cluster.node_count,
            "node": NODE_NAME if not self.multi else None,
            "kubeconfig": str(cluster.kubeconfig),
        }
        if self.multi:
            self.state["gateway"] = GATEWAY
            self.state["nodes"] = {
                n.name: {"address": n.address, "pod_cidr": n.pod_cidr, "state": "starting"}
                for n in cluster.nodes()
            }
        self.snapshotter = "overlayfs"
        self.holders: dict[str, _Child] = {}

    # ------------------------------------------------------------------ helpers

    def _write_state(self, **changes: Any) -> None:
        self.state.update(changes)
        tmp = self.c.state_file.with_name("state.json.tmp")
        tmp.write_text(json.dumps(self.state, indent=2) + "\n")
        tmp.replace(self.c.state_file)

    def _set_node_state(self, node: ClusterNode, state: str, **more: Any) -> None:
        if self.multi:
            self.state["nodes"][node.name].update(state=state, **more)
            self._write_state()

    def _step(self, text: str) -> None:
        print(f"{time.strftime('%F %T')} {text}", flush=True)
        self._write_state(step=text)

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        node: ClusterNode | None = None,
        pass_fds: Sequence[int] = (),
    ) -> _Child:
        """Start a component; on a pod-network ``node``, inside its namespaces."""
        if node is not None and node.pod_network:
            holder = self.holders[node.name].popen.pid
            argv = ["nsenter", f"--target={holder}", "--net", "--mount", "--", *argv]
        log = self.c.log_path(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        popen, log_file = spawn_logged(argv, log, cwd=self.c.dir, env=env, pass_fds=pass_fds)
        child = _Child(name, popen, log_file)
        self.children.append(child)
        pid_file = self.c.run_dir / f"{name}.pid"
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        pid_file.write_text(f"{popen.pid} {_start_time(popen.pid) or ''}\n")
        return child

    def _forget_child(self, child: _Child) -> None:
        child.log_file.close()
        (self.c.run_dir / f"{child.name}.pid").unlink(missing_ok=True)
        if child in self.children:
            self.children.remove(child)

    def _stop_child(self, child: _Child, timeout: float = 15.0) -> None:
        if child.popen.poll() is None:
            child.popen.terminate()
            try:
                child.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()
        self._forget_child(child)

    def _node_children(self, node: ClusterNode) -> list[_Child]:
        prefix = node.component("")
        return [x for x in self.children if x.name.startswith(prefix)] if prefix else []

    def _wait_for(self, what: str, child: _Child | None, check: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if child is not None and child.popen.poll() is not None:
                raise ClusterError(
                    f"{child.name} exited ({child.popen.returncode}) while waiting for {what}; "
                    f"last lines of {self.c.log_path(child.name)}:\n"
                    f"{_tail(self.c.log_path(child.name))}"
                )
            if time.monotonic() > deadline:
                log = self.c.log_path(child.name) if child else None
                tail = f"\nlast lines of {log}:\n{_tail(log)}" if log else ""
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")
            time.sleep(0.3)

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            raise _Stop

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        code = 0
        try:
            self._write_state()
            self._start()
            self._write_state(phase="ready", step="ready", ready_at=time.time())
            self._watch()
        except _Stop:
            print("stopping on signal", flush=True)
        except Exception as exc:
            print(f"error: {exc}", flush=True)
            self._write_state(phase="failed", error=str(exc))
            code = 1
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            self._teardown()
            if self.state.get("phase") != "failed":
                self._write_state(phase="stopped", step="stopped")
        return code

    def _watch(self) -> None:
        while True:
            for child in self.children:
                if child.popen.poll() is not None:
                    raise ClusterError(
                        f"{child.name} exited with {child.popen.returncode}; "
                        f"see {self.c.log_path(child.name)}"
                    )
            if self.cp is not None and not self.cp.running:
                raise ClusterError(f"a control-plane component exited; see {self.cp.log_dir}")
            if self.multi:
                self._serve_requests()
            time.sleep(0.3 if self.multi else 1.0)

    def _start(self) -> None:
        c = self.c
        for d in (c.log_dir, c.run_dir, c.log_dir / "pods"):
            d.mkdir(parents=True, exist_ok=True)
        self._step("isolating: sysctl masks, /var/log")
        self._isolate()
        if self.multi:
            self._step("the cluster network: namespaces, bridge, forwarder")
            self._start_network()
        self._step("starting the control plane")
        self.cp = ControlPlane(
            c.control_plane_dir,
            binaries=c.binaries,
            scheduler=True,
            apiserver_port=self.apiserver_port,
            **self._control_plane_options(),
        )
        self.cp.start()
        for name, pid in self.cp.pids.items():
            (c.run_dir / f"{name}.pid").write_text(f"{pid} {_start_time(pid) or ''}\n")
        shutil.copyfile(self.cp.kubeconfig, c.kubeconfig)
        c.kubeconfig.chmod(0o600)
        if self.multi:
            self._wait_for("the apiserver's forward on the host", None, self._forward_ready, 30)
        self._step(f"control plane up in {self.cp.start_seconds:.1f}s; starting the node(s)")
        if self.multi:
            self._forget_other_nodes()
        self._start_nodes(c.nodes())
        self._step("storage class and hostPath provisioner")
        self._ensure_storage_class()
        self._spawn(
            "hostpath-provisioner",
            [
                sys.executable,
                "-m",
                "devenv.hostpath_provisioner",
                f"--kubeconfig={c.kubeconfig}",
                *(
                    [f"--node={n.name}={n.volumes_dir}" for n in c.nodes()]
                    if self.multi
                    else [f"--root={c.volumes_dir}", f"--node={NODE_NAME}"]
                ),
                f"--storage-class={STORAGE_CLASS}",
            ],
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        if self.multi:
            self._step("cluster DNS (CoreDNS)")
            self._start_dns()

    def _forget_other_nodes(self) -> None:
        """Delete the Nodes of an earlier start of this dir with more nodes than now."""
        out = self.c.kubectl("get", "nodes", "-o", "name", check=True).stdout.split()
        stale = [n for n in out if n.removeprefix("node/") not in self.layout]
        if stale:
            print(f"deleting nodes of an earlier start: {stale}", flush=True)
            self.c.kubectl("delete", *stale, "--wait=false", check=True)

    def _control_plane_options(self) -> dict[str, Any]:
        """The control plane's flags: the single node reaches it on loopback; the multi-node
        cluster's runs in the cluster network namespace, reached at the gateway address."""
        if not self.multi:
            return {
                # Reach the kubelet at the node's InternalIP (127.0.0.1), nothing else.
                "extra_apiserver_args": ["--kubelet-preferred-address-types=InternalIP"],
            }
        return {
            # 127.0.0.1 for the control plane's own components (and the host, through the
            # forwarder), the gateway for the nodes and pods.
            "apiserver_bind_address": "0.0.0.0",
            # The `kubernetes` Service's endpoint: pods reach the apiserver at 10.0.0.1:443.
            "advertise_address": GATEWAY,
            "extra_sans": [f"IP:{GATEWAY}"],
            "extra_apiserver_args": [
                "--kubelet-preferred-address-types=InternalIP",
                # Pods tolerate a NotReady/unreachable node this long before they are
                # evicted (default 300 s).
                f"--default-not-ready-toleration-seconds={TOLERATION_SECONDS}",
                f"--default-unreachable-toleration-seconds={TOLERATION_SECONDS}",
            ],
            "extra_controller_manager_args": [
                # A node whose lease is not renewed for this long is NotReady (default 50 s);
                # kubelets renew every NODE_LEASE_SECONDS / 4.
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
                "--node-monitor-period=1s",
            ],
        }

    def _ensure_storage_class(self) -> None:
        """Apply the StorageClass; replace one with another binding mode (an immutable field,
        so a cluster dir made before the switch to WaitForFirstConsumer keeps working)."""
        wanted = storage_class_manifest()
        current = self.c.kubectl("get", "storageclass", STORAGE_CLASS, "-o", "json")
        if current.returncode == 0:
            mode = json.loads(current.stdout).get("volumeBindingMode")
            if mode != wanted["volumeBindingMode"]:
                print(f"replacing StorageClass {STORAGE_CLASS} (binding mode {mode})", flush=True)
                self.c.kubectl("delete", "storageclass", STORAGE_CLASS, check=True)
        self.c.apply(wanted)

    def _isolate(self) -> None:
        """Private-namespace-only changes: mask kubelet sysctls, give it our /var/log (the
        multi-node cluster's nodes each get theirs in their own mount namespace)."""
        masks = self.c.run_dir / "sysctl"
        masks.mkdir(exist_ok=True)
        for key, value in _KUBELET_SYSCTLS.items():
            target = Path("/proc/sys") / key
            if target.read_text().strip() == value:
                continue
            fake = masks / key.replace("/", ".")
            fake.write_text(value + "\n")
            subprocess.run(["mount", "--bind", str(fake), str(target)], check=True)
        if self.multi:
            return
        # The kubelet symlinks container logs into the hard-coded /var/log/containers.
        var_log = self.c.nodes()[0].var_log
        var_log.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(var_log), "/var/log"], check=True)

    # ------------------------------------------------------------------ the network

    def _start_network(self) -> None:
        """Move into a new network namespace (the cluster network: bridge, gateway, routes)
        and start the forwarder, which keeps a handle on the host's namespace."""
        host_netns = os.open("/proc/self/ns/net", os.O_RDONLY)
        unshare_network()
        setup_cluster_network(list(self.layout.values()))
        rules = self.c.run_dir / "forwards"
        shutil.rmtree(rules, ignore_errors=True)
        rules.mkdir(parents=True)
        (self.c.run_dir / "forwards.json").unlink(missing_ok=True)
        # The host's 127.0.0.1:PORT to the apiserver (same port in the cluster namespace).
        rule = Forward(
            listen=Endpoint("host", _LOOPBACK, self.apiserver_port),
            target=Endpoint("cluster", _LOOPBACK, self.apiserver_port),
        )
        (rules / "apiserver.json").write_text(json.dumps(rule.to_json()))
        self._spawn(
            "forwarder",
            [
                sys.executable,
                "-m",
                "devenv.netns_forward",
                f"--host-netns-fd={host_netns}",
                f"--rules={rules}",
                f"--status={self.c.run_dir / 'forwards.json'}",
            ],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            pass_fds=[host_netns],
        )
        os.close(host_netns)

    def _forward_ready(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((self.c.run_dir / "forwards.json").read_text())
            entry = status["forwards"].get("apiserver", {})
            if entry.get("error"):
                raise ClusterError(f"the apiserver's forward on the host: {entry['error']}")
            return bool(entry.get("listening"))
        return False

    # ------------------------------------------------------------------ nodes

    def _start_nodes(self, nodes: Sequence[ClusterNode]) -> None:
        """Boot ``nodes``: each step for all of them before the next, so they start together."""
        for node in nodes:
            self._set_node_state(node, "starting")
            if node.pod_network:
                self._boot_node(node)
        for node in nodes:
            self._start_containerd(node)
        self._step("importing images")
        for node in nodes:
            self._import_images(node)
        self._step("starting the kubelet(s)")
        kubelets = [(node, self._spawn_kubelet(node)) for node in nodes]
        for node, (child, healthz) in kubelets:
            self._wait_kubelet(node, child, healthz)
        for node in nodes:
            if node.pod_network:
                self._start_kube_proxy(node)
                # A node lost before (and perhaps never restored) is back: lift the taint.
                self.c.kubectl("taint", "node", node.name, f"{OUT_OF_SERVICE_TAINT}:NoExecute-")
            self._set_node_state(node, "ready", ready_at=time.time())

    def _boot_node(self, node: ClusterNode) -> None:
        """A fresh machine: clear what lives in its /run and its pods' IPs, start its holder
        (the process whose network and mount namespaces are the node's), plug it in."""
        shutil.rmtree(node.containerd_dir / "state", ignore_errors=True)
        shutil.rmtree(node.var_lib / "cni" / "networks", ignore_errors=True)
        if left := _remove_cgroups(node.cgroup_root, signal_first=False):
            raise ClusterError(f"{node.name}: cgroups left from before: {left}")
        for d in (node.var_log, node.var_lib, node.volumes_dir, node.log_dir / "pods"):
            d.mkdir(parents=True, exist_ok=True)
        # Its own /run (a tmpfs, as at boot: containerd's shim sockets, pods' netns files),
        # /var/lib (CNI's cache and IP allocations) and /var/log.
        script = (
            "mount -t tmpfs -o mode=0755 eop-node-run /run"
            f" && mount --bind {node.var_lib} /var/lib"
            f" && mount --bind {node.var_log} /var/log"
            " && exec sleep infinity"
        )
        holder = self._spawn(
            node.component("holder"),
            ["unshare", "--net", "--mount", "--propagation=private", "--", "sh", "-c", script],
        )
        self.holders[node.name] = holder

        def booted() -> bool:
            with contextlib.suppress(OSError):
                return Path(f"/proc/{holder.popen.pid}/comm").read_text().strip() == "sleep"
            return False

        self._wait_for(f"{node.name}'s namespaces", holder, booted, 15)
        # Its start time after the exec, so that a pid file read later matches.
        (self.c.run_dir / f"{holder.name}.pid").write_text(
            f"{holder.popen.pid} {_start_time(holder.popen.pid) or ''}\n"
        )
        add_node_link(self.layout[node.name], holder.popen.pid, list(self.layout.values()))
        self._set_node_state(node, "starting", holder=holder.popen.pid)
        node.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (node.cni_conf_dir / "10-eop-pods.conflist").write_text(
            json.dumps(_pod_network_conflist(node), indent=2) + "\n"
        )

    def _import_images(self, node: ClusterNode) -> None:
        """The pause image; on the pod network also CoreDNS, the toolbox and the eop images
        last loaded (``load_images``), unless already there."""
        archives: dict[str, Path] = {}
        ref, archive = build_pause_image()
        archives[ref] = archive
        if node.pod_network:
            coredns, toolbox = build_coredns_image(), build_toolbox_image()
            archives.update((coredns, toolbox))
            self._write_state(images={"coredns": coredns[0], "toolbox": toolbox[0]})
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(self.c._loaded_images_file.read_text())
                archives.update({r: Path(a) for r, a in loaded.items() if Path(a).exists()})
            present = set(self.c.ctr("images", "ls", "-q", node=node).stdout.split())
            archives = {r: a for r, a in archives.items() if r not in present}
        for archive in archives.values():
            self.c.ctr(
                "images", "import", f"--snapshotter={self.snapshotter}", str(archive),
                check=True, node=node,
            )  # fmt: skip

    # ------------------------------------------------------------------ containerd

    def _containerd_config(self, node: ClusterNode, snapshotter: str, sandbox_image: str) -> str:
        d = node.containerd_dir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        if node.pod_network:
            cni_comment = """\
    # The pod network: Debian's CNI bridge + host-local plugins (DIR/nodes/<node>/cni/net.d),
    # run by containerd inside the node's network namespace."""
        else:
            cni_comment = """\
    # Pods use the host network, so no CNI plugin ever runs; but the CRI reports the
    # network ready (and the kubelet the node Ready) only once a config exists here."""
        return f"""\
# Written by devenv/cluster.py for the local cluster; see docs/local-cluster.md.
version = 2
# Everything of this containerd lives under the cluster dir: nothing in /var/lib/containerd
# or /run/containerd (except the shims' sockets, /run/containerd/s/<hash of our socket>).
root = "{d / "root"}"
state = "{d / "state"}"
# Fail at start-up if the CRI plugin cannot load (the kubelet needs nothing else).
required_plugins = ["io.containerd.grpc.v1.cri"]
# Snapshotters that cannot work here; they would only log errors.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "{node.containerd_socket}"

[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  # No registry is reachable: the sandbox (pause) image is built locally and imported.
  sandbox_image = "{sandbox_image}"
  # kubectl exec/attach/port-forward streams: the node's address, a free port.
  stream_server_address = "{node.address}"
  stream_server_port = "0"
  # We lack CAP_SYS_RESOURCE here, so no process may lower its oom_score_adj; the CRI
  # asks for -998 (sandboxes) and -997 (Guaranteed pods), which runc then fails to set
  # ("can't get final child's PID from pipe"). Clamp requests to containerd's own score.
  restrict_oom_score_adj = true
  # No AppArmor or SELinux here; do not load profiles into the kernel.
  disable_apparmor = true
  enable_selinux = false

  [{cri}.containerd]
    # overlayfs when the kernel allows it (checked at start), else native (copies).
    snapshotter = "{snapshotter}"
    default_runtime_name = "runc"

    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        # runc's state under ours, not /run/containerd/runc.
        Root = "{d / "state" / "runc"}"
        # The kubelet's cgroup driver is cgroupfs (no systemd here); both must agree.
        SystemdCgroup = false

  [{cri}.cni]
{cni_comment}
    bin_dir = "{_CNI_BIN_DIR}"
    conf_dir = "{node.cni_conf_dir}"
"""

    def _start_containerd(self, node: ClusterNode) -> None:
        d = node.containerd_dir
        for sub in ("root", "state", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cni = node.cni_conf_dir
        cni.mkdir(parents=True, exist_ok=True)
        if not node.pod_network:
            # A loopback-only network: enough for the CRI to report NetworkReady.
            (cni / "10-eop-host.conflist").write_text(
                json.dumps(
                    {"cniVersion": "1.0.0", "name": "eop-host", "plugins": [{"type": "loopback"}]},
                    indent=2,
                )
                + "\n"
            )
        pause_ref, _ = build_pause_image()
        # Once a node found overlayfs unusable, the others use native at once.
        options = ("overlayfs", "native") if self.snapshotter == "overlayfs" else ("native",)
        for snapshotter in options:
            config = d / "config.toml"
            config.write_text(self._containerd_config(node, snapshotter, pause_ref))
            node.containerd_socket.unlink(missing_ok=True)
            child = self._spawn(
                node.component("containerd"), ["containerd", f"--config={config}"], node=node
            )
            self._wait_for(
                f"{node.component('containerd')}'s socket",
                child,
                lambda: self.c.ctr("version", timeout=10, node=node).returncode == 0,
                60,
            )
            plugins = self.c.ctr("plugins", "ls", check=True, node=node).stdout
            status = {
                tuple(line.split()[:2]): line.split()[-1]
                for line in plugins.splitlines()[1:]
                if len(line.split()) >= 4
            }
            if status.get(("io.containerd.snapshotter.v1", snapshotter)) == "ok":
                self.snapshotter = snapshotter
                self._write_state(snapshotter=snapshotter)
                return
            print(f"snapshotter {snapshotter} unavailable; trying the next", flush=True)
            self._stop_child(child)
        raise ClusterError("neither the overlayfs nor the native snapshotter works")

    # ------------------------------------------------------------------ kubelet

    def _kubelet_config(self, node: ClusterNode, port: int, healthz_port: int) -> str:
        assert self.cp is not None
        pki = self.cp.pki_dir
        serving = "kubelet-serving" if not node.pod_network else f"kubelet-serving-{node.name}"
        if node.pod_network:
            dns = f"""\
# Cluster DNS: CoreDNS behind the kube-dns Service. The nodes' own resolver has no upstream
# (the cluster network has no way out), so names outside the cluster fail at once.
clusterDNS: [{DNS_SERVICE_IP}]
resolvConf: {self.c.dir / "nodes" / "resolv.conf"}
clusterDomain: cluster.local
# Heartbeats: the Lease is renewed every {NODE_LEASE_SECONDS / 4:g} s (a quarter of its
# duration), so that the controller-manager's {NODE_MONITOR_GRACE_SECONDS} s grace period marks a
# lost node NotReady.
nodeLeaseDurationSeconds: {NODE_LEASE_SECONDS}
nodeStatusUpdateFrequency: 5s"""
        else:
            dns = """\
# No cluster DNS: pods get the host's resolver (and clients use 127.0.0.1 anyway).
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local"""
        where = (
            "the node's address in its network namespace"
            if node.pod_network
            else "loopback only, a port picked at start"
        )
        return f"""\
# Written by devenv/cluster.py for the local cluster; see docs/local-cluster.md.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The kubelet API (logs, exec, metrics) on {where}; the
# apiserver reads it from the Node's status. No unauthenticated read-only port.
address: {node.address}
port: {port}
readOnlyPort: 0
healthzBindAddress: {node.address}
healthzPort: {healthz_port}
# Serving certificate signed by the cluster CA (no TLS bootstrap, no rotation).
tlsCertFile: {pki / f"{serving}.crt"}
tlsPrivateKeyFile: {pki / f"{serving}.key"}
rotateCertificates: false
serverTLSBootstrap: false
# Only the apiserver (client cert from the cluster CA) may call the kubelet; what it may do
# is asked of the apiserver (SubjectAccessReview).
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {pki / "ca.crt"}
authorization:
  mode: Webhook
# Our containerd (CRI) socket.
containerRuntimeEndpoint: unix://{node.containerd_socket}
# This machine has cgroup v1 (plus an empty cgroup2 mount): recent kubelets refuse v1
# unless told to accept it. No systemd as init, so the cgroupfs driver (containerd's runc
# options say the same).
failCgroupV1: false
cgroupDriver: cgroupfs
# Pods and QoS classes live under {node.cgroup_root}/kubepods in each hierarchy, apart from the
# machine's own cgroups; `down` removes {node.cgroup_root}.
cgroupRoot: {node.cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
# No CAP_SYS_RESOURCE here: the kubelet can neither lower its own oom_score_adj (default
# -999) nor raise RLIMIT_NOFILE above the hard limit (default 1000000); keep both as they are.
oomScoreAdj: 0
maxOpenFiles: {resource.getrlimit(resource.RLIMIT_NOFILE)[1]}
# No swap here, but do not refuse to start if there is.
failSwapOn: false
# The kubelet would set vm.overcommit_memory, kernel.panic, ... machine-wide; true would make
# it fail instead. The supervisor masks those sysctls in its private mount namespace, so the
# kubelet finds the values it wants and changes nothing.
protectKernelDefaults: false
# Container logs under the cluster dir (kubectl logs reads them through the kubelet).
podLogsDir: {node.log_dir / "pods"}
containerLogMaxSize: 10Mi
containerLogMaxFiles: 3
# Images cannot be pulled again (no registry): never garbage-collect them for disk space.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A shared dev machine: evict only when really short (the defaults evict at 10-15% free
# disk, which other engineers' data can reach and which would taint the node).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
{dns}
# No static pods, no graceful node shutdown (needs systemd-logind).
staticPodPath: ""
shutdownGracePeriod: 0s
registerNode: true
"""

    def _spawn_kubelet(self, node: ClusterNode) -> tuple[_Child, int]:
        """Start the node's kubelet; returns it and its healthz port."""
        cp = self.cp
        assert cp is not None
        cp.issue_certificate(
            f"kubelet-client-{node.name}" if node.pod_network else "kubelet-client",
            f"/O=system:nodes/CN=system:node:{node.name}",
            "clientAuth",
        )
        if node.pod_network:
            kubeconfig = cp.cert_kubeconfig(
                f"kubelet-client-{node.name}",
                f"system:node:{node.name}",
                server=f"https://{GATEWAY}:{self.apiserver_port}",
            )
            cp.issue_certificate(
                f"kubelet-serving-{node.name}",
                f"/CN={node.name}",
                "serverAuth",
                f"IP:{node.address},DNS:{node.name}",
            )
            # Fixed ports: the node's network namespace is its own.
            port, healthz_port = 10250, 10248
            resolv = self.c.dir / "nodes" / "resolv.conf"
            resolv.write_text("# The cluster network has no upstream resolver.\n")
        else:
            kubeconfig = cp.cert_kubeconfig("kubelet-client", f"system:node:{NODE_NAME}")
            cp.issue_certificate(
                "kubelet-serving", f"/CN={NODE_NAME}", "serverAuth", f"IP:{NODE_NAME},DNS:localhost"
            )
            port, healthz_port = free_port(), free_port()
        _prepare_cgroup_root(node.cgroup_root)
        root = node.kubelet_dir / "root"
        root.mkdir(parents=True, exist_ok=True)
        (node.log_dir / "pods").mkdir(parents=True, exist_ok=True)
        config = node.kubelet_dir / "config.yaml"
        config.write_text(self._kubelet_config(node, port, healthz_port))
        flags = [
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            # State, volumes, plugins, pod dirs: under the cluster dir.
            f"--root-dir={root}",
        ]
        if node.pod_network:
            # Its name, and its address on the cluster network.
            flags += [f"--hostname-override={node.name}", f"--node-ip={node.address}"]
        else:
            # The node name, and through it the node's only address; see NODE_NAME.
            flags += [f"--hostname-override={NODE_NAME}"]
        child = self._spawn(
            node.component("kubelet"), [str(self.c.binaries.kubelet), *flags, "--v=1"], node=node
        )
        return child, healthz_port

    def _wait_kubelet(self, node: ClusterNode, child: _Child, healthz_port: int) -> None:
        def healthy() -> bool:
            try:
                url = f"http://{node.address}:{healthz_port}/healthz"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return bool(resp.status == 200)
            except (OSError, urllib.error.URLError):
                return False

        self._wait_for(f"{node.name}'s kubelet /healthz", child, healthy, 90)
        self._wait_for(f"node {node.name} Ready", child, lambda: self._node_ready(node.name), 120)

    def _node_ready(self, name: str) -> bool:
        out = self.c.kubectl("get", "node", name, "-o", "json", timeout=10)
        if out.returncode != 0:
            return False
        conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
        return any(x["type"] == "Ready" and x["status"] == "True" for x in conditions)

    # ------------------------------------------------------------------ kube-proxy, DNS

    def _start_kube_proxy(self, node: ClusterNode) -> None:
        cp = self.cp
        assert cp is not None
        cp.issue_certificate("kube-proxy", "/CN=system:kube-proxy", "clientAuth")
        kubeconfig = cp.cert_kubeconfig(
            "kube-proxy", "system:kube-proxy", server=f"https://{GATEWAY}:{self.apiserver_port}"
        )
        config = node.dir / "kube-proxy.yaml"
        config.write_text(kube_proxy_config(node.name, node.address, kubeconfig))
        child = self._spawn(
            node.component("kube-proxy"),
            [str(self.c.binaries.kube_proxy), f"--config={config}", "--v=1"],
            node=node,
        )

        def healthy() -> bool:
            try:
                url = f"http://{node.address}:10256/healthz"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return bool(resp.status == 200)
            except urllib.error.HTTPError:
                return False  # 503 until its first sync
            except (OSError, urllib.error.URLError):
                return False

        self._wait_for(f"{node.name}'s kube-proxy /healthz", child, healthy, 60)

    def _start_dns(self) -> None:
        ref, _ = build_coredns_image()
        self.c.apply(*coredns_manifests(ref, replicas=min(2, self.c.node_count)))

        def available() -> bool:
            out = self.c.kubectl("-n", "kube-system", "get", "deployment", "coredns", "-o", "json")
            if out.returncode != 0:
                return False
            return int(json.loads(out.stdout).get("status", {}).get("readyReplicas") or 0) >= 1

        self._wait_for("CoreDNS ready", None, available, 120)

    # ------------------------------------------------------------------ node loss

    def _serve_requests(self) -> None:
        """Answer the requests of ``LocalCluster._request`` (node loss and restore)."""
        requests = self.c.run_dir / "requests"
        for path in sorted(requests.glob("*.request.json")) if requests.is_dir() else []:
            reply: dict[str, Any] = {}
            try:
                req = json.loads(path.read_text())
                node = self.c.node(str(req.get("node")))
                if req.get("action") == "lose":
                    self._lose_node(node, bool(req.get("out_of_service", True)))
                elif req.get("action") == "restore":
                    self._restore_node(node)
                else:
                    raise ClusterError(f"unknown action {req.get('action')!r}")
            except (ClusterError, ControlPlaneError, NetnsError, OSError, ValueError) as exc:
                reply["error"] = str(exc)
            except subprocess.CalledProcessError as exc:
                reply["error"] = f"{exc}: {exc.stderr or ''}"
            reply_file = path.with_name(path.name.replace(".request.", ".reply."))
            tmp = reply_file.with_name(f".{reply_file.name}.tmp")
            tmp.write_text(json.dumps(reply))
            tmp.replace(reply_file)
            path.unlink(missing_ok=True)

    def _lose_node(self, node: ClusterNode, out_of_service: bool) -> None:
        """Cut the node's link, then SIGKILL all of it at once: kubelet, kube-proxy,
        containerd, shims, containers, the holder (its namespaces go with it)."""
        if self.state["nodes"][node.name]["state"] == "lost":
            return
        began = time.time()
        print(f"losing {node.name}", flush=True)
        cut_node_link(self.layout[node.name])
        children = self._node_children(node)
        pids = [x.popen.pid for x in children]
        pids += self.c._shim_pids([node]) + sorted(_cgroup_pids(node.cgroup_root))
        _sigkill_and_wait(pids)
        for child in children:
            child.popen.wait()
            self._forget_child(child)
        self.holders.pop(node.name, None)
        if left := _remove_cgroups(node.cgroup_root, signal_first=False):
            print(f"could not remove cgroups {left}", flush=True)
        self._set_node_state(node, "lost", lost_at=began, holder=None)
        if out_of_service:
            self.c.kubectl("taint", "node", node.name, f"{OUT_OF_SERVICE_TAINT}:NoExecute",
                           "--overwrite", check=True)  # fmt: skip
        print(f"lost {node.name} in {time.time() - began:.1f}s", flush=True)

    def _restore_node(self, node: ClusterNode) -> None:
        """Boot a lost node (once Ready, its out-of-service taint is lifted)."""
        if self.state["nodes"][node.name]["state"] != "lost":
            raise ClusterError(f"{node.name} is {self.state['nodes'][node.name]['state']}")
        print(f"restoring {node.name}", flush=True)
        try:
            self._start_nodes([node])
        except BaseException:
            self._lose_node_quietly(node)
            raise

    def _lose_node_quietly(self, node: ClusterNode) -> None:
        self.state["nodes"][node.name]["state"] = "restoring"
        with contextlib.suppress(Exception):
            self._lose_node(node, out_of_service=False)

    # ------------------------------------------------------------------ teardown

    def _stop_node(self, node: ClusterNode) -> None:
        """Stop a node in order: kubelet and kube-proxy, every container, containerd, shims,
        the holder, the node's cgroups."""
        c = self.c
        for name in ("kube-proxy", "kubelet"):
            for child in [x for x in self.children if x.name == node.component(name)]:
                print(f"stopping {child.name}", flush=True)
                self._stop_child(child)
        containerd = [x for x in self.children if x.name == node.component("containerd")]
        if containerd and containerd[0].popen.poll() is None:
            # Stop every container and sandbox (the kubelet no longer does).
            tasks = c.ctr("tasks", "ls", "-q", timeout=30, node=node)
            ids = tasks.stdout.split() if tasks.returncode == 0 else []
            if ids:
                print(f"killing {len(ids)} containers", flush=True)
                for cid in ids:
                    c.ctr("tasks", "kill", "--all", "--signal=SIGKILL", cid, timeout=30, node=node)
                time.sleep(0.5)
                c.ctr("tasks", "delete", "--force", *ids, timeout=60, node=node)
        for child in containerd:
            print(f"stopping {child.name}", flush=True)
            self._stop_child(child)
        shims = c._shim_pids([node])
        if shims:
            print(f"killing leftover shims {shims}", flush=True)
            _kill_and_wait(shims, timeout=5.0)
        for child in self._node_children(node):
            self._stop_child(child)
        self.holders.pop(node.name, None)
        if node.pod_network and (left := _remove_cgroups(node.cgroup_root)):
            print(f"could not remove cgroups {left}", flush=True)

    def _teardown(self) -> None:
        c = self.c
        for child in [x for x in self.children if x.name == "hostpath-provisioner"]:
            print(f"stopping {child.name}", flush=True)
            self._stop_child(child)
        for node in c.nodes():
            self._stop_node(node)
        for child in list(self.children):
            print(f"stopping {child.name}", flush=True)
            self._stop_child(child)
        if left := _remove_cgroups(c.cgroup_base):
            print(f"could not remove cgroups {left}", flush=True)
        if self.cp is not None:
            print("stopping the control plane", flush=True)
            self.cp.stop()
            for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                (c.run_dir / f"{name}.pid").unlink(missing_ok=True)
        if self.multi:
            for node in c.nodes():
                self._set_node_state(node, "stopped")


def _pod_network_conflist(node: ClusterNode) -> dict[str, Any]:
    """The node's CNI network: a bridge ``cni0`` holding the pod gateway, host-local IPs from
    the node's pod CIDR (allocations in the node's /var/lib/cni), hostPort support."""
    return {
        "cniVersion": "1.0.0",
        "name": "eop-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                # No NAT: every node and the cluster network route the pod CIDRs.
                "ipMasq": False,
                # A pod reaching itself through a Service comes back over the bridge.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr, "gateway": node.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


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
            alive = cluster._pid_from_file(pid_file) is not None or _pid_alive(p)
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
            return _Supervisor(cluster, args.apiserver_port).run()
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
