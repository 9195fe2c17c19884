"""What only the operator can refuse, on a real API server with the chart's RBAC.

A pipeline whose Kafka identity another pipeline holds gets nothing until that one is
gone; a pipeline whose spec no longer validates still keeps its retained checkpoint.
No kubelet runs at this tier: drivers stay Pending, which is all these tests need.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devenv.kafka import KafkaBroker
from devenv.kube import ControlPlane
from tests.integration.operators import OperatorProcess, install_chart, wait_for

pytestmark = pytest.mark.kube


def _get(cp: ControlPlane, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    result = cp.kubectl("get", kind, name, "-n", namespace, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def _status(cp: ControlPlane, name: str, namespace: str) -> dict[str, Any]:
    return dict((_get(cp, "eop", name, namespace) or {}).get("status") or {})


def _apply(cp: ControlPlane, namespace: str, name: str, **spec: Any) -> None:
    body: dict[str, Any] = {
        "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
        "transform": {"sql": "SELECT value FROM source"},
        "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
        **spec,
    }
    manifest = {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": name},
        "spec": body,
    }
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=True)


def _warnings(
    cp: ControlPlane, namespace: str, name: str, kind: str = "Warning"
) -> list[dict[str, Any]]:
    """The pipeline's events of type ``kind`` (Warning, or Normal)."""
    selector = f"involvedObject.name={name},involvedObject.kind=ExactlyOncePipeline,type={kind}"
    result = cp.kubectl(
        "get", "events", "-n", namespace, "--field-selector", selector, "-o", "json", check=True
    )
    return list(json.loads(result.stdout)["items"])


