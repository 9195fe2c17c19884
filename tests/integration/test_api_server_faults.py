"""An API server that throttles and fails, seen where a platform team looks, then recovered.

The operator (a subprocess with the chart's RBAC) talks to the real kube-apiserver through a
local proxy: plain HTTP in, TLS out, responses streamed (watches pass). While the proxy
answers every new request with 429 or 503 and ``Retry-After: 1`` (an overloaded API server
under Priority and Fairness), the operator:

* waits as ``Retry-After`` says between attempts, and gives up on a request after its
  attempts, with a log line that says so;
* counts the failed lifecycle steps (``eop_reconcile_failures_total{error="KubeUnavailable"}``,
  what ``EopReconcileFailing`` fires on) and health checks (``kind="api"``, what
  ``EopHealthChecksFailing`` fires on), and stays alive;
* once the API server answers again, applies the spec edit it could not apply, with no
  restart of its own, and its checks succeed again.

Then the proxy holds every new request without an answer (an API server too slow to answer,
watches aside): each request of the operator gives up at its ``--api-timeout``, and the same
counters count the step and the check that failed, with ``no response`` in the log; once
answers come again, the next edit is applied.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import yaml
from aiohttp import web

from devenv.kafka import KafkaBroker
from devenv.kube import ControlPlane
from devenv.processes import free_port
from eop_operator.kube.client import _ssl_context
from tests.integration.operators import OperatorProcess, install_chart, wait_for
from tests.integration.test_health import commit, kafka_secret, pipeline, status
from tests.integration.test_lease import HOP_BY_HOP
from tests.integration.test_operator_on_apiserver import _apply, get

pytestmark = [pytest.mark.kube, pytest.mark.kafka, pytest.mark.slow]

RELEASE = "eop-faults"
NAMESPACE = "eop-faults-system"


#: The operator's ``--api-timeout``: how long a request waits for an answer that never comes.
API_TIMEOUT_S = 2


class FaultyProxy:
    """The API server behind switches: while ``refusing``, new requests get 429 or 503; while
    ``stalling``, new requests but watches get no answer until it stops (then a 504).

    Runs its own event loop in a thread; ``refused`` and ``stalled`` count those requests.
    """

    def __init__(self, server: str, ca: Path) -> None:
        self.upstream = kopf.ConnectionInfo(server=server, ca_path=str(ca))
        self.refusing = False
        self.refused = 0
        self.stalling = False
        self.stalled = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10), "the proxy did not start"

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        started.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=_ssl_context(self.upstream)),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.forward)
        self.runner = web.AppRunner(app, shutdown_timeout=1)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if self.refusing:
            self.refused += 1
            code = 429 if self.refused % 2 else 503
            return web.json_response(
                {"kind": "Status", "code": code, "message": "the proxy refuses (test)"},
                status=code,
                headers={"Retry-After": "1"},
            )
        if self.stalling and request.query.get("watch") not in ("true", "1"):
            self.stalled += 1
            while self.stalling:
                await asyncio.sleep(0.2)
            return web.json_response({"kind": "Status", "code": 504}, status=504)
        async with self.session.request(
            request.method,
            self.upstream.server + request.path_qs,
            data=await request.read() or None,  # no body, no Content-Type (415 on a GET)
            headers={k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP},
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():  # a watch streams its events
                await response.write(chunk)
            await response.write_eof()
            return response

    def close(self) -> None:
        async def stop() -> None:
            await self.runner.cleanup()
            await self.session.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def through(kubeconfig: Path, proxy: FaultyProxy) -> Path:
    """``kubeconfig`` with its server replaced by the proxy (plain HTTP, same token)."""
    config = yaml.safe_load(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"] = {"server": proxy.url}
    proxied = kubeconfig.with_name(f"proxied-{kubeconfig.name}")
    proxied.write_text(yaml.safe_dump(config))
    return proxied


@pytest.fixture
def proxied_operator(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, FaultyProxy]]:
    """``eop operator`` serving ``kube_namespace`` through a :class:`FaultyProxy`."""
    kubeconfig = install_chart(control_plane, RELEASE, NAMESPACE)
    proxy = FaultyProxy(control_plane.server, control_plane.ca_cert)
    proc = OperatorProcess(
        through(kubeconfig, proxy),
        tmp_path / "operator.log",
        *("--namespace", kube_namespace, "--api-timeout", str(API_TIMEOUT_S)),
    )
    try:
        wait_for(proc.alive, "the operator's liveness endpoint")
        yield proc, proxy
    finally:
        proc.stop()
        proxy.close()
        control_plane.helm("uninstall", RELEASE, "--namespace", NAMESPACE)


def manifest(broker: KafkaBroker, sql: str) -> dict[str, Any]:
    """The pipeline ``faults``: a real broker, its settings partly from a Secret."""
    spec = pipeline("faults", broker, "in-faults", checkInterval="2s")
    spec["spec"]["transform"]["sql"] = sql
    return spec


def counted(proc: OperatorProcess, metric: str, namespace: str, **labels: str) -> float:
    """The operator's sample of ``metric`` for pipeline ``faults`` with ``labels`` (0: none)."""
    labels |= {"namespace": namespace, "pipeline": "faults"}
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))  # as the exposition has them
    return proc.metric(f"{metric}{{{inner}}}") or 0.0


