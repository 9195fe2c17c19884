"""Rendering: the objects a pipeline becomes, as `eop render` shows and the operator applies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from eop_operator.api.load import load_pipeline
from eop_operator.render import MissingImage, render_pipeline
from eop_operator.render.naming import SPEC_HASH_ANNOTATION


def _objects(manifest: dict[str, Any], **kwargs: Any) -> dict[str, dict[str, Any]]:
    rendered = render_pipeline(
        load_pipeline(manifest), default_image=kwargs.pop("image", "eop-spark:1"), generation=0
    )
    return {obj["kind"]: obj for obj in rendered.objects}


def _hash(manifest: dict[str, Any]) -> str:
    return render_pipeline(
        load_pipeline(manifest), default_image="eop-spark:1", generation=0
    ).spec_hash


def test_children_are_owned_and_labelled(manifest: dict[str, Any]) -> None:
    objects = _objects(manifest)
    assert set(objects) == {"ConfigMap", "PersistentVolumeClaim", "Service", "StatefulSet"}
    for obj in objects.values():
        owner = obj["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "ExactlyOncePipeline" and owner["uid"] == "uid-1"
        assert obj["metadata"]["labels"]["exactlyonce.io/pipeline"] == "clean"
        assert obj["metadata"]["namespace"] == "ads"


def test_driver_runs_one_non_root_pod_with_config_and_checkpoint(manifest: dict[str, Any]) -> None:
    sts = _objects(manifest)["StatefulSet"]
    assert sts["spec"]["replicas"] == 1
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:3] == ["run", "--config", "/etc/eop/run.json"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["clean-checkpoint"]
    # one 10 s trigger + 60 s transaction timeout + slack
    assert pod["terminationGracePeriodSeconds"] == 100


def test_config_map_holds_the_resolved_run_config(manifest: dict[str, Any]) -> None:
    run = json.loads(_objects(manifest)["ConfigMap"]["data"]["run.json"])
    assert run["pipeline"] == "ads.clean"
    assert run["transactionalIdPrefix"] == "eop.ads.clean"
    assert run["progressGroup"] == "eop.ads.clean"
    assert run["checkpointRoot"] == "/var/lib/eop/checkpoint"


def test_secrets_are_mounted_by_reference_never_copied(manifest: dict[str, Any]) -> None:
    manifest["spec"]["sink"]["kafka"]["secretRef"] = {"name": "sink-sasl"}
    objects = _objects(manifest)
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secrets == ["sink-sasl"]
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    assert run["sinkSecretDir"] == "/etc/eop/secrets/sink"
    assert "sourceSecretDir" not in run


def test_suspend_scales_the_driver_to_zero(manifest: dict[str, Any]) -> None:
    manifest["spec"]["suspend"] = True
    assert _objects(manifest)["StatefulSet"]["spec"]["replicas"] == 0


def test_query_change_and_restart_nonce_change_the_pod_template(manifest: dict[str, Any]) -> None:
    before = _hash(manifest)
    manifest["spec"]["transform"]["sql"] = "SELECT value FROM source"
    after_query = _hash(manifest)
    manifest["spec"]["restartNonce"] = "1"
    after_nonce = _hash(manifest)
    assert len({before, after_query, after_nonce}) == 3
    sts = _objects(manifest)["StatefulSet"]
    assert sts["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == after_nonce


def test_suspend_does_not_change_the_pod_template(manifest: dict[str, Any]) -> None:
    before = _hash(manifest)
    manifest["spec"]["suspend"] = True
    assert _hash(manifest) == before


def test_kubernetes_executors_get_their_own_least_privilege_rbac(manifest: dict[str, Any]) -> None:
    manifest["spec"]["spark"] = {"master": "k8s://https://kubernetes.default.svc"}
    objects = _objects(manifest)
    assert {"ServiceAccount", "Role", "RoleBinding"} <= set(objects)
    rules = objects["Role"]["rules"]
    assert all("secrets" not in r["resources"] and "*" not in r["verbs"] for r in rules)
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "clean-driver"
    assert pod["automountServiceAccountToken"] is True
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    assert run["spark"]["conf"]["spark.kubernetes.namespace"] == "ads"


def test_checkpoint_uri_has_no_claim(manifest: dict[str, Any]) -> None:
    manifest["spec"]["checkpoint"] = {"uri": "s3a://bucket/eop"}
    objects = _objects(manifest)
    assert "PersistentVolumeClaim" not in objects
    run = json.loads(objects["ConfigMap"]["data"]["run.json"])
    assert run["checkpointRoot"] == "s3a://bucket/eop/ads/clean"


def test_missing_image_is_a_clear_error(manifest: dict[str, Any]) -> None:
    with pytest.raises(MissingImage, match=r"spec\.image"):
        _objects(manifest, image=None)