@pytest.fixture(scope="module")
def operator(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Its own release of the chart, so this module runs alone or after the others."""
    kubeconfig = install_chart(control_plane, "eop-admission", "eop-admission")
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(kubeconfig, log, "--all-namespaces")
    wait_for(op.alive, "the operator's liveness endpoint", timeout=60)
    yield log
    op.stop()


COPY_CHILDREN = [
    ("configmap", "orders-copy-config"),
    ("persistentvolumeclaim", "orders-copy-checkpoint"),
    ("service", "orders-copy-driver"),
    ("statefulset", "orders-copy-driver"),
]


@pytest.mark.slow
def test_a_copy_pasted_prefix_is_refused_until_the_first_pipeline_is_gone(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    shared = {"transactions": {"idPrefix": "team.orders"}}
    _apply(cp, ns, "orders", **shared)
    first = wait_for(lambda: _get(cp, "statefulset", "orders-driver", ns), "the first driver")
    _apply(cp, ns, "orders-copy", **shared)

    status = wait_for(
        lambda: (s := _status(cp, "orders-copy", ns)).get("phase") == "Invalid" and s,
        "the copy refused",
    )
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert f"'team.orders' is already used by pipeline {ns}/orders" in degraded["message"]
    warning = wait_for(lambda: _warnings(cp, ns, "orders-copy"), "a Warning event")
    assert warning[0]["reason"] == "IdentityInUse"
    assert f"{ns}/orders" in warning[0]["message"]

    # Three lifecycle ticks later: nothing was created for the copy, the first is untouched.
    wait_for(lambda: _status(cp, "orders", ns).get("specHash"), "the first one's status")
    # An edit that leaves the spec alone is an event, and the copy is looked at again.
    cp.kubectl("label", "eop", "orders-copy", "-n", ns, "team=orders", check=True)
    time.sleep(12)
    for kind, child in COPY_CHILDREN:
        assert _get(cp, kind, child, ns) is None, f"{kind}/{child} was created for the copy"
    still = _get(cp, "statefulset", "orders-driver", ns)
    assert still is not None
    assert still["metadata"]["generation"] == first["metadata"]["generation"]
    assert _status(cp, "orders", ns).get("phase") == "Pending"  # no kubelet: never Running
    assert not _warnings(cp, ns, "orders")
    # Said once: the copy's later events and looks repeat neither the event nor the status.
    assert len(_warnings(cp, ns, "orders-copy")) == 1

    # The first goes away: the copy proceeds on its next look.
    cp.kubectl("delete", "eop", "orders", "-n", ns, "--wait=true", "--timeout=60s", check=True)
    wait_for(
        lambda: _get(cp, "statefulset", "orders-copy-driver", ns),
        "the copy's driver once the prefix is free",
        timeout=45,
    )
    status = wait_for(
        lambda: (s := _status(cp, "orders-copy", ns)).get("phase") == "Pending" and s,
        "the copy's status to leave Invalid",
    )
    assert status["transactionalIdPrefix"] == "team.orders"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False", degraded


def test_deleting_a_pipeline_whose_spec_became_invalid_keeps_its_retained_checkpoint(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    _apply(cp, ns, "keep")
    wait_for(lambda: _get(cp, "persistentvolumeclaim", "keep-checkpoint", ns), "the claim")
    # The API server cannot compile a regex: this spec is stored, and the operator cannot load it.
    source = {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topicPattern": "raw("}}
    _apply(cp, ns, "keep", source=source)
    wait_for(lambda: _status(cp, "keep", ns).get("phase") == "Invalid", "phase Invalid")

    cp.kubectl("delete", "eop", "keep", "-n", ns, "--wait=true", "--timeout=60s", check=True)
    wait_for(lambda: _get(cp, "configmap", "keep-config", ns) is None, "GC of the rest")
    claim = _get(cp, "persistentvolumeclaim", "keep-checkpoint", ns)
    assert claim is not None, "the retained checkpoint claim was deleted"
    assert not claim["metadata"].get("ownerReferences")
    assert claim["metadata"].get("deletionTimestamp") is None


def test_a_shipped_transform_function_that_does_not_exist_gets_no_driver(
    control_plane: ControlPlane, operator: Path, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    python = {"module": "eop_spark.examples.impressions", "function": "count_impresions"}
    _apply(cp, ns, "typo", transform={"python": python})
    status = wait_for(
        lambda: (s := _status(cp, "typo", ns)).get("phase") == "Invalid" and s, "phase Invalid"
    )
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert "transform.python.function 'count_impresions' is not defined" in degraded["message"]
    assert _get(cp, "statefulset", "typo-driver", ns) is None


def _degraded(cp: ControlPlane, name: str, namespace: str) -> str:
    """The Degraded condition's message once the pipeline is Invalid (nothing created)."""
    status = wait_for(
        lambda: (s := _status(cp, name, namespace)).get("phase") == "Invalid" and s,
        f"{name} refused",
    )
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    return str(degraded["message"])


def test_what_only_the_brokers_and_secrets_can_tell_is_refused_before_a_driver(
    control_plane: ControlPlane, operator: Path, kube_namespace: str, kafka_broker: KafkaBroker
) -> None:
    """A transaction timeout above the broker's maximum, a sink topic the source reads from
    the same cluster (its broker written another way), a Kafka Secret holding a setting eop
    owns and a checkpoint Secret whose keys make no credentials are refused by the operator,
    naming the field; a sound pipeline on that broker proceeds, and so does one whose
    checkpoint Secret is not there yet (a Normal event says so)."""
    cp, ns, servers = control_plane, kube_namespace, kafka_broker.bootstrap_servers
    port = servers.rsplit(":", 1)[1]
    cp.kubectl(
        "create", "secret", "generic", "producer-props", "-n", ns,
        "--from-literal=transactional.id=mine", check=True,
    )  # fmt: skip
    cp.kubectl(
        "create", "secret", "generic", "store-half", "-n", ns,
        "--from-literal=AWS_ACCESS_KEY_ID=AKIA-EOP-TEST", "--from-literal=region=eu-west-1",
        check=True,
    )  # fmt: skip
    on_broker = {"bootstrapServers": servers, "topics": ["raw"]}
    _apply(cp, ns, "sound", source={"kafka": on_broker})
    sink = {"bootstrapServers": servers, "topic": "clean", "transactionTimeout": "16m"}
    _apply(cp, ns, "patient", source={"kafka": on_broker}, sink={"kafka": sink})
    sink = {"bootstrapServers": f"localhost:{port}", "topic": "raw"}
    _apply(cp, ns, "echo", source={"kafka": on_broker}, sink={"kafka": sink})
    sink = {"bootstrapServers": servers, "topic": "clean", "secretRef": {"name": "producer-props"}}
    _apply(cp, ns, "owner", sink={"kafka": sink})
    on_store = {"uri": "s3a://checkpoints/eop", "secretRef": {"name": "store-half"}}
    _apply(cp, ns, "keyless", source={"kafka": on_broker}, checkpoint=on_store)
    on_store = {"uri": "s3a://checkpoints/eop", "secretRef": {"name": "store-later"}}
    _apply(cp, ns, "early", source={"kafka": on_broker}, checkpoint=on_store)

    assert (
        "spec.sink.kafka.transactionTimeout 16m (960000 ms) is above transaction.max.timeout.ms"
        " 900000" in _degraded(cp, "patient", ns)
    )
    assert "spec.sink.kafka.topic 'raw' is read by spec.source.kafka.topics" in _degraded(
        cp, "echo", ns
    )
    assert (
        "spec.sink.kafka.secretRef (Secret producer-props): transactional.id is set by eop"
        in _degraded(cp, "owner", ns)
    )
    keyless = _degraded(cp, "keyless", ns)
    assert keyless.startswith(
        "spec.checkpoint.secretRef (Secret store-half): AWS_SECRET_ACCESS_KEY is missing; "
        "region is read by nothing."
    )
    for name in ("patient", "echo", "owner", "keyless"):
        warning = wait_for(lambda n=name: _warnings(cp, ns, n), f"{name}'s Warning event")
        assert warning[0]["reason"] == "InvalidSpec"
    # A checkpoint Secret not there yet does not hold the driver back: it may come later.
    deferred = wait_for(
        lambda: [e for e in _warnings(cp, ns, "early", "Normal") if "Deferred" in e["reason"]],
        "early's ClusterCheckDeferred event",
    )
    assert "spec.checkpoint.secretRef: Secret store-later does not exist" in str(deferred)
    wait_for(lambda: _get(cp, "statefulset", "early-driver", ns), "early's driver")
    # The key's value (plain or as the API holds it) is nowhere the operator writes.
    told = json.dumps([_status(cp, "keyless", ns), _warnings(cp, ns, "keyless")])
    for value in ("AKIA-EOP-TEST", base64.b64encode(b"AKIA-EOP-TEST").decode()):
        assert value not in told
        assert value not in operator.read_text()
    # The sound one (asked the same broker) got its driver; the refused ones got nothing.
    wait_for(lambda: _get(cp, "statefulset", "sound-driver", ns), "the sound pipeline's driver")
    for name in ("patient", "echo", "owner", "keyless"):
        assert _get(cp, "configmap", f"{name}-config", ns) is None
        assert _get(cp, "statefulset", f"{name}-driver", ns) is None
