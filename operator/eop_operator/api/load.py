"""Load manifests into the models, with errors that name the field.

Two doors.  :func:`load_pipeline` is the strict one, for a manifest a user hands
``eop`` (an unknown field is an error that names it).  :func:`load_stored` reads
what the API server stores, which a newer or older operator may have accepted:
it ignores fields this operator does not know (a rolled-back operator reads
objects written for its successor) and ratchets rules, as the API server
ratchets CEL: a spec that an earlier operator accepted and that has not changed
since still loads when a rule it breaks is new, with the broken rules reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from eop_operator import API_VERSIONS, KIND
from eop_operator.api.models import ExactlyOncePipeline, Phase
from eop_spark.contract.spec import RATCHET_KEY

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class InvalidPipeline(ValueError):
    """A manifest that is not a valid ExactlyOncePipeline; the message names each field."""


def describe(error: ValidationError) -> str:
    """One line per problem: ``spec.source.kafka.topics: Field required``."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(root)"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "; ".join(lines)


def plain(value: Any) -> Any:
    """Deep-copy mappings and sequences (e.g. kopf bodies) into plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _check_kind(obj: Mapping[str, Any]) -> None:
    if obj.get("kind", KIND) != KIND or obj.get("apiVersion", API_VERSIONS[0]) not in API_VERSIONS:
        raise InvalidPipeline(
            f"expected apiVersion {' or '.join(API_VERSIONS)} kind {KIND}, "
            f"got {obj.get('apiVersion')} {obj.get('kind')}"
        )


def load_pipeline(obj: Mapping[str, Any]) -> ExactlyOncePipeline:
    """Validate one object (a parsed manifest or a kopf body) into the model, strictly."""
    if not isinstance(obj, dict):
        obj = plain(obj)  # a kopf body is a view of its dict; pydantic wants the dict
    _check_kind(obj)
    try:
        return ExactlyOncePipeline.model_validate(obj)
    except ValidationError as exc:
        raise InvalidPipeline(describe(exc)) from None


@dataclass(frozen=True)
class Lenient(Generic[T]):
    """What a lenient validation made, and what it let pass."""

    value: T
    #: Fields this operator does not know, ignored (``spec.newField``).
    ignored: tuple[str, ...] = ()
    #: The messages of the rules the value breaks, let pass because it was accepted before.
    ratcheted: tuple[str, ...] = ()


def _drop(data: Any, loc: tuple[int | str, ...]) -> bool:
    """Delete the key at ``loc`` from ``data``; False when it is not there.

    Parts of ``loc`` that are no key (the member names pydantic adds inside unions) are
    skipped.
    """
    node = data
    for part in loc[:-1]:
        keyed = isinstance(node, dict) and part in node
        if keyed or (isinstance(node, list) and isinstance(part, int) and part < len(node)):
            node = node[part]
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


def validate_lenient(model: type[M], data: Mapping[str, Any], *, ratchet: bool) -> Lenient[M]:
    """Validate ``data`` into ``model``, ignoring unknown fields; ``ratchet``: rules too.

    Raises :class:`InvalidPipeline` for anything else that does not validate.
    """
    data = plain(data)  # a copy: unknown fields are removed from it
    ignored: list[str] = []
    while True:
        broken: list[str] = []
        try:
            value = model.model_validate(data, context={RATCHET_KEY: broken} if ratchet else None)
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            dropped = [loc for loc in unknown if _drop(data, loc)]
            if not dropped:
                raise InvalidPipeline(describe(exc)) from None
            ignored += [".".join(str(part) for part in loc) for loc in dropped]
            continue
        return Lenient(value, tuple(ignored), tuple(broken))


def accepted_unchanged(obj: Mapping[str, Any]) -> bool:
    """Whether an operator accepted this object's spec and the spec has not changed since.

    The API server bumps ``metadata.generation`` on every change of the spec; an operator
    that accepted a generation records it as ``status.observedGeneration`` with a phase
    other than ``Invalid``.
    """
    status = obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    return (
        generation is not None
        and status.get("observedGeneration") == generation
        and status.get("phase") not in (None, Phase.INVALID.value)
    )


def load_stored(obj: Mapping[str, Any]) -> Lenient[ExactlyOncePipeline]:
    """Validate a pipeline as the API server stores it (a kopf body), leniently.

    Fields this operator does not know are ignored, in the spec and the status; rules
    the spec breaks are let pass when :func:`accepted_unchanged` (they came with a newer
    operator, or were tightened since it was accepted).  Anything else raises
    :class:`InvalidPipeline`, as :func:`load_pipeline` does.
    """
    _check_kind(obj)
    return validate_lenient(ExactlyOncePipeline, obj, ratchet=accepted_unchanged(obj))


def load_last_stable(obj: Mapping[str, Any]) -> ExactlyOncePipeline:
    """The pipeline as it last ran healthily: its ``status.lastStableSpec`` as its spec.

    Read leniently and ratcheted, as :func:`load_stored` reads an accepted spec.  Raises
    :class:`InvalidPipeline` when no spec ran healthily yet, or the recorded one no longer
    loads even so.
    """
    _check_kind(obj)
    data = plain(obj)
    stable = (data.get("status") or {}).get("lastStableSpec")
    if not isinstance(stable, dict):
        raise InvalidPipeline("status.lastStableSpec: no spec has run healthily yet")
    return validate_lenient(ExactlyOncePipeline, {**data, "spec": stable}, ratchet=True).value


def load_pipeline_file(path: Path) -> ExactlyOncePipeline:
    """Read and validate a manifest file holding one ExactlyOncePipeline."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidPipeline(f"{path}: {exc}") from None
    pipelines = [d for d in documents if isinstance(d, dict) and d.get("kind") == KIND]
    if len(pipelines) != 1:
        raise InvalidPipeline(f"{path}: expected one {KIND}, found {len(pipelines)}")
    try:
        return load_pipeline(pipelines[0])
    except InvalidPipeline as exc:
        raise InvalidPipeline(f"{path}: {exc}") from None
