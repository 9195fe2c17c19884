"""What each part of the local cluster is told: pure builders of configs and manifests.

* :class:`ClusterNode`: a node's name, address and the places of its files;
* :func:`containerd_config`, :func:`kubelet_config`: a node's containerd and kubelet;
* :func:`pod_network_conflist`, :func:`kube_proxy_config`: a pod-network node's CNI network
  and kube-proxy (iptables mode, inside the node's network namespace, touching no
  machine-wide sysctl);
* :func:`coredns_manifests`: CoreDNS as a Deployment in ``kube-system`` behind the ``kube-dns``
  Service (ClusterIP :data:`devenv.podnet.DNS_SERVICE_IP`), with its RBAC and Corefile; the
  image is :func:`devenv.cluster_images.build_coredns_image`.

Why each setting is what it is: the comments in the generated files and docs/local-cluster.md.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.podnet import CLUSTER_CIDR, DNS_SERVICE_IP

__all__ = [
    "CGROUP_ROOT",
    "CLUSTER_DOMAIN",
    "COREDNS_PORT",
    "NODE_LEASE_SECONDS",
    "NODE_MONITOR_GRACE_SECONDS",
    "NODE_NAME",
    "OUT_OF_SERVICE_TAINT",
    "TOLERATION_SECONDS",
    "ClusterNode",
    "containerd_config",
    "coredns_manifests",
    "kube_proxy_config",
    "kubelet_config",
    "pod_network_conflist",
]

#: The single node's name. The kubelet refuses a loopback ``--node-ip`` ("nodeIP can't be
#: loopback address"), but when ``--hostname-override`` is an IP it takes that as the node's
#: InternalIP as is. So the node is named after its address: the apiserver then reaches the
#: kubelet (logs, exec) at 127.0.0.1, and host-network pods get podIP/hostIP 127.0.0.1, which
#: is where the kubelet's probes go. Any other name would make the kubelet fall back to the
#: machine's non-loopback address.
NODE_NAME = "127.0.0.1"

#: Parent cgroup (in every cgroup v1 hierarchy) of everything the kubelet of the single-node
#: cluster in its default dir runs; a cluster in another dir uses ``/eop-<hash of its dir>``.
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

_CNI_BIN_DIR = Path("/usr/lib/cni")


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


def containerd_config(node: ClusterNode, snapshotter: str, sandbox_image: str) -> str:
    """The node's containerd config (TOML), commented."""
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


def kubelet_config(
    node: ClusterNode, *, pki: Path, port: int, healthz_port: int, resolv_conf: Path
) -> str:
    """The node's KubeletConfiguration (YAML), commented; ``pki``: the control plane's
    certificates dir (its CA, the node's serving certificate); ``resolv_conf``: the resolver of
    a pod-network node's pods with ``dnsPolicy: Default``."""
    serving = "kubelet-serving" if not node.pod_network else f"kubelet-serving-{node.name}"
    if node.pod_network:
        dns = f"""\
# Cluster DNS: CoreDNS behind the kube-dns Service. The nodes' own resolver has no upstream
# (the cluster network has no way out), so names outside the cluster fail at once.
clusterDNS: [{DNS_SERVICE_IP}]
resolvConf: {resolv_conf}
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


def pod_network_conflist(node: ClusterNode) -> dict[str, Any]:
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


#: CoreDNS listens here inside its pod (non-root, no capability to bind 53); the ``kube-dns``
#: Service maps port 53 to it.
COREDNS_PORT = 1053
CLUSTER_DOMAIN = "cluster.local"

_NS = "kube-system"
_LABELS = {"k8s-app": "kube-dns"}

# No `forward`: the cluster network has no way out, so names outside the cluster are refused
# at once instead of timing out. TTLs short: a dev cluster's Services come and go.
_COREFILE = f"""\
.:{COREDNS_PORT} {{
    errors
    health {{
        lameduck 2s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    reload
    loadbalance
}}
"""


def coredns_manifests(image: str, replicas: int) -> list[dict[str, Any]]:
    """CoreDNS's ServiceAccount, ClusterRole(+Binding), ConfigMap, Deployment and Service."""
    meta = {"name": "coredns", "namespace": _NS}
    container = {
        "name": "coredns",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": COREDNS_PORT, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": COREDNS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 65532,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": 8080},
            "periodSeconds": 10,
            "failureThreshold": 5,
        },
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": _NS}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "data": {"Corefile": _COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "labels": _LABELS},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": _LABELS},
                "template": {
                    "metadata": {"labels": _LABELS},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        # Its own resolver is the node's (which has no upstream either).
                        "dnsPolicy": "Default",
                        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                        # One per node where possible: losing a node leaves DNS answering.
                        "affinity": {
                            "podAntiAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 100,
                                        "podAffinityTerm": {
                                            "labelSelector": {"matchLabels": _LABELS},
                                            "topologyKey": "kubernetes.io/hostname",
                                        },
                                    }
                                ]
                            }
                        },
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": _NS, "labels": _LABELS},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": _LABELS,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": COREDNS_PORT},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": COREDNS_PORT},
                ],
            },
        },
    ]


def kube_proxy_config(node_name: str, node_address: str, kubeconfig: Path) -> str:
    """One node's KubeProxyConfiguration (YAML), commented."""
    return f"""\
# Written by devenv/cluster.py for the multi-node local cluster; see docs/local-cluster.md.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
# The Node it serves (its InternalIP is the node's address).
hostnameOverride: {node_name}
# Services as iptables rules in the node's own network namespace (Debian's iptables, nft
# backend). Traffic to a Service from a pod of the same node crosses the CNI bridge; the
# kernel's br_netfilter (per namespace, on by default) lets the rules see it.
mode: iptables
iptables:
  masqueradeAll: false
  # No NodePorts on 127.0.0.1: that would need route_localnet.
  localhostNodePorts: false
  syncPeriod: 30s
  minSyncPeriod: 1s
# Pods are 10.244.0.0/16; traffic from elsewhere to a Service is masqueraded.
clusterCIDR: {CLUSTER_CIDR}
detectLocalMode: ClusterCIDR
nodePortAddresses: ["primary"]
healthzBindAddress: {node_address}:10256
metricsBindAddress: 127.0.0.1:10249
# The conntrack table size and timeouts are machine-wide (or need CAP_SYS_RESOURCE): 0 means
# "leave them as they are".
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
# No CAP_SYS_RESOURCE here: it may not lower its oom_score_adj (default -999).
oomScoreAdj: 0
"""
