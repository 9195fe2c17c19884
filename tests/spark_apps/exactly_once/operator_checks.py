"""The operator's health check of one pipeline, in a process of its own, as long as it lives.

``python -m tests.spark_apps.exactly_once.operator_checks BOOTSTRAP SOURCE SINK GROUP OUT``
reads the progress group ``GROUP`` against the end offsets of ``SOURCE`` every second with the
operator's own code (``health.progress``: the pipeline's Kafka settings, then
``read_offsets``, with the operator's per-request timeout), and appends one line per check to
``OUT``: ``ok EPOCH LAG``, ``unavailable EPOCH MESSAGE`` (what ``status.progress.message``
would say), or ``error EPOCH EXCEPTION`` for anything else, which in the operator would escape
the check. A separate process, as the operator is: if the Kafka client aborts the process
under a broker fault, the process is gone, and the test sees it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from eop_operator.api.load import load_pipeline
from eop_operator.health.progress import ProgressUnavailable, kafka_access, read_offsets

#: Seconds between two checks (the operator's spec.health.checkInterval, made short).
INTERVAL_S = 1.0


def main(bootstrap: str, source: str, sink: str, group: str, out: Path) -> None:
    """Check until killed; one line per check in ``out``."""
    pipeline = load_pipeline(
        {
            "apiVersion": "exactlyonce.io/v1alpha1",
            "kind": "ExactlyOncePipeline",
            "metadata": {"name": "checked", "namespace": "faults"},
            "spec": {
                "source": {"kafka": {"bootstrapServers": bootstrap, "topics": [source]}},
                "transform": {"sql": "SELECT key, value FROM source"},
                "sink": {"kafka": {"bootstrapServers": bootstrap, "topic": sink}},
            },
        }
    )
    # No Secret: the API client is never asked.
    access = asyncio.run(kafka_access(None, pipeline))  # type: ignore[arg-type]
    with out.open("a", buffering=1) as lines:
        while True:
            at = time.time()
            try:
                read = read_offsets(access, pipeline, group)
                lag = sum(p.end - (p.committed or 0) for p in read)
                lines.write(f"ok {at:.3f} {lag}\n")
            except ProgressUnavailable as exc:
                lines.write(f"unavailable {at:.3f} {exc}\n")
            except Exception as exc:  # what the operator would not survive
                lines.write(f"error {at:.3f} {exc!r}\n")
            time.sleep(max(0.0, at + INTERVAL_S - time.time()))


if __name__ == "__main__":
    main(*sys.argv[1:5], Path(sys.argv[5]))
