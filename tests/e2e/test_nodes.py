"""The multi-node local cluster (``devenv.cluster --nodes 3``): real kubelets, each in a network
namespace of its own, on a pod network with kube-proxy and CoreDNS; node loss as on a real
cluster; nothing left behind by ``down``.

Pods here use no ``hostNetwork``; they run the busybox toolbox image (``sh``, ``nc``, ``wget``,
``httpd``). The last test stops the cluster (the fixture starts it again for later tests).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.cluster import (
    NODE_MONITOR_GRACE_SECONDS,
    OUT_OF_SERVICE_TAINT,
    ClusterError,
    LocalCluster,
)
from tests.e2e.test_cluster import _eventually

pytestmark = pytest.mark.nodes

#: Loss -> NotReady: the grace period, plus the controller-manager's 1 s monitor period and a
#: margin for a loaded machine.
NOT_READY_WITHIN = NODE_MONITOR_GRACE_SECONDS + 15
#: Loss -> the StatefulSet's pod Ready on another node: NotReady, then PodGC (every 20 s)
#: force-deletes the pod, then the new one starts. Measured 20-26 s on 2 busy cores.
RESCHEDULED_WITHIN = 90


# ----------------------------------------------------------------------------- helpers


def _get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "-o", "json", *args)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def _apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    cluster.kubectl("apply", "-f", "-", input=manifest, check=True)


def _pod_spec(cluster: LocalCluster, command: str, **spec: Any) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": cluster.toolbox_image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
            }
        ],
        **spec,
    }


def _pod(
    cluster: LocalCluster, name: str, ns: str, node: str, command: str = "exec sleep 3600"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": _pod_spec(cluster, command, nodeSelector={"kubernetes.io/hostname": node}),
    }


def _wait_ready(cluster: LocalCluster, ns: str, *pods: str, timeout: float = 60) -> None:
    result = cluster.kubectl(
        "wait", "-n", ns, "--for=condition=Ready", *(f"pod/{p}" for p in pods),
        f"--timeout={timeout:.0f}s", timeout=timeout + 30,
    )  # fmt: skip
    assert result.returncode == 0, (
        result.stderr + cluster.kubectl("describe", "-n", ns, "pods").stdout
    )


def _exec(cluster: LocalCluster, ns: str, pod: str, script: str) -> str:
    result = cluster.kubectl("exec", "-n", ns, pod, "--", "sh", "-c", script, timeout=60)
    assert result.returncode == 0, f"{script!r} in {pod}: {result.stdout}{result.stderr}"
    return result.stdout


def _in_cidr(ip: str, cidr: str) -> bool:
    return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)


# ----------------------------------------------------------------------------- the nodes


def test_nodes_are_ready_each_at_its_own_address(nodes_cluster: LocalCluster) -> None:
    nodes = {n.name: n for n in nodes_cluster.nodes()}
    assert len(nodes) == 3
    for item in _get(nodes_cluster, "nodes")["items"]:
        name = item["metadata"]["name"]
        conditions = {c["type"]: c["status"] for c in item["status"]["conditions"]}
        assert conditions["Ready"] == "True", (name, conditions)
        addresses = {a["type"]: a["address"] for a in item["status"]["addresses"]}
        assert addresses["InternalIP"] == nodes.pop(name).address
    assert not nodes, f"nodes not registered: {sorted(nodes)}"
    dns = _get(nodes_cluster, "-n", "kube-system", "deployment", "coredns")
    assert dns["status"].get("readyReplicas", 0) >= 1


def test_pods_on_two_nodes_reach_each_other_by_ip_and_by_service_name(
    nodes_cluster: LocalCluster, nodes_namespace: str
) -> None:
    ns = nodes_namespace
    first, second = nodes_cluster.nodes()[:2]
    web = "mkdir -p /tmp/www && echo served by $(hostname) > /tmp/www/index.html"
    web += " && exec httpd -f -p 8080 -h /tmp/www"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    _apply(
        nodes_cluster,
        _pod(nodes_cluster, "web", ns, first.name, web),
        _pod(nodes_cluster, "client", ns, second.name),
        service,
    )
    _wait_ready(nodes_cluster, ns, "web", "client")
    web_ip = _get(nodes_cluster, "-n", ns, "pod", "web")["status"]["podIP"]
    client_ip = _get(nodes_cluster, "-n", ns, "pod", "client")["status"]["podIP"]
    assert first.pod_cidr and _in_cidr(web_ip, first.pod_cidr), web_ip
    assert second.pod_cidr and _in_cidr(client_ip, second.pod_cidr), client_ip

    # Pod to pod across nodes, by IP.
    assert (
        _exec(nodes_cluster, ns, "client", f"timeout 10 wget -qO- http://{web_ip}:8080/")
        == "served by web\n"
    )
    # Through the Service's ClusterIP (kube-proxy), found by its name (CoreDNS). The endpoint
    # may take a moment to appear in kube-proxy's rules.
    name = f"web.{ns}.svc.cluster.local"

    def by_name() -> str:
        result = nodes_cluster.kubectl(
            "exec", "-n", ns, "client", "--", "timeout", "5", "wget", "-qO-", f"http://{name}/"
        )
        return result.stdout if result.returncode == 0 else ""

    assert _eventually(by_name, 20, f"wget http://{name}/ from the client") == "served by web\n"
    cluster_ip = _get(nodes_cluster, "-n", ns, "service", "web")["spec"]["clusterIP"]
    assert cluster_ip in _exec(nodes_cluster, ns, "client", f"nslookup {name}")


@contextlib.contextmanager
def _echo_server() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 that answers each connection with what it read."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.sendall(b"echo " + conn.recv(1024))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(5)
        server.close()


def test_a_pod_reaches_a_service_on_the_hosts_loopback_through_the_gateway(
    nodes_cluster: LocalCluster, nodes_namespace: str
) -> None:
    ns = nodes_namespace
    _apply(nodes_cluster, _pod(nodes_cluster, "client", ns, nodes_cluster.nodes()[-1].name))
    _wait_ready(nodes_cluster, ns, "client")
    with _echo_server() as port:
        address = nodes_cluster.expose_host_port(port)
        assert address == f"{nodes_cluster.gateway}:{port}"
        host, _, _ = address.partition(":")
        token = uuid.uuid4().hex[:8]
        try:
            answer = _exec(nodes_cluster, ns, "client", f"echo {token} | nc -w 5 {host} {port}")
        finally:
            nodes_cluster.unexpose_host_port(port)
    assert answer == f"echo {token}\n"


# ----------------------------------------------------------------------------- node loss


def _ready(cluster: LocalCluster, node: str) -> str:
    item = _get(cluster, "node", node)
    conditions = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
    return str(conditions.get("Ready", ""))


def _node_processes(cluster: LocalCluster, node: str) -> list[int]:
    """Processes of the node: its components (pid files) and everything in its cgroups."""
    pids = []
    for pid_file in (cluster.run_dir / node).glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().split()[0])
            if Path(f"/proc/{pid}").exists():
                pids.append(pid)
    for mount in Path("/sys/fs/cgroup").iterdir():
        top = mount / cluster.cgroup_base.strip("/") / node
        for d, _, _ in os.walk(top):
            with contextlib.suppress(OSError):
                pids += [int(p) for p in (Path(d) / "cgroup.procs").read_text().split()]
    return pids


def test_a_lost_node_goes_not_ready_and_its_statefulset_pod_starts_on_another_node(
    nodes_cluster: LocalCluster, nodes_namespace: str
) -> None:
    ns, victim = nodes_namespace, nodes_cluster.nodes()[-1].name
    prefer_victim = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [victim]}
                        ]
                    },
                }
            ]
        }
    }
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "sts", "namespace": ns},
        "spec": {
            "replicas": 1,
            "serviceName": "sts",
            "selector": {"matchLabels": {"app": "sts"}},
            "template": {
                "metadata": {"labels": {"app": "sts"}},
                # A grace period its lost kubelet can never honour: only a force delete frees
                # the StatefulSet's one identity for a new pod.
                "spec": {
                    **_pod_spec(nodes_cluster, "exec sleep 3600", affinity=prefer_victim),
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
    }
    _apply(nodes_cluster, sts)
    _eventually(lambda: _get(nodes_cluster, "-n", ns, "pod", "sts-0"), 30, "pod sts-0")
    _wait_ready(nodes_cluster, ns, "sts-0")
    first = _get(nodes_cluster, "-n", ns, "pod", "sts-0")
    assert first["spec"]["nodeName"] == victim

    began = time.monotonic()
    nodes_cluster.lose_node(victim)
    lost = time.monotonic() - began
    # The machine is gone: no process of it is left, and its link is cut.
    assert not _node_processes(nodes_cluster, victim)
    argv = nodes_cluster.exec_argv("cluster", ["ip", "-o", "link"])
    links = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert f"veth-{victim}" not in links, links

    _eventually(
        lambda: _ready(nodes_cluster, victim) != "True", NOT_READY_WITHIN, f"{victim} NotReady"
    )
    not_ready = time.monotonic() - began

    def moved() -> bool:
        pod = _get(nodes_cluster, "-n", ns, "pod", "sts-0")
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        return (
            pod.get("metadata", {}).get("uid") != first["metadata"]["uid"]
            and pod["spec"].get("nodeName") not in (None, victim)
            and conditions.get("Ready") == "True"
        )

    _eventually(
        moved,
        RESCHEDULED_WITHIN,
        lambda: (
            "sts-0 Ready on another node:\n"
            + nodes_cluster.kubectl("get", "-n", ns, "pods", "-o", "wide").stdout
        ),
    )
    rescheduled = time.monotonic() - began
    print(
        f"\n{victim}: lost in {lost:.1f}s, NotReady after {not_ready:.1f}s, "
        f"sts-0 Ready on another node after {rescheduled:.1f}s"
    )

    began = time.monotonic()
    nodes_cluster.restore_node(victim)
    assert _ready(nodes_cluster, victim) == "True"
    taints = _get(nodes_cluster, "node", victim)["spec"].get("taints", [])
    assert OUT_OF_SERVICE_TAINT.split("=")[0] not in [t["key"] for t in taints], taints
    # It runs pods again.
    _apply(nodes_cluster, _pod(nodes_cluster, "after", ns, victim))
    _wait_ready(nodes_cluster, ns, "after")
    print(f"{victim} restored and running a pod in {time.monotonic() - began:.1f}s")


# ----------------------------------------------------------------------------- down


def _namespaces_of(cluster: LocalCluster) -> set[str]:
    """The network namespaces of the supervisor (the cluster network) and the node holders."""
    found = set()
    for name in ["supervisor", *(f"{n.name}/holder" for n in cluster.nodes())]:
        with contextlib.suppress(OSError, ValueError):
            pid = int((cluster.run_dir / f"{name}.pid").read_text().split()[0])
            found.add(os.readlink(f"/proc/{pid}/ns/net"))
    return found


def _pids() -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}


def _leftovers(cluster: LocalCluster, namespaces: set[str], before: set[int]) -> list[str]:
    """Whatever of the cluster is still there: processes (by command line, or of ``before``
    in one of its network ``namespaces``: a freed namespace's number may be reused), mounts in
    any mount namespace, cgroups, interfaces of the machine."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if str(cluster.dir) in cmdline:
                left.append(f"process {proc.name}: {cmdline[:120]}")
            elif int(proc.name) in before and os.readlink(proc / "ns" / "net") in namespaces:
                left.append(f"process {proc.name} in the cluster's network: {cmdline[:120]}")
            if str(cluster.dir) in (proc / "mountinfo").read_text():
                left.append(f"a mount of {cluster.dir} seen by process {proc.name}")
    for mount in Path("/sys/fs/cgroup").iterdir():
        if (mount / cluster.cgroup_base.strip("/")).exists():
            left.append(f"cgroup {mount / cluster.cgroup_base.strip('/')}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    for line in links.stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name in ("eop0", "cni0") or name.startswith("veth-node"):
            left.append(f"interface {name} in the machine's network namespace")
    return left


def test_down_leaves_nothing_behind_also_after_the_supervisor_was_killed(
    nodes_cluster: LocalCluster,
) -> None:
    # A pod per node, so that there are containers (and their shims) to clean up.
    ns = f"down-{uuid.uuid4().hex[:6]}"
    nodes_cluster.kubectl("create", "namespace", ns, check=True)
    names = [n.name for n in nodes_cluster.nodes()]
    _apply(nodes_cluster, *(_pod(nodes_cluster, f"p-{n}", ns, n) for n in names))
    _wait_ready(nodes_cluster, ns, *(f"p-{n}" for n in names))
    namespaces = _namespaces_of(nodes_cluster)
    assert len(namespaces) == 1 + len(names), namespaces

    began, before = time.monotonic(), _pids()
    nodes_cluster.down()
    print(f"\ndown in {time.monotonic() - began:.1f}s")
    assert not _leftovers(nodes_cluster, namespaces, before)

    # A crash: the supervisor is SIGKILLed; the containers outlive it; `down` cleans up.
    began = time.monotonic()
    nodes_cluster.up(images=False)
    print(f"warm up in {time.monotonic() - began:.1f}s")
    namespaces = _namespaces_of(nodes_cluster)
    supervisor = nodes_cluster.supervisor_pid()
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    _eventually(lambda: nodes_cluster.supervisor_pid() is None, 10, "the supervisor gone")
    with pytest.raises(ClusterError):
        nodes_cluster.lose_node(names[0])
    before = _pids()
    nodes_cluster.down()
    assert not _leftovers(nodes_cluster, namespaces, before)