def rendered_sql(cp: ControlPlane, namespace: str) -> str:
    """The pipeline's run configuration as the operator last applied it."""
    return str((get(cp, "configmap", "faults-config", namespace) or {}).get("data"))


def test_a_throttling_api_server_is_retried_counted_and_recovered_from(
    control_plane: ControlPlane,
    kube_namespace: str,
    kafka_broker: KafkaBroker,
    proxied_operator: tuple[OperatorProcess, FaultyProxy],
) -> None:
    cp, ns, broker = control_plane, kube_namespace, kafka_broker
    proc, proxy = proxied_operator
    broker.create_topic("in-faults", 1)
    commit(broker, f"eop.{ns}.faults", "in-faults", {0: 0})
    kafka_secret(cp, ns, "faults")
    _apply(cp, ns, manifest(broker, "SELECT key, value FROM source"))
    first = wait_for(
        lambda: (s := status(cp, ns, "faults")).get("observedGeneration") == 1 and s,
        "the operator to take the pipeline on",
    )
    assert first["phase"] != "Invalid", first
    success = "eop_health_check_last_success_timestamp_seconds"
    wait_for(lambda: counted(proc, success, ns), "a good health check")
    assert counted(proc, "eop_health_check_failures_total", ns, kind="api") == 0

    proxy.refusing = True
    refused_at = time.time()
    edited = "SELECT key, value FROM source WHERE value IS NOT NULL"
    _apply(cp, ns, manifest(broker, edited))  # the admin's own way in: the watch sees it
    wait_for(
        lambda: counted(proc, "eop_reconcile_failures_total", ns, error="KubeUnavailable"),
        "a lifecycle step to give up on the API server",
        timeout=90,
    )
    wait_for(
        lambda: counted(proc, "eop_health_check_failures_total", ns, kind="api"),
        "a health check to fail at the API server",
        timeout=60,
    )
    assert counted(proc, success, ns) < refused_at  # no check got through meanwhile
    assert proc.alive()  # failing requests never take the operator down
    assert "gave up after 6 attempts" in proc.text()
    # Each request was tried again as Retry-After said (1 s), not at once nor later.
    waits = re.findall(r"API server (?:429|503) on .*; retrying in ([0-9.]+)s", proc.text())
    assert waits and set(waits) == {"1.0"}, waits[:10]
    assert "IS NOT NULL" not in rendered_sql(cp, ns)  # nothing got through meanwhile

    proxy.refusing = False
    recovered_at = time.time()
    healed = wait_for(
        lambda: (s := status(cp, ns, "faults")).get("observedGeneration") == 2 and s,
        "the edit to be applied once the API server answers",
        timeout=120,
    )
    assert healed["phase"] != "Invalid", healed
    wait_for(lambda: "IS NOT NULL" in rendered_sql(cp, ns), "the edit in the run configuration")
    wait_for(lambda: counted(proc, success, ns) > recovered_at, "a good health check again")
    assert proc.proc.poll() is None  # the same process: it recovered on its own

    # Too slow to answer at all: each request gives up at the operator's --api-timeout.
    steps = counted(proc, "eop_reconcile_failures_total", ns, error="KubeUnavailable")
    checks = counted(proc, "eop_health_check_failures_total", ns, kind="api")
    proxy.stalling = True
    stalled_at = time.time()
    _apply(cp, ns, manifest(broker, "SELECT key, value FROM source WHERE key IS NOT NULL"))
    wait_for(
        lambda: counted(proc, "eop_reconcile_failures_total", ns, error="KubeUnavailable") > steps,
        "a lifecycle step to give up on an API server that does not answer",
        timeout=60,
    )
    # At the operator's --api-timeout (a few seconds, with the timer's next tick), not 30 s.
    assert time.time() - stalled_at < 20
    wait_for(
        lambda: counted(proc, "eop_health_check_failures_total", ns, kind="api") > checks,
        "a health check to give up on an API server that does not answer",
        timeout=60,
    )
    assert proxy.stalled and proc.alive()
    assert counted(proc, success, ns) < stalled_at  # no check got through meanwhile
    assert "no response: TimeoutError()" in proc.text()
    assert "key IS NOT NULL" not in rendered_sql(cp, ns)

    proxy.stalling = False
    wait_for(
        lambda: "key IS NOT NULL" in rendered_sql(cp, ns),
        "the edit applied once the API server answers again",
        timeout=120,
    )
    assert proc.proc.poll() is None
