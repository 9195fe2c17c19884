"""Manifests shared by the operator's unit tests."""

from __future__ import annotations

import copy
from typing import Any

import pytest

BASE_MANIFEST: dict[str, Any] = {
    "apiVersion": "exactlyonce.io/v1alpha1",
    "kind": "ExactlyOncePipeline",
    "metadata": {"name": "clean", "namespace": "ads", "uid": "uid-1", "generation": 1},
    "spec": {
        "source": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topics": ["raw"]}},
        "transform": {"sql": "SELECT key, value FROM source WHERE value IS NOT NULL"},
        "sink": {"kafka": {"bootstrapServers": "127.0.0.1:9092", "topic": "clean"}},
    },
}


@pytest.fixture
def manifest() -> dict[str, Any]:
    """A fresh, valid manifest that a test may modify."""
    return copy.deepcopy(BASE_MANIFEST)
