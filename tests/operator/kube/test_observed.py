"""The lifecycle's view: what the watches delivered, and the operator's own writes meanwhile."""

from __future__ import annotations

from typing import Any

from eop_operator.kube.observed import OWN_WRITES_SECONDS, Observed, OwnWrites, slim
from eop_operator.reconcile.observe import lost_with_node
from eop_operator.render.naming import PIPELINE_LABEL


def _child(kind: str, name: str, version: str, uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": version,
            "labels": {PIPELINE_LABEL: "p"},
            "managedFields": [{"manager": "eop-operator"}],
        },
        "spec": {"template": {"metadata": {"annotations": {"a": "b"}}, "spec": {"x": 1}}},
        "status": {"readyReplicas": 1},
    }


PIPELINE = {
    "apiVersion": "exactlyonce.io/v1alpha1",
    "kind": "ExactlyOncePipeline",
    "metadata": {"name": "p", "namespace": "ns", "uid": "p1", "resourceVersion": "5"},
    "spec": {"suspend": False},
    "status": {"phase": "Pending"},
}


def test_slim_keeps_what_the_lifecycle_reads() -> None:
    sts = slim(_child("StatefulSet", "p-driver", "3"))
    assert "managedFields" not in sts["metadata"]
    assert sts["spec"]["template"] == {"metadata": {"annotations": {"a": "b"}}}
    assert sts["status"] == {"readyReplicas": 1}
    config = slim(_child("ConfigMap", "p-config", "3"))
    assert set(config) == {"apiVersion", "kind", "metadata"}


def test_an_own_write_stands_in_until_the_watch_delivers_it() -> None:
    own = OwnWrites()
    watched = [_child("ConfigMap", "p-config", "3")]
    own.record(_child("ConfigMap", "p-config", "4"), clock=100.0)
    view = own.merged(("ns", "p"), "ConfigMap", watched, clock=101.0)
    assert view["p-config"]["metadata"]["resourceVersion"] == "4"
    caught_up = [_child("ConfigMap", "p-config", "4")]
    view = own.merged(("ns", "p"), "ConfigMap", caught_up, clock=101.0)
    assert view["p-config"]["metadata"]["resourceVersion"] == "4"
    assert not own.entries  # dropped once delivered
    # Not yet seen by the watch at all (a create): stands in too.
    own.record(_child("Service", "p-driver", "6"), clock=100.0)
    assert "p-driver" in own.merged(("ns", "p"), "Service", [], clock=101.0)


def test_an_own_write_goes_with_a_deletion_or_after_a_while() -> None:
    own = OwnWrites()
    written = _child("ConfigMap", "p-config", "4")
    own.record(written, clock=100.0)
    own.forget(written)  # the watch saw it deleted
    assert own.merged(("ns", "p"), "ConfigMap", [], clock=101.0) == {}
    own.record(written, clock=100.0)
    later = 100.0 + OWN_WRITES_SECONDS + 1
    assert own.merged(("ns", "p"), "ConfigMap", [], clock=later) == {}


def test_a_pipeline_the_watch_dropped_is_gone_whatever_was_written() -> None:
    own = OwnWrites()
    own.record(PIPELINE, clock=100.0)
    observed = Observed(pipelines={}, children={}, own=own)
    assert observed.pipeline("ns", "p", clock=101.0) is None
    observed = Observed(pipelines={("ns", "p"): [PIPELINE]}, children={}, own=OwnWrites())
    assert observed.pipeline("ns", "p", clock=101.0) == PIPELINE


def test_versions_change_with_any_object_the_lifecycle_reads() -> None:
    children = {("ns", "p"): [_child("StatefulSet", "p-driver", "3")]}
    observed = Observed(pipelines={("ns", "p"): [PIPELINE]}, children=children, own=OwnWrites())
    before = observed.versions("ns", "p", clock=1.0)
    assert before == observed.versions("ns", "p", clock=2.0)
    children[("ns", "p")].append(_child("Pod", "p-driver-0", "8", uid="pod"))
    assert observed.versions("ns", "p", clock=3.0) != before


def test_a_driver_lost_with_its_node_is_named_by_it_through_the_watch() -> None:
    """What the operator keeps of a pod still says which node it went with."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p-driver-0", "namespace": "ns", "uid": "d1"},
        "spec": {"nodeName": "node2", "containers": [{"name": "driver"}]},
        "status": {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "DisruptionTarget",
                    "reason": "DeletionByTaintManager",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "containerStatuses": [{"name": "driver", "state": {"running": {}}}],
        },
    }
    kept = slim(pod)
    assert "containers" not in kept["spec"]
    termination = lost_with_node(kept)
    assert termination is not None and termination.node_lost
    assert "node node2 was not reporting" in termination.message
