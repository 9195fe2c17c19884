"""ServiceAccount, Role and RoleBinding of a driver that runs executors on Kubernetes."""

from __future__ import annotations

from typing import Any

from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.render.naming import child_metadata, driver_name

#: What Spark's driver needs to manage its executors: pods, their services and
#: config maps, and on-demand volume claims.  Nothing cluster-wide, no secrets.
DRIVER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
        "verbs": ["create", "get", "list", "watch", "delete", "deletecollection"],
    }
]


def driver_service_account_name(pipeline: ExactlyOncePipeline) -> str | None:
    """The ServiceAccount the driver runs as, or None for the namespace default."""
    if pipeline.spec.service_account_name:
        return pipeline.spec.service_account_name
    if pipeline.spec.spark.on_kubernetes:
        return driver_name(pipeline)
    return None


def render_driver_rbac(pipeline: ExactlyOncePipeline) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, only when the operator must create them."""
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
            "kind": "Role",
            "metadata": child_metadata(pipeline, name, "driver"),
            "rules": DRIVER_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": child_metadata(pipeline, name, "driver"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {"kind": "ServiceAccount", "name": name, "namespace": pipeline.metadata.namespace}
            ],
        },
    ]
