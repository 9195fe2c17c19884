"""The API server itself rejects bad manifests, naming the field, before the operator sees them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kube import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "exactlyoncepipelines.exactlyonce.io.yaml"

pytestmark = pytest.mark.kube

VALID: dict[str, Any] = {
    "apiVersion": "exactlyonce.io/v1alpha1",
    "kind": "ExactlyOncePipeline",
    "metadata": {"name": "p"},
    "spec": {
        "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
        "transform": {"sql": "SELECT value FROM source"},
        "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
    },
}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value

    return mutate


_DELETE = object()

#: (case id, mutation, text the rejection must contain: the field and the reason)
MALFORMED = [
    ("no-sink", _set("spec.sink", _DELETE), "spec.sink: Required value"),
    (
        "sql-and-python",
        _set("spec.transform.python", {"module": "m", "function": "f"}),
        "exactly one of sql or python must be set",
    ),
    (
        "no-topics",
        _set("spec.source.kafka.topics", _DELETE),
        "exactly one of topics or topicPattern must be set",
    ),
    (
        "commit-mode",
        _set("spec.sink.kafka.commitMode", "fast"),
        'spec.sink.kafka.commitMode: Unsupported value: "fast"',
    ),
    (
        "timeout-format",
        _set("spec.sink.kafka.transactionTimeout", "1 minute"),
        "spec.sink.kafka.transactionTimeout: Invalid value",
    ),
    (
        "max-offsets",
        _set("spec.source.kafka.maxOffsetsPerTrigger", 0),
        "spec.source.kafka.maxOffsetsPerTrigger: Invalid value",
    ),
    (
        "starting-offsets",
        _set("spec.source.kafka.startingOffsets", "yesterday"),
        "startingOffsets must be earliest, latest or a JSON object",
    ),
    (
        "trigger-both",
        _set("spec.trigger", {"processingTime": "5s", "availableNow": True}),
        "spec.trigger: Invalid value",
    ),
    (
        "volume-and-uri",
        _set("spec.checkpoint", {"uri": "s3a://b/p", "volume": {"size": "1Gi"}}),
        "set at most one of volume or uri",
    ),
    (
        "uri-delete",
        _set("spec.checkpoint", {"uri": "s3a://b/p", "retention": "Delete"}),
        "retention Delete needs checkpoint.volume",
    ),
    ("master", _set("spec.spark.master", "yarn"), "spec.spark.master: Invalid value"),
    (
        "driver-cores",
        _set("spec.spark.driver", {"cores": 0}),
        "spec.spark.driver.cores: Invalid value",
    ),
    (
        "pull-policy",
        _set("spec.imagePullPolicy", "Sometimes"),
        'spec.imagePullPolicy: Unsupported value: "Sometimes"',
    ),
    (
        "volume-size",
        _set("spec.checkpoint", {"volume": {"size": "lots"}}),
        "spec.checkpoint.volume.size: Invalid value",
    ),
    ("unknown-field", _set("spec.surprise", 1), 'unknown field "spec.surprise"'),
    ("long-name", _set("metadata.name", "n" * 43), "metadata.name must be at most 42 characters"),
    (
        "retention",
        _set("spec.checkpoint", {"retention": "Forever"}),
        'spec.checkpoint.retention: Unsupported value: "Forever"',
    ),
]


@pytest.fixture(scope="module")
def crd_installed(control_plane: ControlPlane) -> ControlPlane:
    control_plane.kubectl("apply", "--server-side", "-f", str(CRD), check=True)
    control_plane.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/exactlyoncepipelines.exactlyonce.io",
        "--timeout=60s",
        check=True,
    )
    return control_plane


def _apply(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> tuple[int, str]:
    result = cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    return result.returncode, result.stdout + result.stderr


def test_valid_manifest_is_accepted_with_defaults(
    crd_installed: ControlPlane, kube_namespace: str
) -> None:
    code, output = _apply(crd_installed, kube_namespace, VALID)
    assert code == 0, output
    stored = yaml.safe_load(
        crd_installed.kubectl(
            "get", "eop", "p", "-n", kube_namespace, "-o", "yaml", check=True
        ).stdout
    )
    assert stored["spec"]["sink"]["kafka"]["commitMode"] == "auto"
    assert stored["spec"]["source"]["kafka"]["startingOffsets"] == "earliest"


@pytest.mark.parametrize(("case", "mutate", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_manifest_is_rejected_naming_the_field(
    crd_installed: ControlPlane,
    kube_namespace: str,
    case: str,
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    obj = copy.deepcopy(VALID)
    mutate(obj)
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code != 0, f"{case} was accepted"
    assert expected in output


def test_transactional_id_prefix_is_immutable(
    crd_installed: ControlPlane, kube_namespace: str
) -> None:
    obj = copy.deepcopy(VALID)
    obj["spec"]["transactions"] = {"idPrefix": "team-a.clean"}
    assert _apply(crd_installed, kube_namespace, obj)[0] == 0
    obj["spec"]["transactions"] = {"idPrefix": "team-b.clean"}
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code != 0
    assert "spec.transactions.idPrefix: Invalid value" in output
    assert "transactions.idPrefix is immutable once set" in output
    del obj["spec"]["transactions"]
    code, output = _apply(crd_installed, kube_namespace, obj)
    assert code != 0 and "immutable" in output
