"""The CRD is generated from the models, structural, and committed without drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eop_operator.api.crd import crd_yaml, render_crd

ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = "exactlyoncepipelines.exactlyonce.io.yaml"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.get("properties", {}).items():
            found += _walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            found += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


def _schema() -> dict[str, Any]:
    version = render_crd()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_committed_crds_match_the_models() -> None:
    generated = crd_yaml()
    for path in (ROOT / "crds" / CRD_FILE, ROOT / "charts" / "eop" / "crds" / CRD_FILE):
        assert path.read_text() == generated, f"{path} drifted: run `make crds`"


def test_schema_is_structural() -> None:
    for path, node in _walk(_schema()):
        assert not {"$ref", "anyOf", "allOf", "oneOf", "$defs", "title"} & node.keys(), path
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path


def test_schema_carries_cel_rules_for_choices_and_immutability() -> None:
    rules = {
        rule["message"]
        for _, node in _walk(_schema())
        for rule in node.get("x-kubernetes-validations", [])
    }
    assert "exactly one of sql or python must be set" in rules
    assert "exactly one of topics or topicPattern must be set" in rules
    assert "transactions.idPrefix is immutable once set" in rules
    assert "set at most one of volume or uri" in rules


def test_crd_has_status_subresource_short_name_and_columns() -> None:
    crd = yaml.safe_load(crd_yaml())
    version = crd["spec"]["versions"][0]
    # kubectl scale, a HorizontalPodAutoscaler or KEDA set the executor count.
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.spark.executor.instances",
            "statusReplicasPath": ".status.executors",
            "labelSelectorPath": ".status.executorSelector",
        },
    }
    assert crd["spec"]["names"]["shortNames"] == ["eop"]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:3] == ["Phase", "Ready", "Lag"]
    assert "Checkpoint-Gen" in columns and "Age" in columns


def test_api_reference_matches_the_models() -> None:
    from eop_operator.api.reference import api_reference

    committed = (ROOT / "docs" / "api.md").read_text()
    assert committed == api_reference() + "\n", "docs/api.md drifted: run `make crds`"
    assert "`spec.transactions.idPrefix`" in committed


def test_every_served_version_has_the_same_schema_and_one_is_stored() -> None:
    """No schema difference between versions: the API server converts without a webhook."""
    crd = yaml.safe_load(crd_yaml())
    versions = crd["spec"]["versions"]
    assert [v["name"] for v in versions] == ["v1alpha1", "v1beta1"]
    assert all(v["served"] for v in versions)
    assert [v["name"] for v in versions if v["storage"]] == ["v1alpha1"]
    assert crd["spec"]["conversion"] == {"strategy": "None"}
    first, *others = [{k: v for k, v in version.items() if k != "name"} for version in versions]
    stored = {k: v for k, v in first.items() if k != "storage"}
    for other in others:
        assert {k: v for k, v in other.items() if k != "storage"} == stored
