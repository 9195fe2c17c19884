"""Pinned versions of external components, read from ``versions.env`` (the one source)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

VERSIONS_FILE = Path(__file__).with_name("versions.env")


@cache
def versions() -> dict[str, str]:
    """Return the pinned versions as a mapping, e.g. ``{"KAFKA_VERSION": "4.3.1"}``."""
    pinned: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pinned[key.strip()] = value.strip()
    return pinned


def cache_root() -> Path:
    """Where fetched and built components live: ``$EOP_CACHE`` or ``~/.cache/eop``."""
    return Path(os.environ.get("EOP_CACHE", Path.home() / ".cache" / "eop"))
