"""GitOps tools judge live pipelines: Argo CD's health check (Lua), kstatus, ``kubectl wait``.

One operator on the real control plane runs pipelines into each state a user meets; the
test captures each pipeline object from the API server as it is, then runs the shipped
Argo CD health script with the real Lua interpreter and sigs.k8s.io/cli-utils's kstatus
(built from its Go module) on it.  No kubelet: the test plays its part (see
tests/integration/test_lifecycle.py).  The mapping is documented in docs/gitops.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devenv.kafka import KafkaBroker
from devenv.kube import ControlPlane
from tests.ecosystem.tools import HEALTH_LUA, argocd_health, kstatus
from tests.integration.operators import OperatorProcess, wait_for
from tests.integration.test_health import mark_ready, produce, restart_events
from tests.integration.test_lifecycle import Pipeline
from tests.plugins.kafka import TopicFactory

pytestmark = [pytest.mark.kube, pytest.mark.kafka, pytest.mark.ecosystem]

ROOT = Path(__file__).resolve().parents[2]

#: state -> (Argo CD health, kstatus status): what docs/gitops.md promises.
EXPECTED = {
    "new": ("Progressing", "InProgress"),
    "healthy": ("Healthy", "Current"),
    "upgrading": ("Progressing", "InProgress"),
    # kstatus falls back to Ready (False): a settled suspension still reads InProgress.
    "suspended": ("Suspended", "InProgress"),
    # Degraded is Stalled: kstatus reads Failed at once.
    "crash-loop": ("Degraded", "Failed"),
    "invalid": ("Degraded", "Failed"),
    "stalled": ("Progressing", "InProgress"),
}


def live(p: Pipeline) -> dict[str, Any]:
    """The pipeline object as the API server serves it now."""
    obj = p.get("eop", p.name)
    assert obj is not None
    return obj


def seen(p: Pipeline, accept: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The live object once the operator has acted on its spec and ``accept`` holds."""

    def probe() -> dict[str, Any] | None:
        obj = live(p)
        status = obj.get("status", {})
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and accept(status) else None

    return wait_for(probe, f"{p.name}: {what}", timeout=90)


def is_true(status: dict[str, Any], kind: str) -> bool:
    """Whether the status has condition ``kind`` True."""
    return any(c["type"] == kind and c["status"] == "True" for c in status.get("conditions", []))


def ready_wait(cp: ControlPlane, p: Pipeline, timeout: str) -> int:
    """``kubectl wait --for=condition=Ready eop/NAME``: its exit code."""
    wait = cp.kubectl(
        "wait", "--for=condition=Ready", f"eop/{p.name}", "-n", p.ns, f"--timeout={timeout}"
    )
    return wait.returncode


