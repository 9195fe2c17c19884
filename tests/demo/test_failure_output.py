"""What a failed demo prints to explain itself (``demo.run.explain_failure``)."""

from __future__ import annotations

import json
import subprocess
from typing import cast

import pytest

from demo.run import explain_failure
from devenv.cluster import LocalCluster

NODES = {
    "items": [
        {
            "metadata": {"name": "127.0.0.1"},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {
                        "type": "DiskPressure",
                        "status": "True",
                        "message": "kubelet has disk pressure",
                    },
                    {"type": "Ready", "status": "True", "message": "kubelet is posting ready"},
                ]
            },
        }
    ]
}
PIPELINES = {
    "items": [
        {"metadata": {"name": "impressions-clean"}, "status": {}},
        {
            "metadata": {"name": "impressions-count"},
            "status": {"conditions": [{"type": "Ready", "message": "driver pod is Pending"}]},
        },
    ]
}
EVENTS = [
    "NAMESPACE    LAST SEEN   TYPE      REASON    OBJECT                    MESSAGE",
    *[f"eop-demo     {i}s   Warning   Other   pod/x   old {i}" for i in range(12)],
    "eop-system   1s          Warning   Evicted   pod/eop-7d49ffc56-57xmn   The node was low on"
    " resource: ephemeral-storage.",
]


class Kubectl:
    """Answers the ``kubectl`` calls of ``explain_failure`` as a cluster short of disk would."""

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = ""
        if args[:3] == ("get", "-o", "json"):
            out = json.dumps({"nodes": NODES, "eop": PIPELINES}[args[3]])
        elif args[:2] == ("get", "events"):
            out = "\n".join(EVENTS) + "\n"
        elif args[:2] == ("get", "eop,pods"):
            out = "NAMESPACE NAME\n"
        return subprocess.CompletedProcess(list(args), 0, out, "")


def test_a_failed_run_names_the_node_pressure_and_the_latest_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    explain_failure(cast(LocalCluster, Kubectl()))
    err = capsys.readouterr().err
    assert "impressions-clean: no status yet" in err
    assert "impressions-count: driver pod is Pending" in err
    assert "node 127.0.0.1: DiskPressure: kubelet has disk pressure" in err
    assert "MemoryPressure" not in err and "node 127.0.0.1: Ready" not in err
    lines = err.splitlines()
    warnings = lines[lines.index("latest warnings:") + 1 :]
    assert warnings[0].startswith("NAMESPACE")
    assert warnings[-1].endswith("ephemeral-storage.")
    assert len(warnings) == 11  # the header and the latest ten
