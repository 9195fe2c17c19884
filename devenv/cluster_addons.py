"""What the multi-node local cluster runs beside the kubelets: cluster DNS and kube-proxy.

* :func:`coredns_manifests`: CoreDNS as a Deployment in ``kube-system`` behind the ``kube-dns``
  Service (ClusterIP :data:`devenv.podnet.DNS_SERVICE_IP`), with its RBAC and Corefile; the
  image is :func:`devenv.cluster_images.build_coredns_image`.
* :func:`kube_proxy_config`: the KubeProxyConfiguration of one node's kube-proxy (iptables mode,
  inside the node's network namespace, touching no machine-wide sysctl).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devenv.podnet import CLUSTER_CIDR, DNS_SERVICE_IP

__all__ = ["CLUSTER_DOMAIN", "COREDNS_PORT", "coredns_manifests", "kube_proxy_config"]

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
