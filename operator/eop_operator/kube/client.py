"""A small async Kubernetes client for the few kinds the operator manages.

Why not the ``kubernetes`` package's client here: every reconcile applies
five to eight objects, and server-side apply of plain dicts over kopf's own
aiohttp stack costs one request per object with no model (de)serialisation
and no blocking thread.  Credentials come from kopf's login
(``kopf.ConnectionInfo``: kubeconfig or in-cluster service account), so the
operator authenticates the same way for watching and for writing.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import logging
import os
import random
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

FIELD_MANAGER = "eop-operator"
#: Connections to the API server at most: a burst of pipelines queues its requests here
#: rather than opening (and TLS-handshaking) a hundred connections.
CONNECTIONS = 16
#: Seconds one request to the API server may take, answer included (``--api-timeout``).
REQUEST_TIMEOUT_S = 30.0

#: (apiVersion, kind) -> (URL prefix, plural).  Only what the operator touches.
_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "PersistentVolumeClaim"): ("/api/v1", "persistentvolumeclaims"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "ServiceAccount"): ("/api/v1", "serviceaccounts"),
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("v1", "Event"): ("/api/v1", "events"),
    # Read only: the Kafka Secret a pipeline references (health checks read its offsets).
    ("v1", "Secret"): ("/api/v1", "secrets"),
    # Leader election of operator replicas.
    ("coordination.k8s.io/v1", "Lease"): ("/apis/coordination.k8s.io/v1", "leases"),
    ("apps/v1", "StatefulSet"): ("/apis/apps/v1", "statefulsets"),
    # Created and read only: the Job that deletes a checkpoint in object storage.
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("rbac.authorization.k8s.io/v1", "Role"): ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1",
        "rolebindings",
    ),
    ("exactlyonce.io/v1alpha1", "ExactlyOncePipeline"): (
        "/apis/exactlyonce.io/v1alpha1",
        "exactlyoncepipelines",
    ),
}


#: Statuses that say "not now" rather than "no": throttled (429) or a failing server.
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})

log = logging.getLogger(__name__)


class KubeError(RuntimeError):
    """The API server refused a request; ``status`` is its HTTP status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeUnavailable(KubeError):
    """The API server stayed throttling, failing or unreachable through every attempt.

    ``status`` is the last HTTP status, 0 when the last attempt got no response.
    """


@dataclass(frozen=True)
class RetryPolicy:
    """How a request is retried when the API server throttles, fails or drops it.

    The delay before attempt n+1 is the server's ``Retry-After`` when it sends one
    (at most ``max_delay_s``), else ``base_delay_s * 2**(n-1)`` with jitter, capped too.
    """

    attempts: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 10.0

    def delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        hinted = parse_retry_after(retry_after)
        if hinted is not None:
            return min(hinted, self.max_delay_s)
        backoff = self.base_delay_s * 2 ** (attempt - 1)
        return float(min(backoff * random.uniform(0.5, 1.0), self.max_delay_s))


def _retryable(method: str, status: int) -> bool:
    """Whether to try a request again after ``status`` (0: no connection was made)."""
    if status in (0, 429):  # never reached the server, or refused before acting
        return True
    return status in RETRIED_STATUSES and method != "POST"  # a POST may have been acted on


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is the API server or the network failing for a while (no answer, a
    conflict, throttling, a 5xx), which the next try may not meet, rather than an error that
    repeats until something changes."""
    if isinstance(exc, KubeError):
        return exc.status in (0, 409) or exc.status in RETRIED_STATUSES
    return isinstance(exc, aiohttp.ClientError | OSError)


def parse_retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date); None if absent."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def object_path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The REST path of a namespaced object (or of its collection when name is None)."""
    try:
        prefix, plural = _KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"eop's client does not manage {kind} {api_version}") from None
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


def _pem(data: str | bytes) -> bytes:
    """Kubeconfig ``*-data`` fields are base64 of PEM; accept PEM as well."""
    raw = data.encode() if isinstance(data, str) else data
    return raw if raw.lstrip().startswith(b"-----") else base64.b64decode(raw)


