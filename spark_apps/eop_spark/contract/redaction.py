"""Redaction of Secret values from messages, in the forms they take on their way there.

A Secret value reaches an error message as it is, or encoded by whatever carried it: base64
(a Kubernetes Secret's ``data``, an HTTP Basic header, a SASL token: also in the middle
of a longer base64 text, whatever its alignment there), URL-encoded (a connection URL or
query string) or JSON-escaped (a config echoed as JSON, itself possibly inside JSON).
:class:`Redactor` replaces each of these forms by ``***``; the runner applies it to its
termination message, the operator to every message of a health check (status and events).
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

#: What a Secret value becomes in a redacted message.
MASK = "***"
#: Values (and base64 fragments) shorter than this are not redacted: they would match
#: everywhere, and a real secret is longer.
MIN_REDACTED = 4
#: A base64 fragment of a value met inside a longer base64 text is redacted from this
#: length on: a shorter one would match unrelated base64.
MIN_FRAGMENT = 8


def _base64_forms(raw: bytes) -> set[str]:
    """The value's base64 (standard and URL-safe alphabets), whole and, at each of the three
    alignments it may have inside a longer encoded text, the characters only it decides."""
    forms = {base64.b64encode(raw).decode(), base64.b64encode(raw).decode().rstrip("=")}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw + b"\0\0").decode()
        # Character i holds bits [6i, 6i+6); the value's bytes are bits [8*shift, 8*(shift+n)).
        start, end = -(-8 * shift // 6), 8 * (shift + len(raw)) // 6
        if end - start >= MIN_FRAGMENT:
            forms.add(encoded[start:end])
    return forms | {f.replace("+", "-").replace("/", "_") for f in forms}


def encoded_forms(value: str) -> set[str]:
    """``value`` and its base64, URL-encoded and JSON-escaped forms (each form once)."""
    escaped = json.dumps(value)[1:-1]
    forms = {
        value,
        escaped,
        json.dumps(value, ensure_ascii=False)[1:-1],
        json.dumps(escaped)[1:-1],  # JSON in a JSON string
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value),
        urllib.parse.quote_plus(value),
    }
    forms |= _base64_forms(value.encode())
    return {f for f in forms if len(f) >= MIN_REDACTED}


@dataclass(frozen=True)
class Redactor:
    """Replaces every Secret value given, in every form of :func:`encoded_forms`, by ``***``."""

    secrets: tuple[str, ...] = ()
    _forms: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        forms = {f for s in self.secrets if len(s) >= MIN_REDACTED for f in encoded_forms(s)}
        # The longest first: a value's form never leaves a part of a longer form behind.
        object.__setattr__(self, "_forms", tuple(sorted(forms, key=len, reverse=True)))

    @classmethod
    def of(cls, *secrets: Iterable[str]) -> Redactor:
        """A redactor of the values of several Secrets (each an iterable of values)."""
        return cls(tuple(v for values in secrets for v in values))

    def redact(self, message: str) -> str:
        """``message`` with every form of every Secret value replaced by ``***``."""
        for form in self._forms:
            message = message.replace(form, MASK)
        return message
