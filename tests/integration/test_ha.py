"""Two operator replicas on a real API server: one acts, the other stands by and takes over.

Both run ``eop operator --leader-election`` with the chart's RBAC. Only the Lease holder
reconciles: a pipeline gets its children, no event is posted twice, and the standby's log
shows no handler at work. Killing the leader with SIGKILL (no release) hands the Lease to the
standby within the lease duration, and the new leader serves the next pipeline.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devenv.kube import ControlPlane
from tests.integration.operators import OperatorProcess, install_chart
from tests.integration.test_operator_on_apiserver import _apply, _events, _pipeline, get, wait_for

pytestmark = pytest.mark.kube

RELEASE = "eop-ha"
NAMESPACE = "eop-ha-system"
LEASE_SECONDS = 6


def lease(cp: ControlPlane) -> dict[str, Any]:
    return get(cp, "lease", RELEASE, NAMESPACE) or {}


def holder(cp: ControlPlane) -> str:
    return str(lease(cp).get("spec", {}).get("holderIdentity") or "")


@pytest.fixture
def replicas(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> Iterator[dict[str, OperatorProcess]]:
    """Two replicas, ``a`` and ``b``, serving ``kube_namespace`` with the chart's RBAC."""
    kubeconfig = install_chart(control_plane, RELEASE, NAMESPACE)
    args = (
        "--namespace",
        kube_namespace,
        "--leader-election",
        "--leader-election-namespace",
        NAMESPACE,
        "--leader-election-id",
        RELEASE,
        "--lease-duration",
        str(LEASE_SECONDS),
    )
    procs = {
        name: OperatorProcess(kubeconfig, tmp_path / f"{name}.log", *args, pod_name=f"op-{name}")
        for name in ("a", "b")
    }
    try:
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()
        control_plane.helm("uninstall", RELEASE, "--namespace", NAMESPACE)
        for proc in procs.values():
            assert "Forbidden" not in proc.text(), "the chart's RBAC was not enough"


def acted(proc: OperatorProcess) -> bool:
    """Whether kopf ran a handler in this replica."""
    return "Handler '" in proc.text()


def assert_no_double_action(cp: ControlPlane, namespace: str, name: str) -> None:
    """Two acting replicas would post each event twice, with the same reason and message."""
    events = [(e["reason"], e["message"]) for e in _events(cp, namespace, name)]
    assert len(events) == len(set(events)), json.dumps(events, indent=1)


def test_one_replica_acts_and_the_other_takes_over(
    control_plane: ControlPlane, kube_namespace: str, replicas: dict[str, OperatorProcess]
) -> None:
    cp, ns = control_plane, kube_namespace
    wait_for(lambda: all(p.alive() for p in replicas.values()), "both replicas' liveness")
    leader_id = wait_for(lambda: holder(cp), "a lease holder")
    leader_name = "a" if leader_id.startswith("op-a_") else "b"
    leader, standby = replicas[leader_name], replicas["b" if leader_name == "a" else "a"]
    assert leader_id.startswith(f"op-{leader_name}_")
    wait_for(lambda: leader.metric("eop_operator_leader") == 1, "the leader's metric")
    assert standby.metric("eop_operator_leader") == 0
    assert "standby" in standby.text()

    # Only the leader acts: the pipeline's children, one Applied event, nothing in the standby.
    _apply(cp, ns, _pipeline("first"))
    wait_for(lambda: get(cp, "statefulset", "first-driver", ns), "the first StatefulSet")
    wait_for(
        lambda: (get(cp, "eop", "first", ns) or {}).get("status", {}).get("specHash"), "status"
    )
    wait_for(lambda: acted(leader), "the leader's reconcile handler")
    time.sleep(2 * LEASE_SECONDS / 7.5 + 1)  # a few renewals: the standby had every chance
    assert_no_double_action(cp, ns, "first")
    assert not acted(standby) and holder(cp) == leader_id

    # The leader dies without releasing the Lease; the standby takes over once it has seen the
    # Lease unchanged for a whole lease duration.
    transitions = lease(cp)["spec"].get("leaseTransitions", 0)
    killed = time.monotonic()
    leader.kill()
    new_id = wait_for(
        lambda: (h := holder(cp)) != leader_id and h, "the standby to take over", timeout=60
    )
    took = time.monotonic() - killed
    assert new_id.startswith(f"op-{'b' if leader_name == 'a' else 'a'}_")
    assert LEASE_SECONDS * 0.5 <= took <= LEASE_SECONDS + 5, f"takeover after {took:.1f}s"
    assert lease(cp)["spec"]["leaseTransitions"] == transitions + 1

    # The new leader serves pipelines.
    _apply(cp, ns, _pipeline("second"))
    wait_for(lambda: get(cp, "statefulset", "second-driver", ns), "the second StatefulSet")
    wait_for(lambda: acted(standby), "the new leader's reconcile handler")
    wait_for(lambda: standby.metric("eop_operator_leader") == 1, "the new leader's metric")
    assert_no_double_action(cp, ns, "second")


def test_a_clean_stop_hands_over_at_once(
    control_plane: ControlPlane, replicas: dict[str, OperatorProcess]
) -> None:
    cp = control_plane
    leader_id = wait_for(lambda: holder(cp), "a lease holder")
    leader = replicas["a" if leader_id.startswith("op-a_") else "b"]
    leader.stop()  # SIGTERM: kopf stops, then the Lease is released
    wait_for(lambda: (h := holder(cp)) and h != leader_id, "the standby to take over", timeout=30)
    # The standby took over from the release, without waiting for the released lease to
    # expire (its holder renewed every LEASE_SECONDS / 7.5 up to then, so it would have
    # expired LEASE_SECONDS - 0.8 s after the release at the soonest); the stop before the
    # release (kopf's handlers and daemons ending) takes what a busy machine gives it.
    released = _logged_at(leader.text(), "released the lease")
    acquired = datetime.datetime.fromisoformat(lease(cp)["spec"]["acquireTime"])
    assert (acquired - released).total_seconds() < LEASE_SECONDS - 1, (released, acquired)


def _logged_at(log: str, message: str) -> datetime.datetime:
    """When the operator logged ``message`` (its log's timestamps are this machine's time)."""
    for line in log.splitlines():
        if message in line:
            stamp = line[1 : line.index("]")]  # [2026-11-29 05:02:44,552] ...
            return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").astimezone()
    raise AssertionError(f"the operator never logged {message!r}")
