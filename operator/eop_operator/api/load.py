"""Load manifests into the models, with errors that name the field."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from eop_operator import API_VERSION, KIND
from eop_operator.api.models import ExactlyOncePipeline


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


def load_pipeline(obj: Mapping[str, Any]) -> ExactlyOncePipeline:
    """Validate one object (a parsed manifest or a kopf body) into the model."""
    if not isinstance(obj, dict):
        obj = plain(obj)  # a kopf body is a view of its dict; pydantic wants the dict
    if obj.get("kind", KIND) != KIND or obj.get("apiVersion", API_VERSION) != API_VERSION:
        raise InvalidPipeline(
            f"expected apiVersion {API_VERSION} kind {KIND}, "
            f"got {obj.get('apiVersion')} {obj.get('kind')}"
        )
    try:
        return ExactlyOncePipeline.model_validate(obj)
    except ValidationError as exc:
        raise InvalidPipeline(describe(exc)) from None


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
