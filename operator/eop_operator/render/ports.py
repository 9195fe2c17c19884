"""The driver's network ports: fixed on the pod network, one host port per pipeline otherwise.

On the pod network (the default) every driver has its own IP, so every driver uses the same
conventional ports: Spark UI 4040, metrics 9090 and, with executors on Kubernetes, driver RPC
7078 and block manager 7079.

With ``spec.driver.hostNetwork`` the pod shares the node's network namespace: a declared
container port becomes a host port (the API server defaults ``hostPort`` to it), and two
drivers on one node with the same ports either cannot be scheduled together or clash at
bind time. So a host-network driver

* lets Spark pick free ephemeral ports for the UI, the driver RPC endpoint and the block
  manager (``0``): nothing outside the driver needs them at a fixed number (executors learn the
  driver's actual ports when they register; the UI port is in the driver log), and they are not
  declared, so they reserve nothing on the node;
* serves ``/metrics`` on one host port of its own, the only port scrapers must know. It is
  taken from a range the operator is configured with (``eop operator --host-ports``): first
  the port derived from the pipeline's identity, then the next free one, skipping the ports of
  the other host-network drivers the operator knows; a driver keeps the port it has as long as
  no other pipeline holds it, so restarts and upgrades never move it. The port is declared with
  ``hostPort``, so the scheduler itself never puts two pods holding it on one node, even in a
  race the operator cannot see (two pipelines created at the same instant).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Conventional ports of a driver on the pod network.
UI_PORT = 4040
METRICS_PORT = 9090
DRIVER_RPC_PORT = 7078
BLOCK_MANAGER_PORT = 7079
#: Spark's "any free port".
EPHEMERAL = 0


class HostPortsExhausted(ValueError):
    """Every port of the host-port range is held by another pipeline."""


@dataclass(frozen=True)
class HostPortRange:
    """Inclusive range of node ports host-network drivers may serve metrics on.

    The default sits below Linux's ephemeral range (32768-60999, where Spark's own ports and
    client sockets land) and below Kubernetes' NodePort range (30000-32767).
    """

    first: int = 19000
    last: int = 19999

    def __post_init__(self) -> None:
        if not 1 <= self.first <= self.last <= 65535:
            raise ValueError(f"invalid host port range {self.first}-{self.last}")

    @classmethod
    def parse(cls, text: str) -> HostPortRange:
        """``FIRST-LAST``, e.g. ``19000-19999``."""
        first, sep, last = text.partition("-")
        if not sep or not first.strip().isdigit() or not last.strip().isdigit():
            raise ValueError(f"host port range {text!r} is not FIRST-LAST")
        return cls(int(first), int(last))

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def preferred_host_port(pipeline_id: str, ports: HostPortRange) -> int:
    """The port derived from ``<namespace>.<name>``: stable across operators and restarts."""
    digest = int.from_bytes(hashlib.sha256(pipeline_id.encode()).digest()[:8], "big")
    return ports.first + digest % len(ports)


def choose_host_port(
    pipeline_id: str,
    ports: HostPortRange,
    *,
    taken: Collection[int] = (),
    current: int | None = None,
) -> int:
    """The metrics host port of a pipeline, given the ports other pipelines hold.

    ``current`` (the port its driver already has) is kept while it is in range and free;
    otherwise the preferred port, then the next ones (wrapping around), first free wins.
    """
    if current is not None and current in ports and current not in taken:
        return current
    start = preferred_host_port(pipeline_id, ports) - ports.first
    for step in range(len(ports)):
        port = ports.first + (start + step) % len(ports)
        if port not in taken:
            return port
    raise HostPortsExhausted(
        f"every host port in {ports} is held by another host-network pipeline; "
        "widen eop operator --host-ports"
    )


@dataclass(frozen=True)
class DriverPorts:
    """The ports one driver listens on; ``EPHEMERAL`` ones are picked by Spark and undeclared."""

    ui: int
    metrics: int
    driver_rpc: int
    block_manager: int
    host_network: bool

    def declared(self, on_kubernetes: bool) -> list[tuple[str, int]]:
        """(name, port) of the container ports to declare (and publish on the Service)."""
        # Not the Spark UI: the runner turns it off (eop_spark.runtime.session), and one a
        # spec turns on is for `kubectl port-forward`, never published on the Service.
        named = [("metrics", self.metrics)]
        if on_kubernetes:
            named += [("driver-rpc", self.driver_rpc), ("blockmanager", self.block_manager)]
        return [(name, port) for name, port in named if port != EPHEMERAL]


def driver_ports(*, host_network: bool, metrics_host_port: int) -> DriverPorts:
    """Conventional fixed ports on the pod network; ephemeral ones plus one metrics host port
    on the host network (see the module docstring)."""
    if not host_network:
        return DriverPorts(UI_PORT, METRICS_PORT, DRIVER_RPC_PORT, BLOCK_MANAGER_PORT, False)
    return DriverPorts(EPHEMERAL, metrics_host_port, EPHEMERAL, EPHEMERAL, True)


def metrics_host_port_of(pod_spec: Mapping[str, Any]) -> int | None:
    """The metrics host port a rendered driver pod spec holds, or None off the host network."""
    if not pod_spec.get("hostNetwork"):
        return None
    for container in pod_spec.get("containers", []):
        for port in container.get("ports", []):
            if port.get("name") == "metrics":
                return int(port.get("hostPort") or port["containerPort"])
    return None


def assign_metrics_host_port(
    pipeline_id: str, ports: HostPortRange, held: Mapping[str, Iterable[int]]
) -> int:
    """The metrics host port of ``pipeline_id``, given what every known driver holds.

    ``held``: pipeline id -> the host ports its driver StatefulSet holds (the operator's index
    of driver StatefulSets). The pipeline keeps its own port unless another one holds it too.
    """
    own = list(held.get(pipeline_id, ()))
    taken = {port for other, ports_ in held.items() if other != pipeline_id for port in ports_}
    return choose_host_port(pipeline_id, ports, taken=taken, current=own[0] if own else None)
