"""A JSON merge patch applied as the API server applies it (RFC 7386), for the tests."""

from __future__ import annotations

from typing import Any


def merged(target: Any, patch: Any) -> Any:
    """``target`` after the merge patch ``patch``: None removes a key, objects merge."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result