@pytest.mark.slow
def test_argo_cd_and_kstatus_read_every_state_of_a_live_pipeline(
    control_plane: ControlPlane,
    pipeline: Callable[..., Pipeline],
    kafka_broker: KafkaBroker,
    kafka_topic_factory: TopicFactory,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    cp = control_plane
    captured: dict[str, dict[str, Any]] = {}

    # Started first: its stall timeout runs while the other states are made.
    topic = kafka_topic_factory(1)
    produce(kafka_broker, topic, {0: 5})  # input waits; nothing ever commits
    servers = kafka_broker.bootstrap_servers
    stuck = pipeline(
        "stuck",
        source={"kafka": {"bootstrapServers": servers, "topics": [topic]}},
        sink={"kafka": {"bootstrapServers": servers, "topic": "out"}},  # the progress group's
        health={"checkInterval": "1s", "stallTimeout": "4s"},
        trigger={"processingTime": "1s"},
    )

    p = pipeline("orders")
    captured["new"] = seen(p, lambda s: s.get("phase") == "Pending", "phase Pending")
    assert ready_wait(cp, p, "1s") != 0  # not Ready: kubectl wait times out

    p.running()
    captured["healthy"] = live(p)
    assert ready_wait(cp, p, "30s") == 0

    p.spec["transform"]["sql"] = "SELECT key, upper(value) AS value FROM source"
    p.apply()
    captured["upgrading"] = seen(p, lambda s: bool(s.get("upgrade")), "an upgrade in flight")
    p.running()

    p.spec["suspend"] = True
    p.apply()
    captured["suspended"] = seen(
        p,
        lambda s: s.get("phase") == "Suspended" and not is_true(s, "Progressing"),
        "the driver stopped",
    )
    # The phase as a metric, for dashboards and alerts.
    phase = 'eop_pipeline_phase{{namespace="{}",phase="{}",pipeline="{}"}}'
    suspended = phase.format(p.ns, "Suspended", p.name)
    wait_for(lambda: operator.metric(suspended) == 1, "the phase metric")
    assert operator.metric(phase.format(p.ns, "Running", p.name)) == 0

    crashy = pipeline("crashy", failover={"maxRestarts": 1, "window": "10m"})
    spec_hash = crashy.running()
    for attempt in range(2):
        failed = crashy.fail(spec_hash, f"eop: error: [Failed] broker went away ({attempt})")

        def replaced(failed: str = failed) -> bool:
            # The StatefulSet controller replaces the failed pod.
            return (crashy.pod() or {}).get("metadata", {}).get("uid") not in (None, failed)

        wait_for(replaced, "a replacement pod")
    captured["crash-loop"] = seen(crashy, lambda s: s.get("phase") == "Degraded", "Degraded")

    # A pattern the API server accepts but Python cannot compile: Invalid before any driver.
    broken = pipeline(
        "broken", source={"kafka": {"bootstrapServers": "127.0.0.1:9092", "topicPattern": "raw("}}
    )
    captured["invalid"] = seen(broken, lambda s: s.get("phase") == "Invalid", "phase Invalid")

    # Stalled: Ready, input waiting, nothing committed for the stall timeout: restarted.
    wait_for(lambda: stuck.pod(), "the stuck driver pod")
    mark_ready(cp, stuck.ns, f"{stuck.name}-driver-0")
    wait_for(lambda: restart_events(cp, stuck.ns, stuck.name), "a RestartStalled event")
    captured["stalled"] = seen(stuck, lambda s: s.get("phase") == "Pending", "the restart")
    lag = f'namespace="{stuck.ns}",partition="0",pipeline="stuck",topic="{topic}"'
    wait_for(lambda: operator.metric(f"eop_partition_lag_records{{{lag}}}") == 5, "partition lag")

    (tmp_path / "captured.json").write_text(json.dumps(captured, indent=1))
    verdicts = {state: (argocd_health(obj), kstatus(obj)) for state, obj in captured.items()}
    got = {state: (lua[0], ks[0]) for state, (lua, ks) in verdicts.items()}
    assert got == EXPECTED, json.dumps(verdicts, indent=1)

    # The messages say why, in the operator's words.
    assert "broker went away (1)" in verdicts["crash-loop"][0][1]
    assert "topicPattern" in verdicts["invalid"][0][1]
    assert "topicPattern" in verdicts["invalid"][1][1]


def test_the_documented_argocd_cm_snippet_is_the_shipped_script() -> None:
    """docs/gitops.md's argocd-cm block holds charts/eop/gitops/argocd/health.lua verbatim."""
    doc = (ROOT / "docs" / "gitops.md").read_text()
    indented = "".join(
        f"    {line}\n" if line else "\n" for line in HEALTH_LUA.read_text().splitlines()
    )
    assert "resource.customizations.health.exactlyonce.io_ExactlyOncePipeline: |\n" in doc
    assert indented in doc


def test_a_pipeline_the_operator_has_not_seen_is_progressing() -> None:
    """Before any status, and after a spec edit the operator has not acted on."""
    obj: dict[str, Any] = {
        "apiVersion": "exactlyonce.io/v1alpha1",
        "kind": "ExactlyOncePipeline",
        "metadata": {"name": "p", "namespace": "n", "generation": 1},
    }
    assert argocd_health(obj)[0] == "Progressing"
    obj["status"] = {
        "phase": "Running",
        "observedGeneration": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": "DriverReady"}],
    }
    assert argocd_health(obj)[0] == "Healthy"
    obj["metadata"]["generation"] = 2
    assert argocd_health(obj) == (
        "Progressing",
        "the operator has not acted on generation 2 yet",
    )
    assert kstatus(obj)[0] == "InProgress"
