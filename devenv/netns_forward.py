"""Forward TCP connections between two network namespaces: the host's and the cluster's.

The multi-node local cluster lives in network namespaces of its own (:mod:`devenv.podnet`).
This process, a child of its supervisor, joins the two worlds without an interface, route or
firewall rule in the machine's namespace: it holds listening sockets in one namespace and opens
the matching connections in the other (a socket stays in the namespace it was made in, so one
thread switches with ``setns`` before making each socket).

::

    python -m devenv.netns_forward --host-netns-fd FD --rules DIR --status FILE

It starts in the cluster's namespace; ``FD`` (inherited) is the host's. Each ``DIR/*.json``
is one forward::

    {"listen": {"netns": "host", "host": "127.0.0.1", "port": 40123},
     "target": {"netns": "cluster", "host": "127.0.0.1", "port": 40123}}

``netns`` is ``host`` or ``cluster``. ``DIR`` is read again every half second: a new file
opens its listener, a removed one closes it (open connections go on). ``FILE`` (JSON) lists
each forward by file name with ``listening: true`` or its ``error``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devenv.podnet import setns

__all__ = ["Endpoint", "Forward", "main", "read_forward"]

log = logging.getLogger("netns-forward")

_NAMESPACES = ("host", "cluster")


@dataclass(frozen=True)
class Endpoint:
    """An address in one of the two namespaces."""

    netns: str
    host: str
    port: int

    def to_json(self) -> dict[str, Any]:
        """The JSON form used in rule files."""
        return {"netns": self.netns, "host": self.host, "port": self.port}


@dataclass(frozen=True)
class Forward:
    """Connections to ``listen`` are forwarded to ``target``."""

    listen: Endpoint
    target: Endpoint

    def to_json(self) -> dict[str, Any]:
        """The JSON form of a rule file."""
        return {"listen": self.listen.to_json(), "target": self.target.to_json()}


def read_forward(data: dict[str, Any]) -> Forward:
    """Parse a rule file's content; ValueError names the bad field."""
    ends = []
    for key in ("listen", "target"):
        end = data.get(key)
        if not isinstance(end, dict):
            raise ValueError(f"{key}: an object with netns, host, port")
        if end.get("netns") not in _NAMESPACES:
            raise ValueError(f"{key}.netns: one of {_NAMESPACES}, not {end.get('netns')!r}")
        port = end.get("port")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"{key}.port: 1..65535, not {port!r}")
        ends.append(Endpoint(end["netns"], str(end.get("host", "127.0.0.1")), port))
    return Forward(ends[0], ends[1])


class _Forwarder:
    def __init__(self, host_fd: int, rules: Path, status: Path) -> None:
        self.fds = {"host": host_fd, "cluster": os.open("/proc/self/ns/net", os.O_RDONLY)}
        self.rules = rules
        self.status = status
        self.servers: dict[str, tuple[Forward, asyncio.Server]] = {}
        self.errors: dict[str, str] = {}

    def _socket(self, netns: str) -> socket.socket:
        """A TCP socket made in ``netns`` (it stays there whatever the thread does next)."""
        setns(self.fds[netns])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock

    async def _handle(
        self, forward: Forward, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        target = forward.target
        sock = self._socket(target.netns)
        try:
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_connect(sock, (target.host, target.port)), 10)
            t_reader, t_writer = await asyncio.open_connection(sock=sock)
        except (OSError, TimeoutError) as exc:
            log.warning("%s -> %s: %s", forward.listen, target, exc)
            sock.close()
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, t_writer), _pipe(t_reader, writer))
        finally:
            t_writer.close()
            writer.close()

    async def _open(self, name: str, forward: Forward) -> None:
        sock = self._socket(forward.listen.netns)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((forward.listen.host, forward.listen.port))
            sock.listen(128)
            server = await asyncio.start_server(lambda r, w: self._handle(forward, r, w), sock=sock)
        except OSError as exc:
            sock.close()
            self.errors[name] = str(exc)
            return
        self.servers[name] = (forward, server)
        self.errors.pop(name, None)
        log.info("%s: %s -> %s", name, forward.listen, forward.target)

    async def _sync(self) -> None:
        wanted: dict[str, Forward] = {}
        for path in sorted(self.rules.glob("*.json")):
            try:
                wanted[path.stem] = read_forward(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                self.errors[path.stem] = f"bad rule: {exc}"
        for name in list(self.servers):
            if wanted.get(name) != self.servers[name][0]:
                _, server = self.servers.pop(name)
                server.close()
                log.info("%s: closed", name)
        for name, forward in wanted.items():
            if name not in self.servers:
                await self._open(name, forward)
        for name in list(self.errors):
            if name not in wanted:
                del self.errors[name]
        status = {
            name: {**forward.to_json(), "listening": True}
            for name, (forward, _) in self.servers.items()
        }
        status.update({name: {"error": err} for name, err in self.errors.items()})
        text = json.dumps({"pid": os.getpid(), "forwards": status}, indent=2, sort_keys=True)
        if not self.status.exists() or self.status.read_text() != text:
            tmp = self.status.with_name(self.status.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(self.status)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._sync()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        for _, server in self.servers.values():
            server.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close ``writer`` (the other direction may go on)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        else:
            writer.close()
    except (OSError, ConnectionError):
        writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m devenv.netns_forward")
    parser.add_argument("--host-netns-fd", type=int, required=True)
    parser.add_argument("--rules", type=Path, required=True, help="directory of *.json rules")
    parser.add_argument("--status", type=Path, required=True, help="status file (JSON)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args.rules.mkdir(parents=True, exist_ok=True)
    forwarder = _Forwarder(args.host_netns_fd, args.rules, args.status)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await forwarder.run(stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
