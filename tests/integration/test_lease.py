"""Leader election against a slow API server: leadership never outlives the renew deadline.

The leader talks to the real kube-apiserver through a local HTTP proxy that can stop answering
Lease renewals (as an overloaded API server does); the standby talks to it directly. Once the
leader's renewals hang, it must give up within the renew deadline of its last renewal sent,
before the standby may take over a lease duration later: never two leaders at once.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import kopf
import pytest
from aiohttp import web

from devenv.kube import ControlPlane
from devenv.processes import free_port
from eop_operator.kube.client import KubeClient, _ssl_context
from eop_operator.kube.lease import LeaderElector

pytestmark = pytest.mark.kube

LEASE_SECONDS, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 2.5, 0.5
#: Scheduling slack allowed on top of the renew deadline (a loaded 2-core machine).
SLACK = 0.5
#: Request headers the proxy does not pass on (its own connection's, not the request's).
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection"}


def admin_login(cp: ControlPlane) -> kopf.ConnectionInfo:
    """The control plane's admin credentials, as the operator's login would return them."""
    return kopf.ConnectionInfo(
        server=cp.server,
        ca_path=str(cp.ca_cert),
        certificate_path=str(cp.pki_dir / "admin.crt"),
        private_key_path=str(cp.pki_dir / "admin.key"),
    )


class SlowProxy:
    """Plain HTTP in, the real API server out; while ``stalled``, Lease writes get no answer."""

    def __init__(self, upstream: kopf.ConnectionInfo) -> None:
        self.upstream = upstream
        self.stalled = False
        self.unblock = asyncio.Event()
        self.url = ""

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=_ssl_context(self.upstream))
        )
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.forward)
        self.runner = web.AppRunner(app, shutdown_timeout=1)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def forward(self, request: web.Request) -> web.Response:
        if self.stalled and request.method == "PATCH" and "/leases/" in request.path:
            await self.unblock.wait()  # the write never reaches the API server
            return web.Response(status=503)
        async with self.session.request(
            request.method,
            self.upstream.server + request.path_qs,
            data=await request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP},
        ) as response:
            return web.Response(
                status=response.status,
                body=await response.read(),
                content_type=response.content_type,
            )

    async def stop(self) -> None:
        self.unblock.set()
        await self.runner.cleanup()
        await self.session.close()


async def leader_and_standby(cp: ControlPlane, namespace: str) -> tuple[float, float, float]:
    """(last renewal sent, leader gave up, standby took over), monotonic seconds."""
    proxy = SlowProxy(admin_login(cp))
    await proxy.start()
    timing = {
        "lease_duration": LEASE_SECONDS,
        "renew_deadline": RENEW_DEADLINE,
        "retry_period": RETRY_PERIOD,
    }
    slow = KubeClient(lambda: kopf.ConnectionInfo(server=proxy.url))
    fast = KubeClient(lambda: admin_login(cp))
    leader = LeaderElector(slow, namespace=namespace, name="eop", identity="slow", **timing)
    standby = LeaderElector(fast, namespace=namespace, name="eop", identity="standby", **timing)
    try:
        await leader.acquire()
        holding = asyncio.create_task(leader.hold())
        await asyncio.sleep(3 * RETRY_PERIOD)  # a few renewals go through
        assert not holding.done(), "the leader lost the lease while the API server answered"
        proxy.stalled = True
        taking_over = asyncio.create_task(standby.acquire())
        await asyncio.wait_for(asyncio.shield(holding), 40)
        gave_up = time.monotonic()
        await asyncio.wait_for(taking_over, 40)
        took_over = time.monotonic()
        return leader.renewed_at, gave_up, took_over
    finally:
        await proxy.stop()
        await slow.close()
        await fast.close()


def test_a_leader_gives_up_by_its_renew_deadline_when_the_api_server_hangs(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    last_sent, gave_up, took_over = asyncio.run(leader_and_standby(control_plane, kube_namespace))
    # Stopped acting within the renew deadline of the last renewal it sent (not after an HTTP
    # timeout of 30 s), and before the standby took over: no overlap.
    assert gave_up - last_sent <= RENEW_DEADLINE + SLACK, f"held {gave_up - last_sent:.1f}s"
    assert gave_up < took_over, f"two leaders for {gave_up - took_over:.1f}s"
    assert took_over - last_sent >= LEASE_SECONDS
