"""What every handler of one operator run shares: its options and its one door to the API.

The CLI builds the :class:`OperatorOptions` from its flags and a
:class:`Context` from them before kopf starts; kopf's memo carries it to
every handler (``controller.registration``).  Nothing here is a module-level
global: two operators in one process would not share anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import kopf

from eop_operator.controller.restart_slots import RestartSlots
from eop_operator.controller.stall_reports import StallReports
from eop_operator.kube.apply import WarningEvents
from eop_operator.kube.client import REQUEST_TIMEOUT_S, KubeClient
from eop_operator.kube.observed import OwnWrites
from eop_operator.kube.status import StatusWriter
from eop_operator.render.pod_policy import PodPolicy
from eop_operator.render.ports import HostPortRange
from eop_operator.render.rbac import DEFAULT_DRIVER_ROLE, DriverRole


@dataclass(frozen=True, kw_only=True)
class OperatorOptions:
    """Settings given on the ``eop operator`` command line."""

    default_image: str | None = None
    #: Where host-network drivers get their metrics port (``--host-ports``).
    host_ports: HostPortRange = field(default_factory=HostPortRange)
    #: The pre-made role drivers with executors on Kubernetes are bound to (``--driver-role``).
    driver_role: DriverRole = DEFAULT_DRIVER_ROLE
    #: Node access pipelines may ask for (``--allow-host-network``, ``--allow-host-path-volumes``).
    pod_policy: PodPolicy = field(default_factory=PodPolicy)
    #: Drivers restarting at once because this operator renders their spec differently
    #: (``--operator-upgrade-parallelism``).
    operator_upgrade_parallelism: int = 1
    #: Seconds one request to the API server may take (``--api-timeout``).
    api_timeout: float = REQUEST_TIMEOUT_S
    #: The operator's own Role and RoleBinding in each served namespace (``--rbac-name``,
    #: namespaced mode): kept while pipelines remain there (``controller.rbac_guard``).
    rbac_name: str | None = None


@dataclass(frozen=True)
class Context:
    """The options, the API client and what the operator remembers of its own writes."""

    options: OperatorOptions
    client: KubeClient
    #: The answers to the operator's writes, until the watches deliver them.
    own_writes: OwnWrites
    #: The one writer of every pipeline's status.
    status: StatusWriter
    #: The namespaces' Warning events, listed for the conditions' causes.
    warnings: WarningEvents
    #: The operator-upgrade restarts under way (``options.operator_upgrade_parallelism``).
    slots: RestartSlots
    #: The stalls the health monitor found, for the lifecycle to act on.
    stalls: StallReports

    @classmethod
    def open(cls, options: OperatorOptions, login: Callable[[], kopf.ConnectionInfo]) -> Context:
        """A context whose client logs in with ``login`` at its first request."""
        return cls.of(options, KubeClient(login, timeout=options.api_timeout))

    @classmethod
    def of(cls, options: OperatorOptions, client: KubeClient) -> Context:
        """A context that sends every request through ``client``."""
        own_writes = OwnWrites()
        return cls(
            options=options,
            client=client,
            own_writes=own_writes,
            status=StatusWriter(client, own_writes),
            warnings=WarningEvents(),
            slots=RestartSlots(options.operator_upgrade_parallelism),
            stalls=StallReports(),
        )
