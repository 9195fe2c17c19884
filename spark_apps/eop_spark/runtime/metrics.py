"""In-process counters of the data plane, and a tiny Prometheus text endpoint.

The counters are cumulative since the runner started; two histograms give the
distribution of batch durations (the sink's work for one micro-batch) and of
transaction times (begin to commit).  When the run config
sets ``metricsPort``, ``GET /metrics`` serves them in the Prometheus text
format (no client library needed for a handful of counters); the address is
``$EOP_METRICS_HOST`` (default 127.0.0.1; the operator sets 0.0.0.0 in pods).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from eop_spark.exactly_once.batch_result import BatchResult, BatchStatus

_HELP = {
    "batches_committed": "Micro-batches whose output this runner committed.",
    "batches_skipped": "Micro-batches found already visible in the progress group (replays).",
    "rows_in": "Input rows read by committed or skipped batches.",
    "rows_out": "Output records committed to the sink.",
    "transactions_committed": "Kafka transactions committed.",
    "transactions_aborted": "Kafka transactions aborted.",
    "producers_fenced": "Transactional producers found fenced and rebuilt.",
    "commit_seconds_total": "Time spent in sink transactions, from begin to commit.",
}


#: Upper bounds (seconds) of the histogram buckets: sub-second batches up to slow ones.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

_HISTOGRAM_HELP = {
    "batch_duration_seconds": "Time the sink spent on a micro-batch (foreachBatch call).",
    "transaction_seconds": "Time of a batch's sink transactions, from begin to commit.",
}


@dataclass
class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count (not thread-safe alone)."""

    buckets: tuple[float, ...] = BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        index = next((i for i, bound in enumerate(self.buckets) if value <= bound), -1)
        self.counts[index] += 1
        self.sum += value

    def render(self, metric: str, label: str) -> list[str]:
        """The exposition lines of this histogram (``label`` already escaped)."""
        lines = []
        total = 0
        for bound, count in zip([*self.buckets, float("inf")], self.counts, strict=True):
            total += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{metric}_bucket{{pipeline="{label}",le="{le}"}} {total}')
        lines.append(f'{metric}_sum{{pipeline="{label}"}} {self.sum}')
        lines.append(f'{metric}_count{{pipeline="{label}"}} {total}')
        return lines


@dataclass
class Counters:
    """Cumulative data-plane counters, safe to update from several threads."""

    batches_committed: int = 0
    batches_skipped: int = 0
    rows_in: int = 0
    rows_out: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    producers_fenced: int = 0
    commit_seconds_total: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _histograms: dict[str, Histogram] = field(
        default_factory=lambda: {name: Histogram() for name in _HISTOGRAM_HELP},
        repr=False,
        compare=False,
    )

    def record(self, result: BatchResult, seconds: float | None = None) -> None:
        """Count one finished batch; ``seconds`` is how long the sink took for it, if timed."""
        with self._lock:
            if seconds is not None:
                self._histograms["batch_duration_seconds"].observe(seconds)
            if result.transactions:
                self._histograms["transaction_seconds"].observe(result.txn_ms / 1000.0)
            if result.status == BatchStatus.SKIPPED:
                self.batches_skipped += 1
            else:
                self.batches_committed += 1
            self.rows_out += result.rows_out
            self.transactions_committed += result.transactions
            self.transactions_aborted += result.aborted
            self.producers_fenced += result.fenced
            self.commit_seconds_total += result.txn_ms / 1000.0

    def add_rows_in(self, rows: int) -> None:
        """Count input rows (known once Spark's batch report for the batch arrives)."""
        with self._lock:
            self.rows_in += rows

    def snapshot(self) -> dict[str, float]:
        """The current values by name."""
        with self._lock:
            names = [f.name for f in fields(self) if not f.name.startswith("_")]
            return {name: getattr(self, name) for name in names}

    def render_prometheus(self, pipeline: str) -> str:
        """The counters in the Prometheus text exposition format."""
        label = pipeline.replace("\\", "\\\\").replace('"', '\\"')
        lines: list[str] = []
        for name, value in self.snapshot().items():
            metric = f"eop_{name}" if name.endswith("_total") else f"eop_{name}_total"
            lines += [
                f"# HELP {metric} {_HELP[name]}",
                f"# TYPE {metric} counter",
                f'{metric}{{pipeline="{label}"}} {value}',
            ]
        with self._lock:
            for name, histogram in self._histograms.items():
                metric = f"eop_{name}"
                lines += [f"# HELP {metric} {_HISTOGRAM_HELP[name]}", f"# TYPE {metric} histogram"]
                lines += histogram.render(metric, label)
        return "\n".join(lines) + "\n"


def serve_metrics(counters: Counters, pipeline: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` on ``port`` from a daemon thread; return the server (to shut down)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = counters.render_prometheus(pipeline).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would drown the batch log

    host = os.environ.get("EOP_METRICS_HOST", "127.0.0.1")
    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="eop-metrics", daemon=True).start()
    return server