def _load_client_certificate(
    context: ssl.SSLContext, certificate: str | bytes, private_key: str | bytes
) -> None:
    """Load a client certificate given as data: ssl reads them only from files.

    The files live in a directory only this process's user can read, and only
    while ssl reads them: no copy of the private key stays on disk.
    """
    with tempfile.TemporaryDirectory(prefix="eop-tls-") as folder:
        cert, key = os.path.join(folder, "tls.crt"), os.path.join(folder, "tls.key")
        for path, data in ((cert, certificate), (key, private_key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as handle:
                handle.write(_pem(data))
        context.load_cert_chain(cert, key)


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext:
    """TLS settings from kopf's connection info: CA, client certificate, insecure flag."""
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=os.fsdecode(info.ca_path))
    elif info.ca_data:
        context.load_verify_locations(cadata=_pem(info.ca_data).decode())
    if info.certificate_data and info.private_key_data:
        _load_client_certificate(context, info.certificate_data, info.private_key_data)
    elif info.certificate_path and info.private_key_path:
        context.load_cert_chain(
            os.fsdecode(info.certificate_path), os.fsdecode(info.private_key_path)
        )
    if info.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class KubeClient:
    """Apply, read, patch and delete namespaced objects with kopf's credentials."""

    def __init__(
        self,
        login: Callable[[], kopf.ConnectionInfo],
        retry: RetryPolicy | None = None,
        timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._login = login
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._server = ""

    def _open(self) -> aiohttp.ClientSession:
        info = self._login()
        context = _ssl_context(info)
        # The audit log and API server metrics name the operator as its field manager.
        headers = {"Accept": "application/json", "User-Agent": FIELD_MANAGER}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        self._server = info.server.rstrip("/")
        return aiohttp.ClientSession(
            headers=headers,
            connector=aiohttp.TCPConnector(ssl=context, limit=CONNECTIONS),
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """One request, retried while the server throttles (429), fails (5xx) or drops it.

        A POST is retried only when the server cannot have acted on it: a 429, or no
        connection at all; a request that timed out is not retried.  After
        ``retry.attempts`` attempts: :class:`KubeUnavailable`.
        """
        logged_in = False
        attempt = 0
        while True:
            attempt += 1
            retry_after: str | None = None
            try:
                status, payload, retry_after = await self._send(
                    method, path, body=body, content_type=content_type, params=params
                )
            except aiohttp.ClientConnectorError as exc:
                status, payload = 0, f"cannot connect: {exc}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                # A POST may have been acted on: not ours to repeat.  A request that timed
                # out already waited the whole timeout: the caller's next look comes sooner.
                if method == "POST" or isinstance(exc, TimeoutError):
                    raise KubeUnavailable(0, f"{method} {path}: no response: {exc!r}") from exc
                status, payload = 0, f"no response: {exc!r}"
            if status == 401 and not logged_in:
                # Bound service-account tokens rotate: log in again once.
                logged_in = True
                await self.close()
                attempt -= 1
                continue
            if status == 404 and method in ("GET", "DELETE"):
                return None
            if isinstance(payload, dict) and status < 400:
                return payload
            message = str(payload.get("message", payload) if isinstance(payload, dict) else payload)
            if not _retryable(method, status):
                raise KubeError(status, message)
            if attempt >= self.retry.attempts:
                raise KubeUnavailable(
                    status, f"{method} {path}: gave up after {attempt} attempts, last: {message}"
                )
            delay = self.retry.delay(attempt, retry_after)
            log.info(
                "API server %s on %s %s (attempt %d/%d); retrying in %.1fs",
                status or "unreachable", method, path, attempt, self.retry.attempts, delay,
            )  # fmt: skip
            if status == 0:
                await self.close()  # a dropped connection may leave the pool broken
            await asyncio.sleep(delay)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any,
        content_type: str,
        params: dict[str, str] | None,
    ) -> tuple[int, dict[str, Any] | str, str | None]:
        """One attempt: the status, the JSON body (or the raw text) and any Retry-After."""
        if self._session is None:
            self._session = self._open()
        async with self._session.request(
            method,
            self._server + path,
            json=body,
            params=params,
            headers={"Content-Type": content_type},
        ) as response:
            text = await response.text()
            try:
                payload: dict[str, Any] | str = json.loads(text) if text else {}
            except ValueError:
                payload = text[:200]  # a proxy's HTML error page, say
            return response.status, payload, response.headers.get("Retry-After")

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` (force: the operator owns the fields it renders)."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        result = await self._request(
            "PATCH",
            path,
            body=obj,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        assert result is not None
        return result

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create a namespaced object (``metadata.generateName`` works here)."""
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        result = await self._request("POST", path, body=obj)
        assert result is not None
        return result

    async def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        """Read an object; None when it does not exist."""
        return await self._request("GET", object_path(api_version, kind, namespace, name))

    async def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[dict[str, Any]]:
        """The objects of a kind in a namespace that match a label and a field selector."""
        params = {"labelSelector": label_selector, "fieldSelector": field_selector}
        result = await self._request(
            "GET",
            object_path(api_version, kind, namespace),
            params={k: v for k, v in params.items() if v},
        )
        return list((result or {}).get("items", []))

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """JSON merge patch of an object (or of its status subresource)."""
        path = object_path(api_version, kind, namespace, name)
        if subresource:
            path = f"{path}/{subresource}"
        result = await self._request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )
        assert result is not None
        return result

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        """Delete an object, in the background; a missing object is not an error."""
        await self._request(
            "DELETE",
            object_path(api_version, kind, namespace, name),
            body={"propagationPolicy": "Background"},
        )

    async def close(self) -> None:
        """Close the HTTP session (a new one opens on the next request)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
