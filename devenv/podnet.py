"""The network of the multi-node local cluster: namespaces, a bridge, veths and routes.

Everything here happens inside network namespaces made for the cluster; the machine's own
network namespace never gets an interface, an address, a route or a firewall rule, and no
host sysctl changes (``ip_forward`` is set per namespace). Nothing is named in ``/run/netns``
either: a namespace lives as long as a process in it (the supervisor for the cluster network,
a node's holder process for the node), so killing the processes removes the network.

Layout for nodes ``node1``..``nodeN`` (:func:`node_layout`)::

    cluster network namespace (the supervisor's own)        node i namespace (its holder's)
      bridge eop0 10.88.0.1/24  (GATEWAY)  <-- veth-nodei -->  eth0 10.88.0.(10+i)/24
      ip_forward=1                                             default via 10.88.0.1
      10.244.i.0/24 via 10.88.0.(10+i)                         10.244.j.0/24 via 10.88.0.(10+j)
      control plane, forwarder, provisioner                   ip_forward=1, bridge cni0
                                                               10.244.i.1/24 (CNI), pods

Pod-to-pod traffic between nodes goes straight over the bridge (routes to each node's pod CIDR
via its address, as flannel's host-gw does); the cluster network namespace routes the replies
of the control plane and of the forwarder to pods. Services (10.0.0.0/24, the apiserver's
default range) are kube-proxy's iptables rules in each node's namespace.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import subprocess
from dataclasses import dataclass

__all__ = [
    "BRIDGE",
    "CLUSTER_CIDR",
    "DNS_SERVICE_IP",
    "GATEWAY",
    "MAX_NODES",
    "NODE_SUBNET",
    "NetnsError",
    "NodeAddress",
    "add_node_link",
    "cut_node_link",
    "node_layout",
    "setns",
    "setup_cluster_network",
    "unshare_network",
]

#: The nodes' network: the cluster network namespace's bridge holds the gateway address.
NODE_SUBNET = ipaddress.ip_network("10.88.0.0/24")
#: Where nodes and pods reach the control plane and the host's forwarded services.
GATEWAY = "10.88.0.1"
#: The pods' addresses: node i gets ``10.244.i.0/24``.
CLUSTER_CIDR = "10.244.0.0/16"
#: The ``kube-dns`` Service's ClusterIP (in the apiserver's default Service range).
DNS_SERVICE_IP = "10.0.0.10"
#: The bridge of the cluster network namespace.
BRIDGE = "eop0"
#: Node addresses are 10.88.0.11 and up; pod CIDRs 10.244.1.0/24 and up.
MAX_NODES = 50

_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """A namespace operation or an ``ip`` command failed."""


@dataclass(frozen=True)
class NodeAddress:
    """One node's place on the network."""

    name: str
    index: int
    address: str
    pod_cidr: str
    pod_gateway: str

    @property
    def veth(self) -> str:
        """The node's veth end on the cluster bridge (the other end is the node's ``eth0``)."""
        return f"veth-{self.name}"


def node_layout(count: int) -> list[NodeAddress]:
    """Nodes ``node1``..``node<count>``: addresses 10.88.0.11.., pod CIDRs 10.244.1.0/24.."""
    if not 1 <= count <= MAX_NODES:
        raise NetnsError(f"nodes: 1..{MAX_NODES}, not {count}")
    base = int(NODE_SUBNET.network_address)
    cluster = ipaddress.ip_network(CLUSTER_CIDR)
    nodes = []
    for i in range(1, count + 1):
        pod_net = ipaddress.ip_network(f"{cluster.network_address + (i << 8)}/24")
        nodes.append(
            NodeAddress(
                name=f"node{i}",
                index=i,
                address=str(ipaddress.ip_address(base + 10 + i)),
                pod_cidr=str(pod_net),
                pod_gateway=str(pod_net.network_address + 1),
            )
        )
    return nodes


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"{name}: {os.strerror(err)}")


def unshare_network() -> None:
    """Move the calling thread (the supervisor's only one) into a new network namespace.

    Children started afterwards inherit it. Open ``/proc/self/ns/net`` first to keep a way
    back to the old one (:func:`setns`).
    """
    _libc_call("unshare", _CLONE_NEWNET)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace of the open nsfs file ``fd``."""
    _libc_call("setns", fd, _CLONE_NEWNET)


def _ip_batch(commands: list[str], pid: int | None = None) -> None:
    """Run ``ip -batch`` commands in our network namespace, or in that of process ``pid``."""
    argv = ["ip", "-batch", "-"]
    if pid is not None:
        argv = ["nsenter", f"--target={pid}", "--net", "--", *argv]
    result = subprocess.run(
        argv, input="\n".join(commands) + "\n", capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise NetnsError(f"ip failed in {pid or 'our'} namespace: {result.stderr.strip()}")


def _forwarding(pid: int | None = None) -> None:
    """Turn on IPv4 forwarding in our network namespace or in that of process ``pid``.

    ``/proc/sys/net`` shows the namespace of the process that opens it.
    """
    if pid is None:
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1\n")
        return
    subprocess.run(
        ["nsenter", f"--target={pid}", "--net", "--", "sh", "-c",
         "echo 1 > /proc/sys/net/ipv4/ip_forward"],
        check=True,
    )  # fmt: skip


def setup_cluster_network(nodes: list[NodeAddress]) -> None:
    """In our (new) network namespace: loopback, the bridge with the gateway address, routes to
    every node's pod CIDR, forwarding on."""
    prefix = NODE_SUBNET.prefixlen
    commands = [
        "link set lo up",
        f"link add {BRIDGE} type bridge",
        f"addr add {GATEWAY}/{prefix} dev {BRIDGE}",
        f"link set {BRIDGE} up",
    ]
    commands += [f"route add {n.pod_cidr} via {n.address}" for n in nodes]
    _ip_batch(commands)
    _forwarding()


def add_node_link(node: NodeAddress, holder_pid: int, nodes: list[NodeAddress]) -> None:
    """Plug the node whose namespace ``holder_pid`` holds into the bridge: a veth pair
    (``veth-<node>`` on the bridge, ``eth0`` in the node), its address, a default route via the
    gateway, routes to the other nodes' pod CIDRs, forwarding on."""
    prefix = NODE_SUBNET.prefixlen
    _ip_batch(
        [
            f"link add {node.veth} type veth peer name eth0 netns {holder_pid}",
            f"link set {node.veth} master {BRIDGE}",
            f"link set {node.veth} up",
        ]
    )
    commands = [
        "link set lo up",
        f"addr add {node.address}/{prefix} dev eth0",
        "link set eth0 up",
        f"route add default via {GATEWAY}",
    ]
    commands += [f"route add {n.pod_cidr} via {n.address}" for n in nodes if n != node]
    _ip_batch(commands, pid=holder_pid)
    _forwarding(holder_pid)


def cut_node_link(node: NodeAddress) -> None:
    """Delete the node's veth pair (both ends): the node is off the network. Idempotent."""
    result = subprocess.run(
        ["ip", "link", "del", node.veth], capture_output=True, text=True, check=False
    )
    if result.returncode != 0 and "Cannot find device" not in result.stderr:
        raise NetnsError(f"ip link del {node.veth}: {result.stderr.strip()}")
