"""Pod Security ``restricted`` on a pipeline's namespace admits every pod eop renders.

The API server's Pod Security admission judges a pod when it is created; a server-side dry
run of each rendered pod (the driver, an executor, the checkpoint deletion Job's) in a
namespace that enforces ``restricted`` is that judgement, with no kubelet needed.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane
from eop_operator.api.load import load_pipeline
from eop_operator.render import checkpoint_root, render_pipeline
from eop_operator.render.executors import EXECUTOR_TEMPLATE_KEY
from eop_operator.render.storage import render_checkpoint_deletion_job
from tests.integration.test_crd_on_apiserver import VALID

pytestmark = pytest.mark.kube

RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


def _pods(namespace: str) -> dict[str, dict[str, Any]]:
    """The pods eop makes for a pipeline with executors on Kubernetes and its checkpoint in
    object storage, and for one with a local master and a claim, as Pods."""
    with_executors = copy.deepcopy(VALID)
    with_executors["metadata"].update(name="wide", namespace=namespace, uid="u1")
    with_executors["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    with_executors["spec"]["checkpoint"] = {"uri": "s3a://bucket/p", "retention": "Delete"}
    with_executors["spec"]["driver"] = {
        "volumes": [{"name": "ca", "configMap": {"name": "ca"}}],
        "volumeMounts": [{"name": "ca", "mountPath": "/etc/ca"}],
    }
    local = copy.deepcopy(VALID)
    local["metadata"].update(name="local", namespace=namespace, uid="u2")
    pods: dict[str, dict[str, Any]] = {}
    for manifest in (with_executors, local):
        pipeline = load_pipeline(manifest)
        rendered = render_pipeline(pipeline, default_image="localhost/eop-spark:test", generation=0)
        objects = {o["kind"]: o for o in rendered.objects}
        name = pipeline.metadata.name
        pods[f"{name} driver"] = objects["StatefulSet"]["spec"]["template"]
        executor = objects["ConfigMap"]["data"].get(EXECUTOR_TEMPLATE_KEY)
        if executor:
            pods[f"{name} executor"] = yaml.safe_load(executor)
            job = render_checkpoint_deletion_job(pipeline, "i:1", checkpoint_root(pipeline))
            pods[f"{name} checkpoint deletion"] = job["spec"]["template"]
    return {
        what: {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": what.replace(" ", "-"), "labels": pod["metadata"].get("labels")},
            "spec": pod["spec"],
        }
        for what, pod in pods.items()
    }


def test_pipeline_pods_are_admitted_under_pod_security_restricted(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    cp.kubectl("label", "namespace", ns, RESTRICTED, check=True)
    cp.kubectl("create", "serviceaccount", "wide-driver", "-n", ns, check=True)
    pods = _pods(ns)
    assert len(pods) == 4
    for what, pod in pods.items():
        code, message = cp.dry_run_create(f"/api/v1/namespaces/{ns}/pods", pod)
        assert code == 201, f"{what}: {message}"
    # The namespace enforces it: a pod that asks for more is refused, as a check of the check.
    privileged = copy.deepcopy(pods["local driver"])
    privileged["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    code, message = cp.dry_run_create(f"/api/v1/namespaces/{ns}/pods", privileged)
    assert code == 403 and 'violates PodSecurity "restricted' in message
