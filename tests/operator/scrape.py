"""Scrape the operator's ``/metrics`` endpoint as Prometheus would: over HTTP on loopback."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from eop_operator import metrics


def free_port() -> int:
    """A TCP port on loopback that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str) -> str:
    """The body of a GET (blocking)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


async def scrape(host: str = "127.0.0.1") -> str:
    """Serve ``/metrics`` on ``host`` (a free port) for one scrape; return the text."""
    port = free_port()
    runner = await metrics.serve(metrics=metrics.Endpoint(host, port, "/metrics"), liveness=None)
    try:
        return await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
    finally:
        await runner.cleanup()


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with exactly ``labels`` in a scrape, None if absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None
