"""A single-node Kubernetes cluster on loopback, with a real kubelet and containerd.

::

    python -m devenv.cluster up [--dir DIR]     # start (idempotent), build + import the images
    python -m devenv.cluster status             # what runs, the node
    python -m devenv.cluster load-images        # devenv/images.sh all + import into containerd
    python -m devenv.cluster down [--purge]     # stop everything (--purge: delete DIR too)
    export KUBECONFIG=$(python -m devenv.cluster kubeconfig)

DIR is ``--dir``, else ``$EOP_CLUSTER_DIR``, else ``~/.cache/eop/cluster`` (``$EOP_CACHE``).

What runs (see docs/local-cluster.md for every flag and why):

* the control plane of :mod:`devenv.kube` (etcd, kube-apiserver on the fixed port
  127.0.0.1:6443, controller-manager, scheduler);
* a containerd of our own (Debian's ``containerd`` + ``runc``) with its config, root, state
  and socket under DIR, the CRI plugin on, cgroupfs, and a locally built pause image as the
  sandbox image (no registry is reachable);
* a kubelet registering node ``127.0.0.1`` (see :data:`NODE_NAME`), cgroup v1, host network;
* :mod:`devenv.hostpath_provisioner` serving the default StorageClass ``eop-hostpath``
  (``WaitForFirstConsumer``: see :func:`devenv.hostpath_provisioner.storage_class_manifest`).

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
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from devenv.hostpath_provisioner import STORAGE_CLASS, storage_class_manifest
from devenv.kube import ControlPlane, ControlPlaneError, KubeBinaries, build_binaries
from devenv.processes import free_port, spawn_logged
from devenv.versions import cache_root

__all__ = [
    "CGROUP_ROOT",
    "DEFAULT_APISERVER_PORT",
    "NODE_NAME",
    "ClusterError",
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

_LOOPBACK = "127.0.0.1"
_APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "util-linux")
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

_PAUSE_GO = """\
// The pod sandbox process: sleeps until SIGTERM/SIGINT and reaps zombies (it is PID 1 of
// pods that share their PID namespace). Built static; the only file of localhost/eop-pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
"""


class ClusterError(RuntimeError):
    """The local cluster failed to start, stop or answer."""


def default_cluster_dir() -> Path:
    """``$EOP_CLUSTER_DIR``, else ``<cache>/cluster`` (``~/.cache/eop/cluster``)."""
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


def _prepare_cgroup_root() -> None:
    """Create :data:`CGROUP_ROOT` in every v1 hierarchy (the kubelet checks it exists)."""
    name = CGROUP_ROOT.strip("/")
    for mount in _cgroup_mounts():
        path = mount / name
        path.mkdir(exist_ok=True)
        # A new cpuset cgroup has no CPUs and memory nodes: inherit the parent's.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((mount / knob).read_text())


def _cgroup_dirs() -> list[Path]:
    """Every cgroup below :data:`CGROUP_ROOT`, deepest first.

    runc also mirrors them into the (otherwise unused) cgroup2 mount of this hybrid layout.
    """
    name = CGROUP_ROOT.strip("/")
    dirs: list[Path] = []
    for mount in _cgroup_mounts(("cgroup", "cgroup2")):
        root = mount / name
        if root.is_dir():
            dirs.extend(Path(p) for p, _, _ in os.walk(root))
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs():
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def _remove_cgroups() -> list[Path]:
    """Kill what still runs below :data:`CGROUP_ROOT` and remove its cgroups.

    Returns the cgroups that could not be removed.
    """
    _kill_and_wait(sorted(_cgroup_pids()), timeout=2.0)
    left = []
    for d in _cgroup_dirs():
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(d)
    return left


# ----------------------------------------------------------------------------- pause image


def _oci_archive(out: Path, ref: str, files: Mapping[str, bytes], entrypoint: list[str]) -> None:
    """Write a one-layer OCI image archive (what ``ctr images import`` reads)."""
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
    layer = layer_buf.getvalue()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **blob(json.dumps(config, sort_keys=True).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **blob(json.dumps(manifest, sort_keys=True).encode()),
        "annotations": {
            "io.containerd.image.name": ref,
            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
        },
    }
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w") as arc:
        entries = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index).encode(),
            **{f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()},
        }
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            arc.addfile(info, io.BytesIO(data))
    tmp.replace(out)


def build_pause_image(cache: Path | None = None) -> tuple[str, Path]:
    """Build (cached) the sandbox image: a static Go ``/pause``. Returns (ref, archive)."""
    root = (cache or cache_root()) / "pause"
    tag = hashlib.sha256(_PAUSE_GO.encode()).hexdigest()[:12]
    ref = f"localhost/eop-pause:{tag}"
    archive = root / f"eop-pause-{tag}.tar"
    if archive.exists():
        return ref, archive
    go = shutil.which("go") or "/usr/local/go/bin/go"
    build = root / "src"
    build.mkdir(parents=True, exist_ok=True)
    (build / "pause.go").write_text(_PAUSE_GO)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "", "GO111MODULE": "off"}
    result = subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", "pause", "pause.go"],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ClusterError(f"building the pause binary failed:\n{result.stdout}{result.stderr}")
    _oci_archive(archive, ref, {"pause": (build / "pause").read_bytes()}, ["/pause"])
    return ref, archive


# ----------------------------------------------------------------------------- packages


def ensure_packages() -> None:
    """apt-get install containerd, runc, the CNI plugins and unshare when missing."""
    missing = []
    for pkg in _APT_PACKAGES:
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


class LocalCluster:
    """Paths, client helpers and life cycle of the cluster in ``work_dir``.

    The object is cheap: it holds no process. :meth:`up` starts the supervisor (or finds it
    running), :meth:`down` stops it; :meth:`kubectl`, :meth:`helm` and :meth:`ctr` talk to
    whatever runs in ``work_dir``.
    """

    def __init__(
        self, work_dir: Path | str | None = None, *, apiserver_port: int | None = None
    ) -> None:
        """``work_dir`` defaults to :func:`default_cluster_dir`."""
        self.dir = Path(work_dir).resolve() if work_dir else default_cluster_dir().resolve()
        self._apiserver_port = apiserver_port
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
        """containerd's config, root, state and socket."""
        return self.dir / "containerd"

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket (the CRI endpoint of the kubelet)."""
        return self.containerd_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's config, certificates and ``--root-dir`` (``root/``)."""
        return self.dir / "kubelet"

    @property
    def volumes_dir(self) -> Path:
        """Where the hostPath provisioner makes the volumes' directories."""
        return self.dir / "volumes"

    @property
    def state_file(self) -> Path:
        """The supervisor's state: phase, pids, ports, errors."""
        return self.run_dir / "state.json"

    @property
    def apiserver_port(self) -> int:
        """The apiserver port: from the running state, else the one asked for, else 6443."""
        if self._apiserver_port:
            return self._apiserver_port
        port = self.state().get("apiserver_port")
        return int(port) if port else DEFAULT_APISERVER_PORT

    @property
    def server(self) -> str:
        """The apiserver URL."""
        return f"https://{_LOOPBACK}:{self.apiserver_port}"

    def log_path(self, component: str) -> Path:
        """Log of ``component``: supervisor, etcd, kube-apiserver, containerd, kubelet, ..."""
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
        self, *args: str, check: bool = False, timeout: float | None = 600.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr -n k8s.io`` (the CRI's namespace) against our containerd."""
        return subprocess.run(
            ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
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

    # ------------------------------------------------------------------ life cycle

    def up(self, *, images: bool = True, build: bool = True, timeout: float = 300.0) -> None:
        """Start the cluster (or find it running) and, with ``images``, load the images."""
        if self.is_running():
            _log(f"already running (supervisor pid {self.supervisor_pid()}); {self.server}")
        else:
            self._start(build=build, timeout=timeout)
        if images:
            self.load_images()

    def _start(self, *, build: bool, timeout: float) -> None:
        began = time.monotonic()
        pid = self.supervisor_pid()
        if pid is None:
            self.cleanup_leftovers()
            ensure_packages()
            if build:
                build_binaries(quiet=True)
            if missing := self.binaries.missing():
                raise ClusterError(f"missing binaries {missing}; run devenv/build-kube.sh")
            build_pause_image()
            for d in (self.log_dir, self.run_dir):
                d.mkdir(parents=True, exist_ok=True)
            self.state_file.unlink(missing_ok=True)
            port = self._apiserver_port or DEFAULT_APISERVER_PORT
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
        _log(f"up in {time.monotonic() - began:.1f}s: {self.server}, node {NODE_NAME}")

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
        """Kill what a dead supervisor left behind: components, shims, containers, cgroups."""
        pids = []
        if self.run_dir.is_dir():
            for pid_file in self.run_dir.glob("*.pid"):
                with contextlib.suppress(OSError, ValueError):
                    pid = int(pid_file.read_text())
                    # Only our processes: their command line names this cluster's dir.
                    if _pid_alive(pid) and str(self.dir) in " ".join(_cmdline(pid)):
                        pids.append(pid)
        pids.extend(self._shim_pids())
        if pids:
            _log(f"killing leftover processes {sorted(pids)}")
            _kill_and_wait(pids, timeout=5.0)
        if left := _remove_cgroups():
            _log(f"could not remove cgroups: {left}")
        if self.run_dir.is_dir():
            for pid_file in self.run_dir.glob("*.pid"):
                pid_file.unlink(missing_ok=True)
        # Our shims' sockets live in /run/containerd/s (hard-coded in containerd 1.6); remove
        # the directories when nothing else uses them (rmdir fails on a non-empty one).
        for d in (Path("/run/containerd/s"), Path("/run/containerd")):
            with contextlib.suppress(OSError):
                d.rmdir()

    def _shim_pids(self) -> list[int]:
        """containerd shims started by our containerd (they name its socket)."""
        sock = str(self.containerd_socket)
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                argv = _cmdline(int(entry.name))
                if argv and "containerd-shim" in argv[0] and sock in argv:
                    found.append(int(entry.name))
        return found

    # ------------------------------------------------------------------ images

    def load_images(self, *, prune: bool = True) -> dict[str, str]:
        """``devenv/images.sh all``, then import both archives into our containerd.

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
        present = set(self.ctr("images", "ls", "-q", check=True).stdout.split())
        snapshotter = str(self.state().get("snapshotter", "overlayfs"))
        images_dir = cache_root() / "images"
        for name, ref in refs.items():
            if ref in present:
                _log(f"already imported: {ref}")
                continue
            archive = images_dir / f"eop-{name}-{ref.rsplit(':', 1)[1]}.tar"
            start = time.monotonic()
            self.ctr("images", "import", f"--snapshotter={snapshotter}", str(archive), check=True)
            _log(f"imported {ref} in {time.monotonic() - start:.1f}s")
        if prune:
            stale = [
                r
                for r in present
                if r.startswith(("localhost/eop-operator:", "localhost/eop-spark:"))
                and r not in refs.values()
            ]
            if stale:
                self.ctr("images", "rm", *stale)
                _log(f"removed older images: {' '.join(sorted(stale))}")
        return refs


# ----------------------------------------------------------------------------- supervisor


class _Stop(Exception):
    """SIGTERM/SIGINT reached the supervisor."""


class _Supervisor:
    """Runs in the private mount namespace: starts, watches and stops every component."""

    def __init__(self, cluster: LocalCluster, apiserver_port: int) -> None:
        self.c = cluster
        self.apiserver_port = apiserver_port
        self.children: list[_Child] = []
        self.cp: ControlPlane | None = None
        self.state: dict[str, Any] = {
            "phase": "starting",
            "pid": os.getpid(),
            "apiserver_port": apiserver_port,
            "node": NODE_NAME,
            "kubeconfig": str(cluster.kubeconfig),
        }
        self.snapshotter = "overlayfs"

    # ------------------------------------------------------------------ helpers

    def _write_state(self, **changes: Any) -> None:
        self.state.update(changes)
        tmp = self.c.state_file.with_name("state.json.tmp")
        tmp.write_text(json.dumps(self.state, indent=2) + "\n")
        tmp.replace(self.c.state_file)

    def _step(self, text: str) -> None:
        print(f"{time.strftime('%F %T')} {text}", flush=True)
        self._write_state(step=text)

    def _spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> _Child:
        popen, log_file = spawn_logged(argv, self.c.log_path(name), cwd=self.c.dir, env=env)
        child = _Child(name, popen, log_file)
        self.children.append(child)
        (self.c.run_dir / f"{name}.pid").write_text(f"{popen.pid}\n")
        return child

    def _stop_child(self, child: _Child, timeout: float = 15.0) -> None:
        if child.popen.poll() is None:
            child.popen.terminate()
            try:
                child.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()
        child.log_file.close()
        (self.c.run_dir / f"{child.name}.pid").unlink(missing_ok=True)
        if child in self.children:
            self.children.remove(child)

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
            time.sleep(1.0)

    def _start(self) -> None:
        c = self.c
        for d in (c.log_dir, c.run_dir, c.volumes_dir, c.log_dir / "pods"):
            d.mkdir(parents=True, exist_ok=True)
        self._step("isolating: sysctl masks, /var/log")
        self._isolate()
        self._step("starting the control plane")
        self.cp = ControlPlane(
            c.control_plane_dir,
            binaries=c.binaries,
            scheduler=True,
            apiserver_port=self.apiserver_port,
            extra_apiserver_args=[
                # Reach the kubelet at the node's InternalIP (127.0.0.1), nothing else.
                "--kubelet-preferred-address-types=InternalIP",
            ],
        )
        self.cp.start()
        for name, pid in self.cp.pids.items():
            (c.run_dir / f"{name}.pid").write_text(f"{pid}\n")
        shutil.copyfile(self.cp.kubeconfig, c.kubeconfig)
        c.kubeconfig.chmod(0o600)
        self._step(f"control plane up in {self.cp.start_seconds:.1f}s; starting containerd")
        self._start_containerd()
        self._step("importing the pause image")
        _, archive = build_pause_image()
        c.ctr("images", "import", f"--snapshotter={self.snapshotter}", str(archive), check=True)
        self._step("starting the kubelet")
        self._start_kubelet()
        self._step("storage class and hostPath provisioner")
        self._ensure_storage_class()
        self._spawn(
            "hostpath-provisioner",
            [
                sys.executable,
                "-m",
                "devenv.hostpath_provisioner",
                f"--kubeconfig={c.kubeconfig}",
                f"--root={c.volumes_dir}",
                f"--node={NODE_NAME}",
                f"--storage-class={STORAGE_CLASS}",
            ],
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

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
        """Private-namespace-only changes: mask kubelet sysctls, give it our /var/log."""
        masks = self.c.run_dir / "sysctl"
        masks.mkdir(exist_ok=True)
        for key, value in _KUBELET_SYSCTLS.items():
            target = Path("/proc/sys") / key
            if target.read_text().strip() == value:
                continue
            fake = masks / key.replace("/", ".")
            fake.write_text(value + "\n")
            subprocess.run(["mount", "--bind", str(fake), str(target)], check=True)
        # The kubelet symlinks container logs into the hard-coded /var/log/containers.
        var_log = self.c.dir / "node" / "var-log"
        var_log.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(var_log), "/var/log"], check=True)

    # ------------------------------------------------------------------ containerd

    def _containerd_config(self, snapshotter: str, sandbox_image: str) -> str:
        d = self.c.containerd_dir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
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
  address = "{self.c.containerd_socket}"

[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  # No registry is reachable: the sandbox (pause) image is built locally and imported.
  sandbox_image = "{sandbox_image}"
  # kubectl exec/attach/port-forward streams: loopback, a free port.
  stream_server_address = "127.0.0.1"
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
    # Pods use the host network, so no CNI plugin ever runs; but the CRI reports the
    # network ready (and the kubelet the node Ready) only once a config exists here.
    bin_dir = "{_CNI_BIN_DIR}"
    conf_dir = "{self.c.dir / "cni" / "net.d"}"
"""

    def _start_containerd(self) -> None:
        c = self.c
        d = c.containerd_dir
        for sub in ("root", "state", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cni = c.dir / "cni" / "net.d"
        cni.mkdir(parents=True, exist_ok=True)
        # A loopback-only network: enough for the CRI to report NetworkReady.
        (cni / "10-eop-host.conflist").write_text(
            json.dumps(
                {"cniVersion": "1.0.0", "name": "eop-host", "plugins": [{"type": "loopback"}]},
                indent=2,
            )
            + "\n"
        )
        pause_ref, _ = build_pause_image()
        for snapshotter in ("overlayfs", "native"):
            config = d / "config.toml"
            config.write_text(self._containerd_config(snapshotter, pause_ref))
            c.containerd_socket.unlink(missing_ok=True)
            child = self._spawn("containerd", ["containerd", f"--config={config}"])
            self._wait_for(
                "containerd's socket",
                child,
                lambda: c.ctr("version", timeout=10).returncode == 0,
                60,
            )
            plugins = c.ctr("plugins", "ls", check=True).stdout
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

    def _kubelet_config(self, port: int, healthz_port: int) -> str:
        c = self.c
        assert self.cp is not None
        pki = self.cp.pki_dir
        return f"""\
# Written by devenv/cluster.py for the local cluster; see docs/local-cluster.md.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The kubelet API (logs, exec, metrics) on loopback only, a port picked at start; the
# apiserver reads it from the Node's status. No unauthenticated read-only port.
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
# Serving certificate signed by the cluster CA (no TLS bootstrap, no rotation).
tlsCertFile: {pki / "kubelet-serving.crt"}
tlsPrivateKeyFile: {pki / "kubelet-serving.key"}
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
containerRuntimeEndpoint: unix://{c.containerd_socket}
# This machine has cgroup v1 (plus an empty cgroup2 mount): recent kubelets refuse v1
# unless told to accept it. No systemd as init, so the cgroupfs driver (containerd's runc
# options say the same).
failCgroupV1: false
cgroupDriver: cgroupfs
# Pods and QoS classes live under {CGROUP_ROOT}/kubepods in each hierarchy, apart from the
# machine's own cgroups; `down` removes {CGROUP_ROOT}.
cgroupRoot: {CGROUP_ROOT}
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
podLogsDir: {c.log_dir / "pods"}
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
# No cluster DNS: pods get the host's resolver (and clients use 127.0.0.1 anyway).
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
# No static pods, no graceful node shutdown (needs systemd-logind).
staticPodPath: ""
shutdownGracePeriod: 0s
registerNode: true
"""

    def _start_kubelet(self) -> None:
        c = self.c
        cp = self.cp
        assert cp is not None
        cp.issue_certificate(
            "kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "clientAuth"
        )
        kubeconfig = cp.cert_kubeconfig("kubelet-client", f"system:node:{NODE_NAME}")
        cp.issue_certificate(
            "kubelet-serving", f"/CN={NODE_NAME}", "serverAuth", f"IP:{NODE_NAME},DNS:localhost"
        )
        _prepare_cgroup_root()
        root = c.kubelet_dir / "root"
        root.mkdir(parents=True, exist_ok=True)
        healthz_port = free_port()
        config = c.kubelet_dir / "config.yaml"
        config.write_text(self._kubelet_config(free_port(), healthz_port))
        child = self._spawn(
            "kubelet",
            [
                str(c.binaries.kubelet),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                # State, volumes, plugins, pod dirs: under the cluster dir.
                f"--root-dir={root}",
                # The node name, and through it the node's only address; see NODE_NAME.
                f"--hostname-override={NODE_NAME}",
                "--v=1",
            ],
        )

        def healthy() -> bool:
            try:
                url = f"http://127.0.0.1:{healthz_port}/healthz"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    return bool(resp.status == 200)
            except (OSError, urllib.error.URLError):
                return False

        self._wait_for("the kubelet's /healthz", child, healthy, 90)

        def node_ready() -> bool:
            out = c.kubectl("get", "node", NODE_NAME, "-o", "json", timeout=10)
            if out.returncode != 0:
                return False
            conditions = json.loads(out.stdout).get("status", {}).get("conditions", [])
            return any(x["type"] == "Ready" and x["status"] == "True" for x in conditions)

        self._wait_for(f"node {NODE_NAME} Ready", child, node_ready, 120)

    # ------------------------------------------------------------------ teardown

    def _teardown(self) -> None:
        c = self.c
        for name in ("hostpath-provisioner", "kubelet"):
            for child in [x for x in self.children if x.name == name]:
                print(f"stopping {name}", flush=True)
                self._stop_child(child)
        containerd = [x for x in self.children if x.name == "containerd"]
        if containerd and containerd[0].popen.poll() is None:
            # Stop every container and sandbox (the kubelet no longer does).
            tasks = c.ctr("tasks", "ls", "-q", timeout=30)
            ids = tasks.stdout.split() if tasks.returncode == 0 else []
            if ids:
                print(f"killing {len(ids)} containers", flush=True)
                for cid in ids:
                    c.ctr("tasks", "kill", "--all", "--signal=SIGKILL", cid, timeout=30)
                time.sleep(0.5)
                c.ctr("tasks", "delete", "--force", *ids, timeout=60)
        for child in list(self.children):
            print(f"stopping {child.name}", flush=True)
            self._stop_child(child)
        shims = c._shim_pids()
        if shims:
            print(f"killing leftover shims {shims}", flush=True)
            _kill_and_wait(shims, timeout=5.0)
        if left := _remove_cgroups():
            print(f"could not remove cgroups {left}", flush=True)
        if self.cp is not None:
            print("stopping the control plane", flush=True)
            self.cp.stop()
            for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                (c.run_dir / f"{name}.pid").unlink(missing_ok=True)


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
    for pid_file in sorted(cluster.run_dir.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            p = int(pid_file.read_text())
            print(f"  {pid_file.stem:<24} {p:>8} {'running' if _pid_alive(p) else 'DEAD'}")
    result = cluster.kubectl("get", "nodes", "-o", "wide", timeout=15)
    print(result.stdout or result.stderr, end="")
    return 0 if phase == "ready" else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devenv.cluster {up,down,status,load-images,kubeconfig}``."""
    parser = argparse.ArgumentParser(
        prog="python -m devenv.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--dir", type=Path, default=None, help="cluster dir (see above)")
        return p

    up = add("up", help="start the cluster (idempotent) and load the images")
    up.add_argument("--no-images", action="store_true", help="skip devenv/images.sh + import")
    up.add_argument("--no-build", action="store_true", help="do not run build-kube.sh")
    up.add_argument("--apiserver-port", type=int, default=None, help="default 6443")
    up.add_argument("--timeout", type=float, default=300.0)
    down = add("down", help="stop everything")
    down.add_argument("--purge", action="store_true", help="also delete the cluster dir")
    add("status", help="show the components and the node")
    add("load-images", help="build the images and import them into the cluster")
    add("kubeconfig", help="print the admin kubeconfig path")
    sup = add("_supervise", help=argparse.SUPPRESS)
    sup.add_argument("--apiserver-port", type=int, default=DEFAULT_APISERVER_PORT)
    args = parser.parse_args(argv)

    port = getattr(args, "apiserver_port", None)
    cluster = LocalCluster(args.dir, apiserver_port=port)
    try:
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
        if args.command == "_supervise":
            return _Supervisor(cluster, args.apiserver_port).run()
    except (ClusterError, ControlPlaneError, subprocess.CalledProcessError) as exc:
        detail = ""
        if isinstance(exc, subprocess.CalledProcessError):
            detail = f"\n{exc.stdout or ''}{exc.stderr or ''}"
        print(f"error: {exc}{detail}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
