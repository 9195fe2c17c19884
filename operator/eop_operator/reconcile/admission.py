"""Admission checks only the operator can make, before anything is created for a pipeline.

One pipeline per Kafka identity, and a Python transform of eop's own package
that exists (:func:`shipped_transform_problem`).

Two pipelines with one transactional id prefix fence each other forever (each
``init_transactions`` aborts the other's open transaction), and two with one
progress group move each other's ground truth.  The API server cannot compare
objects with each other; the operator keeps an index of every identity a
pipeline claims (:func:`claimed_identities`) and refuses the younger of two
claimants (:func:`identity_conflict`) before anything is created for it.  The
older one (creationTimestamp, then namespace and name) is never affected; when
it goes away the younger one proceeds on its next look.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from eop_operator.api.load import InvalidPipeline
from eop_operator.api.models import ExactlyOncePipeline
from eop_operator.api.resolve import Identity
from eop_spark.contract.run_config import (
    default_transactional_id_prefix,
    pipeline_id,
    progress_group,
)


class Claimant(NamedTuple):
    """A pipeline holding an identity, ordered oldest first."""

    created: str
    namespace: str
    name: str

    @property
    def label(self) -> str:
        """``namespace/name``, as kubectl names objects."""
        return f"{self.namespace}/{self.name}"


class IdentityTaken(InvalidPipeline):
    """Another, older pipeline holds this pipeline's transactional id prefix or progress group."""


def _mapping(body: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = body.get(key)
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def claimed_identity(body: Mapping[str, Any]) -> Identity | None:
    """The identity a pipeline object holds, read tolerantly from its raw body.

    The recorded identity (status) wins, as in ``resolve_identity``; an object
    whose spec is invalid still holds the identity it asks for.
    """
    metadata, spec, status = (_mapping(body, key) for key in ("metadata", "spec", "status"))
    namespace, name = _text(metadata.get("namespace")), _text(metadata.get("name"))
    if namespace is None or name is None:
        return None
    transactions = spec.get("transactions")
    wanted = _text(transactions.get("idPrefix")) if isinstance(transactions, Mapping) else None
    pipeline = pipeline_id(namespace, name)
    return Identity(
        transactional_id_prefix=_text(status.get("transactionalIdPrefix"))
        or wanted
        or default_transactional_id_prefix(pipeline),
        progress_group=_text(status.get("progressGroup")) or progress_group(pipeline),
    )


def identity_keys(identity: Identity) -> tuple[str, str]:
    """Index keys of an identity: prefixes and groups live in different Kafka namespaces."""
    return (f"prefix:{identity.transactional_id_prefix}", f"group:{identity.progress_group}")


def claimed_identities(body: Mapping[str, Any]) -> dict[str, list[Claimant]]:
    """The index entry of one pipeline object: each identity key with the object as claimant."""
    identity = claimed_identity(body)
    metadata = _mapping(body, "metadata")
    if identity is None:
        return {}
    me = Claimant(
        str(metadata.get("creationTimestamp") or ""),
        str(metadata["namespace"]),
        str(metadata["name"]),
    )
    return {key: [me] for key in identity_keys(identity)}


def identity_conflict(
    identity: Identity,
    me: Claimant,
    holders: Mapping[str, Iterable[Claimant]],
) -> str | None:
    """Why ``me`` may not use ``identity``: an older pipeline holds part of it; else None."""
    prefix_key, group_key = identity_keys(identity)
    for key, what, value in (
        (prefix_key, "transactions.idPrefix", identity.transactional_id_prefix),
        (group_key, "progress group", identity.progress_group),
    ):
        older = sorted(
            c
            for c in holders.get(key, ())
            if (c.namespace, c.name) != (me.namespace, me.name) and c < me
        )
        if older:
            return (
                f"{what} {value!r} is already used by pipeline {older[0].label}: two pipelines "
                "with one Kafka identity fence each other; give this one its own "
                "transactions.idPrefix (nothing is created for it until then)"
            )
    return None


#: The package whose modules the default image and the operator share (one build, one version).
SHIPPED_PACKAGE = "eop_spark"


def _top_level_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def shipped_transform_problem(pipeline: ExactlyOncePipeline) -> str | None:
    """Why a ``transform.python`` of eop's own package cannot run in the default image.

    The operator ships the same ``eop_spark`` as the default image, so a module
    under it (``eop_spark.examples...``) that does not exist, or lacks the
    function, is refused before a driver starts.  The module is read, never
    imported (it imports pyspark).  Other modules, or a pipeline with its own
    ``image``, are the runner's to check.
    """
    python = pipeline.spec.transform.python
    if python is None or pipeline.spec.image is not None:
        return None
    module = python.module
    if module.split(".")[0] != SHIPPED_PACKAGE:
        return None
    try:
        found = importlib.util.find_spec(module)
    except ImportError:
        found = None
    if found is None or found.origin is None or not found.origin.endswith(".py"):
        return f"transform.python.module {module!r} does not exist in the default image"
    if python.function not in _top_level_names(Path(found.origin).read_text()):
        return f"transform.python.function {python.function!r} is not defined in {module}"
    return None
