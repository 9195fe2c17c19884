"""The operator's Kubernetes client: TLS settings from kopf's connection info, and the
retries of a throttled, failing or unreachable API server (a real HTTP server on loopback)."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import ssl
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import kopf
import pytest

from eop_operator.kube.client import (
    KubeClient,
    KubeError,
    KubeUnavailable,
    RetryPolicy,
    _ssl_context,
)


@pytest.fixture
def client_pem(tmp_path: Path) -> tuple[bytes, bytes]:
    """A self-signed client certificate and its key, as PEM."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=eop-test", "-keyout", "key.pem", "-out", "cert.pem",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )  # fmt: skip
    return (tmp_path / "cert.pem").read_bytes(), (tmp_path / "key.pem").read_bytes()


def info(certificate: bytes, key: bytes) -> kopf.ConnectionInfo:
    """Connection info with the client certificate inline, as a kubeconfig's *-data fields."""
    return kopf.ConnectionInfo(
        server="https://127.0.0.1:6443",
        certificate_data=base64.b64encode(certificate),
        private_key_data=base64.b64encode(key),
    )


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory Python's tempfile uses, empty and private to the test."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def test_inline_client_key_leaves_no_file_behind(
    client_pem: tuple[bytes, bytes], temp_dir: Path
) -> None:
    certificate, key = client_pem
    context = _ssl_context(info(certificate, key))
    assert isinstance(context, ssl.SSLContext)
    assert list(temp_dir.iterdir()) == []


def test_mismatched_client_key_is_refused_and_leaves_no_file_behind(
    client_pem: tuple[bytes, bytes], tmp_path: Path, temp_dir: Path
) -> None:
    certificate, _ = client_pem
    subprocess.run(
        ["openssl", "genrsa", "-out", "other.pem", "2048"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    with pytest.raises(ssl.SSLError):
        _ssl_context(info(certificate, (tmp_path / "other.pem").read_bytes()))
    assert list(temp_dir.iterdir()) == []


class FlakyApiServer:
    """An HTTP server on loopback answering each request with the next scripted reply.

    A reply is ``(status, headers)`` (with a small JSON Status body), or ``RESET``:
    the connection is dropped without a response.  The last reply repeats.
    """

    RESET = None

    def __init__(self, replies: list[tuple[int, dict[str, str]] | None]) -> None:
        self.replies = replies
        #: When each request arrived (monotonic seconds).
        self.arrivals: list[float] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer the requests of one connection."""
        while await reader.readuntil(b"\r\n\r\n"):
            self.arrivals.append(time.monotonic())
            reply = self.replies[min(len(self.arrivals), len(self.replies)) - 1]
            if reply is self.RESET:
                writer.transport.abort()
                return
            status, headers = reply
            body = json.dumps({"kind": "Status", "message": f"scripted {status}"}).encode()
            head = [f"HTTP/1.1 {status} Scripted", f"Content-Length: {len(body)}"]
            head += [f"{k}: {v}" for k, v in headers.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()

    async def request(self, method: str, retry: RetryPolicy) -> dict[str, Any] | None:
        """One client request against this server, through a fresh client."""
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = KubeClient(lambda: kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"), retry)
        try:
            if method == "POST":
                return await client.create(
                    {"apiVersion": "v1", "kind": "Event", "metadata": {"namespace": "ns"}}
                )
            return await client.get("v1", "ConfigMap", "ns", "cm")
        finally:
            await client.close()
            server.close()


FAST = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=5.0)


def test_throttled_request_waits_as_retry_after_says_then_succeeds() -> None:
    api = FlakyApiServer([(429, {"Retry-After": "1"}), (200, {})])
    assert asyncio.run(api.request("GET", FAST)) == {"kind": "Status", "message": "scripted 200"}
    assert len(api.arrivals) == 2
    assert api.arrivals[1] - api.arrivals[0] >= 0.95  # Retry-After, not the 10 ms back-off


def test_failing_server_is_retried_with_back_off_then_given_up_with_a_clear_error() -> None:
    api = FlakyApiServer([(503, {})])
    with pytest.raises(KubeUnavailable) as failure:
        asyncio.run(api.request("GET", FAST))
    assert failure.value.status == 503
    assert "GET /api/v1/namespaces/ns/configmaps/cm: gave up after 3 attempts" in str(failure.value)
    assert "scripted 503" in str(failure.value)
    assert len(api.arrivals) == 3


# aiohttp itself sends an idempotent request again once on a new connection when the
# first is dropped: each attempt of the client's is up to two requests here.
RESETS_PER_ATTEMPT = 2


def test_dropped_connection_is_retried() -> None:
    resets = [FlakyApiServer.RESET] * (RESETS_PER_ATTEMPT + 1)
    api = FlakyApiServer([*resets, (200, {})])
    assert asyncio.run(api.request("GET", FAST)) is not None
    assert len(api.arrivals) == len(resets) + 1


def test_dropped_connection_through_every_attempt_is_a_kube_error() -> None:
    api = FlakyApiServer([FlakyApiServer.RESET])
    with pytest.raises(KubeUnavailable, match="gave up after 3 attempts, last: no response"):
        asyncio.run(api.request("GET", FAST))
    assert FAST.attempts <= len(api.arrivals) <= FAST.attempts * RESETS_PER_ATTEMPT


def test_a_create_is_retried_when_throttled_but_not_after_a_server_error() -> None:
    throttled = FlakyApiServer([(429, {"Retry-After": "0"}), (201, {})])
    assert asyncio.run(throttled.request("POST", FAST)) is not None
    assert len(throttled.arrivals) == 2
    failing = FlakyApiServer([(500, {})])  # it may have created the object: no second one
    with pytest.raises(KubeError) as failure:
        asyncio.run(failing.request("POST", FAST))
    assert failure.value.status == 500
    assert len(failing.arrivals) == 1


def test_retry_after_as_an_http_date() -> None:
    soon = email.utils.formatdate(time.time() + 3, usegmt=True)
    assert 1.5 < FAST.delay(1, soon) <= 3
    assert FAST.delay(1, "600") == 5.0  # capped
