"""ServiceAccount and RoleBinding of a driver that runs executors on Kubernetes.

The driver's permissions live in a role the chart creates beforehand (``<release>-driver``:
a Role in each watched namespace, or one ClusterRole bound per namespace); the operator only
binds a driver's ServiceAccount to it. So the operator needs neither the pod rights it would
otherwise have to hold to grant them, nor the right to create roles: RBAC lets it create the
binding because it may ``bind`` that one role, by name (docs/security.md).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.render.naming import child_metadata, driver_name

#: What Spark's driver needs to manage its executors: pods, their services and the
#: executors' config map. No volume claims (eop refuses Spark's on-demand claims,
#: ``spark.kubernetes.executor.volumes.*``), nothing cluster-wide, no secrets. Spark deletes
#: its executors and their config map by label (``deletecollection``); the chart's
#: ValidatingAdmissionPolicy (templates/driver-policy.yaml) lets a driver create only pods
#: with its own pipeline's executor labels, and delete only those and what Spark made.
#: The chart's drivers' role (``eop.driverRules`` in charts/eop) holds exactly these.
DRIVER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods", "services", "configmaps"],
        "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"],
    }
]

ROLE_KINDS = ("Role", "ClusterRole")


@dataclass(frozen=True)
class DriverRole:
    """The pre-made role drivers are bound to: a namespace's Role or a ClusterRole."""

    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> DriverRole:
        """``Role/NAME`` or ``ClusterRole/NAME`` (the ``--driver-role`` option)."""
        kind, _, name = text.partition("/")
        if kind not in ROLE_KINDS or not name:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected Role/NAME or ClusterRole/NAME, e.g. Role/eop-driver"
            )
        return cls(kind, name)

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


#: What the chart creates for a release named ``eop`` in namespaced mode.
DEFAULT_DRIVER_ROLE = DriverRole("Role", "eop-driver")


def driver_service_account_name(pipeline: ExactlyOncePipeline) -> str | None:
    """The ServiceAccount the driver runs as, or None for the namespace default."""
    if pipeline.spec.service_account_name:
        return pipeline.spec.service_account_name
    if pipeline.spec.spark.on_kubernetes:
        return driver_name(pipeline)
    return None


def render_driver_rbac(
    pipeline: ExactlyOncePipeline, role: DriverRole = DEFAULT_DRIVER_ROLE
) -> list[dict[str, Any]]:
    """ServiceAccount and its RoleBinding to ``role``, only when the operator must create them."""
    if not pipeline.spec.spark.on_kubernetes or pipeline.spec.service_account_name:
        return []
    name = driver_name(pipeline)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": child_metadata(pipeline, name, "driver"),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            # Named after the role: a binding's roleRef is immutable, so a driver moved to
            # another role (or from the per-pipeline Role of older versions) gets a new one.
            "metadata": child_metadata(
                pipeline, f"{name}-{role.kind.lower()}-{role.name}", "driver"
            ),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": role.kind,
                "name": role.name,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": name, "namespace": pipeline.metadata.namespace}
            ],
        },
    ]
