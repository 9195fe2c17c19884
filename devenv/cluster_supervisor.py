"""The local cluster's supervisor: the process that starts, watches and stops every component.

``python -m devenv.cluster up`` starts it as ``python -m devenv.cluster _supervise`` inside
``unshare --mount --propagation=private``: every mount the kubelets and containerds make
stays in its mount namespace and goes with it, and it masks the kernel sysctls a kubelet would
otherwise rewrite machine-wide. The components are its children (they get SIGTERM if it dies);
it writes their pid files to ``DIR/run``, its state to ``DIR/run/state.json``, and tears
everything down on SIGTERM.

On the multi-node cluster it also makes the network (:mod:`devenv.podnet`): it moves itself
into a new network namespace (the cluster network, where the control plane runs) and boots
each node in the network and mount namespaces of the node's holder process; it serves node
loss and restore (:meth:`devenv.cluster.LocalCluster.lose_node`) from request files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from devenv.cgroups import cgroup_pids, prepare_cgroup_root, remove_cgroups
from devenv.cluster import REPO, ClusterError, LocalCluster
from devenv.cluster_configs import (
    NODE_MONITOR_GRACE_SECONDS,
    NODE_NAME,
    OUT_OF_SERVICE_TAINT,
    TOLERATION_SECONDS,
    ClusterNode,
    containerd_config,
    coredns_manifests,
    kube_proxy_config,
    kubelet_config,
    pod_network_conflist,
)
from devenv.cluster_images import build_coredns_image, build_pause_image, build_toolbox_image
from devenv.hostpath_provisioner import STORAGE_CLASS, storage_class_manifest
from devenv.kube import ControlPlane, ControlPlaneError
from devenv.netns_forward import Endpoint, Forward
from devenv.podnet import (
    GATEWAY,
    NetnsError,
    add_node_link,
    cut_node_link,
    node_layout,
    setup_cluster_network,
    unshare_network,
)
from devenv.processes import (
    free_port,
    kill_and_wait,
    log_tail,
    sigkill_and_wait,
    spawn_logged,
    start_time,
    terminate,
)

__all__ = ["Supervisor"]

_LOOPBACK = "127.0.0.1"

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


@dataclass
class _Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes]


class _Stop(Exception):
    """SIGTERM/SIGINT reached the supervisor."""


class Supervisor:
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
        pid_file.write_text(f"{popen.pid} {start_time(popen.pid) or ''}\n")
        return child

    def _forget_child(self, child: _Child) -> None:
        child.log_file.close()
        (self.c.run_dir / f"{child.name}.pid").unlink(missing_ok=True)
        if child in self.children:
            self.children.remove(child)

    def _stop_child(self, child: _Child, timeout: float = 15.0) -> None:
        terminate(child.popen, timeout)
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
                    f"{log_tail(self.c.log_path(child.name))}"
                )
            if time.monotonic() > deadline:
                log = self.c.log_path(child.name) if child else None
                tail = f"\nlast lines of {log}:\n{log_tail(log)}" if log else ""
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
            (c.run_dir / f"{name}.pid").write_text(f"{pid} {start_time(pid) or ''}\n")
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
        if left := remove_cgroups(node.cgroup_root, signal_first=False):
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
            f"{holder.popen.pid} {start_time(holder.popen.pid) or ''}\n"
        )
        add_node_link(self.layout[node.name], holder.popen.pid, list(self.layout.values()))
        self._set_node_state(node, "starting", holder=holder.popen.pid)
        node.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (node.cni_conf_dir / "10-eop-pods.conflist").write_text(
            json.dumps(pod_network_conflist(node), indent=2) + "\n"
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
                loaded = json.loads(self.c.loaded_images_file.read_text())
                archives.update({r: Path(a) for r, a in loaded.items() if Path(a).exists()})
            present = set(self.c.ctr("images", "ls", "-q", node=node).stdout.split())
            archives = {r: a for r, a in archives.items() if r not in present}
        for archive in archives.values():
            self.c.ctr(
                "images", "import", f"--snapshotter={self.snapshotter}", str(archive),
                check=True, node=node,
            )  # fmt: skip

    # ------------------------------------------------------------------ containerd

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
            config.write_text(containerd_config(node, snapshotter, pause_ref))
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
        prepare_cgroup_root(node.cgroup_root)
        root = node.kubelet_dir / "root"
        root.mkdir(parents=True, exist_ok=True)
        (node.log_dir / "pods").mkdir(parents=True, exist_ok=True)
        config = node.kubelet_dir / "config.yaml"
        config.write_text(
            kubelet_config(
                node,
                pki=cp.pki_dir,
                port=port,
                healthz_port=healthz_port,
                resolv_conf=self.c.dir / "nodes" / "resolv.conf",
            )
        )
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
        pids += self.c.shim_pids([node]) + sorted(cgroup_pids(node.cgroup_root))
        sigkill_and_wait(pids)
        for child in children:
            child.popen.wait()
            self._forget_child(child)
        self.holders.pop(node.name, None)
        if left := remove_cgroups(node.cgroup_root, signal_first=False):
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
        shims = c.shim_pids([node])
        if shims:
            print(f"killing leftover shims {shims}", flush=True)
            kill_and_wait(shims, timeout=5.0)
        for child in self._node_children(node):
            self._stop_child(child)
        self.holders.pop(node.name, None)
        if node.pod_network and (left := remove_cgroups(node.cgroup_root)):
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
        if left := remove_cgroups(c.cgroup_base):
            print(f"could not remove cgroups {left}", flush=True)
        if self.cp is not None:
            print("stopping the control plane", flush=True)
            self.cp.stop()
            for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
                (c.run_dir / f"{name}.pid").unlink(missing_ok=True)
        if self.multi:
            for node in c.nodes():
                self._set_node_state(node, "stopped")
