"""A real S3-compatible object store (SeaweedFS's ``weed``) for tests and humans.

``weed`` is built from its Go module by ``devenv/build-tools.sh seaweedfs`` (cached under
``$EOP_CACHE/seaweedfs/<version>/bin/weed``). :class:`S3Server` runs one ``weed server`` (master,
volume server, filer and S3 gateway in one process) in a work directory, on free ports of one
address (127.0.0.1 unless told otherwise), with one identity whose access and secret key it
makes up and writes into the S3 identities file. Anonymous requests are refused; telemetry is
off. The helpers below talk to it through its own S3 API (AWS Signature Version 4, standard
library only), as any S3 client would.

Usage::

    with S3Server(work_dir) as s3:
        s3.create_bucket("checkpoints")
        spark_conf = {f"spark.hadoop.{k}": v for k, v in s3.hadoop_options().items()}
        env = s3.credentials_env()        # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
        s3.list_keys("checkpoints", "pipeline/")

For a shell: ``python -m devenv.s3 up --dir /tmp/s3 [--bucket NAME] [--host ADDRESS]`` prints
the endpoint, the keys and the ``checkpoint.options`` to use, and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import hmac
import json
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

from devenv.processes import (
    Service,
    distinct_free_ports,
    log_tail,
    serve_until_stopped,
    spawn_logged,
    stop_on_signals,
)
from devenv.versions import cache_root, versions

BUILD_SCRIPT = Path(__file__).with_name("build-tools.sh")
FETCH_SCRIPT = Path(__file__).with_name("fetch-jars.sh")
#: The region the server answers to; S3A signs for it (``fs.s3a.endpoint.region``).
REGION = "us-east-1"
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
#: The ports of one ``weed server``, in the order they are picked.
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)


class S3ServerError(RuntimeError):
    """The server could not be built or started, or an S3 request failed."""


def weed_binary() -> Path:
    """The ``weed`` binary of the pinned SeaweedFS version, built if needed."""
    version = versions()["SEAWEEDFS_MODULE_VERSION"]
    binary = cache_root() / "seaweedfs" / version / "bin" / "weed"
    if not binary.exists():
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), "seaweedfs"], check=False)
        if proc.returncode != 0 or not binary.exists():
            raise S3ServerError(f"building SeaweedFS failed: bash {BUILD_SCRIPT} seaweedfs")
    return binary


def s3a_jars() -> list[Path]:
    """Hadoop's S3A connector jars for Spark (``devenv/fetch-jars.sh s3a``), fetched if needed."""
    proc = subprocess.run(
        ["bash", str(FETCH_SCRIPT), "s3a"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise S3ServerError(f"fetching the S3A jars failed:\n{proc.stderr[-3000:]}")
    jars = sorted(Path(proc.stdout.strip().splitlines()[-1]).glob("*.jar"))
    if not jars:
        raise S3ServerError("the S3A jar directory is empty")
    return jars


class S3Server(Service):
    """One SeaweedFS server with its S3 gateway, in ``work_dir``, on free ports of ``host``.

    The ports and keys are chosen at the first :meth:`start` and kept in the work directory:
    after :meth:`stop`, a new :meth:`start` brings the same store (same data, same endpoint,
    same keys) back.
    """

    def __init__(
        self, work_dir: Path | str, *, host: str = "127.0.0.1", start_timeout: float = 90.0
    ) -> None:
        """Describe a server; nothing runs until :meth:`start`.

        ``host``: the address every port binds to and the endpoint names; 127.0.0.1 unless
        clients in other network namespaces (pods) must reach it.
        """
        self.work_dir = Path(work_dir).resolve()
        self.host = host
        self.start_timeout = start_timeout
        self._ports: dict[str, int] = {}
        self._keys: tuple[str, str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- what clients need ----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL, e.g. ``http://127.0.0.1:40123``."""
        return f"http://{self.host}:{self._port('s3.port')}"

    @property
    def access_key(self) -> str:
        """The access key id of the server's one identity."""
        return self._credentials()[0]

    @property
    def secret_key(self) -> str:
        """The secret access key of the server's one identity."""
        return self._credentials()[1]

    def credentials_env(self) -> dict[str, str]:
        """The identity as the AWS SDK's environment variables (what S3A's default chain reads)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def hadoop_options(self) -> dict[str, str]:
        """The non-secret S3A settings for this server: a pipeline's ``checkpoint.options``."""
        return {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
        }

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.work_dir / "weed.log"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def _port(self, name: str) -> int:
        if name not in self._ports:
            raise S3ServerError("the server has not been started")
        return self._ports[name]

    def _credentials(self) -> tuple[str, str]:
        if self._keys is None:
            raise S3ServerError("the server has not been started")
        return self._keys

    # -- life cycle -----------------------------------------------------------------------------

    def _state_file(self) -> Path:
        return self.work_dir / "server.json"

    def _load_or_choose(self) -> None:
        state = self._state_file()
        if state.exists():
            saved = json.loads(state.read_text())
            self._ports = {k: int(v) for k, v in saved["ports"].items()}
            self._keys = (saved["accessKey"], saved["secretKey"])
            return
        self._ports = dict(zip(_PORTS, distinct_free_ports(len(_PORTS)), strict=True))
        self._keys = (f"EOP{secrets.token_hex(8).upper()}", secrets.token_urlsafe(30))
        state.write_text(
            json.dumps(
                {"ports": self._ports, "accessKey": self._keys[0], "secretKey": self._keys[1]}
            )
        )

    def _identities(self) -> Path:
        """The S3 identities file: one identity with every permission, no anonymous access."""
        access, secret = self._credentials()
        config = {
            "identities": [
                {
                    "name": "eop",
                    "credentials": [{"accessKey": access, "secretKey": secret}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        path = self.work_dir / "s3-identities.json"
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    def _argv(self, binary: Path) -> list[str]:
        data = self.work_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        return [
            str(binary),
            "server",
            f"-dir={data}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-filer",
            "-s3",
            f"-s3.config={self._identities()}",
            *(f"-{name}={port}" for name, port in self._ports.items()),
            # Off: the catalog endpoints (fixed default ports), telemetry (sent to the
            # internet) and a sockets in /tmp shared by every server on the machine.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-filer.localSocket={self.work_dir / 'filer.sock'}",
            f"-s3.localSocket={self.work_dir / 's3.sock'}",
            # Small volumes: a test store holds megabytes, each bucket grows its own volumes
            # (sparse files), and each volume is a file.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=200",
        ]

    def start(self) -> Self:
        """Start the server; return once an object can be written and read back.

        Raises :class:`S3ServerError`, with the tail of the log, if it is not ready within
        ``start_timeout`` seconds.
        """
        if self.running:
            return self
        binary = weed_binary()  # built before the clock starts
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._load_or_choose()
        self._proc, self._log = spawn_logged(
            self._argv(binary), self.log_path, cwd=self.work_dir, new_session=True
        )
        try:
            self._wait_ready(time.monotonic() + self.start_timeout)
        except BaseException as exc:
            self.kill()
            if isinstance(exc, S3ServerError):
                raise S3ServerError(
                    f"{exc}\n--- tail of {self.log_path} ---\n{log_tail(self.log_path, 60)}"
                ) from None
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        """Until a probe object round-trips (the first write also grows the first volumes)."""
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.running:
                raise S3ServerError("weed exited during start-up")
            try:
                self.create_bucket("eop-ready")
                self.put_object("eop-ready", "probe", b"ok")
                if self.get_object("eop-ready", "probe") == b"ok":
                    return
            except (OSError, S3ServerError) as exc:
                last = str(exc)
            time.sleep(0.5)
        raise S3ServerError(f"S3 gateway not ready at {self.endpoint}: {last}")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout``.

        ``weed server`` flushes what it stores as it goes; its graceful shutdown then waits
        on its own components for longer than a test should (20 s and more here).
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def kill(self) -> None:
        """SIGKILL the server. :meth:`start` restarts it with its data."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(30)
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
        self._proc, self._log = None, None

    # -- the S3 API -----------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: bytes = b"",
        ok: Sequence[int] = (200, 204),
    ) -> tuple[int, bytes]:
        """One request signed with AWS Signature Version 4; the status and the body.

        ``path`` is ``/bucket`` or ``/bucket/key`` (path-style). A status outside ``ok``
        raises :class:`S3ServerError` with the server's answer.
        """
        url, headers = sign_v4(
            method,
            self.endpoint,
            path,
            dict(query or {}),
            body,
            access_key=self.access_key,
            secret_key=self.secret_key,
        )
        req = urllib.request.Request(url, data=body or None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as answer:
                status, data = answer.status, answer.read()
        except urllib.error.HTTPError as err:
            status, data = err.code, err.read()
        if status not in ok:
            raise S3ServerError(f"{method} {path}: HTTP {status} {data[:500]!r}")
        return status, data

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (no error if this identity already owns it)."""
        self.request("PUT", f"/{bucket}", ok=(200, 409))

    def delete_bucket(self, bucket: str) -> None:
        """Delete ``bucket`` with everything in it."""
        self.delete_prefix(bucket, "")
        self.request("DELETE", f"/{bucket}", ok=(200, 204, 404))

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        """Write one object."""
        self.request("PUT", f"/{bucket}/{_quote(key)}", body=data)

    def get_object(self, bucket: str, key: str) -> bytes | None:
        """One object's content, or None if there is no such object."""
        status, data = self.request("GET", f"/{bucket}/{_quote(key)}", ok=(200, 404))
        return data if status == 200 else None

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` in ``bucket``, sorted (ListObjectsV2, all pages)."""
        keys: list[str] = []
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            _, data = self.request("GET", f"/{bucket}", query=query)
            root = ElementTree.fromstring(data)
            keys += [e.text or "" for e in root.iter(f"{_S3_NS}Key")]
            token = root.findtext(f"{_S3_NS}NextContinuationToken")
            if root.findtext(f"{_S3_NS}IsTruncated") != "true" or not token:
                return sorted(keys)

    def delete_prefix(self, bucket: str, prefix: str) -> int:
        """Delete every object under ``prefix``; the number deleted."""
        keys = self.list_keys(bucket, prefix)
        for key in keys:
            self.request("DELETE", f"/{bucket}/{_quote(key)}")
        return len(keys)


def _quote(key: str) -> str:
    return urllib.parse.quote(key, safe="/~")


def sign_v4(
    method: str,
    endpoint: str,
    path: str,
    query: dict[str, str],
    body: bytes,
    *,
    access_key: str,
    secret_key: str,
    region: str = REGION,
    now: datetime.datetime | None = None,
) -> tuple[str, dict[str, str]]:
    """The URL and headers of an S3 request signed with AWS Signature Version 4 (header form)."""
    now = now or datetime.datetime.now(datetime.UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = urllib.parse.urlsplit(endpoint).netloc
    payload = hashlib.sha256(body).hexdigest()
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(query.items())
    )
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [
            method,
            path or "/",
            canonical_query,
            "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
            signed,
            payload,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    url = f"{endpoint}{path}" + (f"?{canonical_query}" if canonical_query else "")
    return url, headers


def _up(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m devenv.s3")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the S3 server and run until SIGINT/SIGTERM")
    up.add_argument("--dir", required=True, type=Path, help="work dir (data, keys, log)")
    up.add_argument("--bucket", action="append", default=[], help="create this bucket (repeat)")
    up.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    sub.add_parser("build", help="build weed and fetch the S3A jars; print their paths")
    args = parser.parse_args(argv)

    if args.command == "build":
        print(weed_binary())
        for jar in s3a_jars():
            print(jar)
        return 0

    stop = stop_on_signals()
    started = time.monotonic()
    server = S3Server(args.dir, host=args.host).start()
    try:
        for bucket in args.bucket:
            server.create_bucket(bucket)
        options = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in server.hadoop_options().items())
        print(
            f"SeaweedFS {versions()['SEAWEEDFS_MODULE_VERSION']} up in "
            f"{time.monotonic() - started:.1f}s\n"
            f"S3 endpoint: {server.endpoint} (region {REGION}, path-style)\n"
            f"AWS_ACCESS_KEY_ID={server.access_key}\n"
            f"AWS_SECRET_ACCESS_KEY={server.secret_key}\n"
            f"buckets: {', '.join(args.bucket) or '(none; --bucket NAME)'}\n"
            f"checkpoint:\n  options:\n{options}\n"
            f"log: {server.log_path}\n"
            "Ctrl-C to stop.",
            flush=True,
        )
        if not serve_until_stopped(stop, lambda: server.running):
            print(f"the server exited; see {server.log_path}", file=sys.stderr)
            return 1
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: ``python -m devenv.s3 up --dir DIR``."""
    return _up(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
