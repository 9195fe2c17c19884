"""Generate the CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema:
no ``$ref``, no ``anyOf`` around nullable types, ``x-kubernetes-preserve-unknown-fields``
for free-form objects.  :func:`structural_schema` does that translation and
keeps the validation keywords and CEL rules the models declare.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from eop_operator import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, VERSIONS
from eop_operator.api.models import ExactlyOncePipeline, PipelineSpec, PipelineStatus

#: JSON-schema keywords that carry over unchanged into the CRD schema.
_KEPT = {
    "type",
    "description",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-preserve-unknown-fields",
}


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow a ``$ref`` (merging sibling keys such as description) and ``allOf`` of one."""
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        rules = target.get("x-kubernetes-validations", []) + schema.get(
            "x-kubernetes-validations", []
        )
        if rules:
            merged["x-kubernetes-validations"] = rules
        return _resolve(merged, defs)
    if "allOf" in schema and len(schema["allOf"]) == 1:
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        return _resolve({**schema["allOf"][0], **rest}, defs)
    return schema


def structural_schema(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Translate one pydantic JSON schema node into a structural CRD schema node."""
    schema = _resolve(schema, defs)
    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unions other than Optional are not supported: {schema}")
        rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
        return structural_schema({**options[0], **rest}, defs)

    out: dict[str, Any] = {k: v for k, v in schema.items() if k in _KEPT}
    default = schema.get("default")
    # Scalar defaults are applied by the API server, so `kubectl get -o yaml` shows them.
    if default is not None and not isinstance(default, dict | list):
        out["default"] = default
    if "const" in schema:
        out["enum"] = [schema["const"]]

    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties:
            out["properties"] = {
                name: structural_schema(sub, defs) for name, sub in properties.items()
            }
            required = schema.get("required")
            if required:
                out["required"] = list(required)
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = structural_schema(extra, defs)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = structural_schema(schema["items"], defs)
    return out


def _model_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural_schema(raw, raw.get("$defs", {}))


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the CRD's version."""
    spec = _model_schema(PipelineSpec)
    status = _model_schema(PipelineStatus)
    # The /scale subresource reads and writes spec.spark.executor.instances: the API server
    # fills the objects on the way (empty, then their scalar defaults), so that path has a
    # value in every pipeline; without one, GET /scale fails.
    spark = spec["properties"]["spark"]
    spark["default"] = {}
    spark["properties"]["executor"]["default"] = {}
    # kstatus: conditions are keyed by type, so server-side apply merges them per type.
    status["properties"]["conditions"]["x-kubernetes-list-type"] = "map"
    status["properties"]["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    return {
        "type": "object",
        "description": ExactlyOncePipeline.__doc__,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            # Bounded, so the root's CEL rules on the name stay within the API server's cost budget.
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 253}},
            },
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": list(ExactlyOncePipeline.crd_root_rules),
    }


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
        {"name": "Lag", "type": "integer", "jsonPath": ".status.lag"},
        # Why: the reason of the Ready condition (DriverReady, Unschedulable, CrashLoop, ...).
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        },
        {"name": "Mode", "type": "string", "jsonPath": ".status.commitMode", "priority": 1},
        {"name": "Executors", "type": "integer", "jsonPath": ".status.executors", "priority": 1},
        {"name": "Checkpoint-Gen", "type": "integer", "jsonPath": ".status.checkpoint.generation"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.failover.restarts"},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


#: Where the /scale subresource reads and writes: the executor count and what the operator
#: reports for it (``status.executors``, ``status.executorSelector``).
SCALE_SPEC_PATH = ".spec.spark.executor.instances"


def scale_subresource() -> dict[str, str]:
    """``kubectl scale`` / HorizontalPodAutoscaler / KEDA on the executor count."""
    return {
        "specReplicasPath": SCALE_SPEC_PATH,
        "statusReplicasPath": ".status.executors",
        "labelSelectorPath": ".status.executorSelector",
    }


def _version(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """One served version of the CRD: every version has the same schema and subresources."""
    return {
        "name": name,
        "served": True,
        "storage": name == VERSION,
        "subresources": {"status": {}, "scale": scale_subresource()},
        "additionalPrinterColumns": _printer_columns(),
        "schema": {"openAPIV3Schema": schema},
    }


def render_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of ExactlyOncePipeline, with each of its served versions.

    The versions share one schema, so the API server converts between them without a
    webhook (``conversion.strategy: None``): it only rewrites ``apiVersion``.
    """
    schema = openapi_schema()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "eop"],
            },
            "conversion": {"strategy": "None"},
            "versions": [_version(name, copy.deepcopy(schema)) for name in VERSIONS],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML committed in ``crds/`` and the chart (with a do-not-edit header)."""
    header = "# Generated by `eop crd` from operator/eop_operator/api/models.py. Do not edit.\n"
    return header + yaml.safe_dump(render_crd(), sort_keys=False, width=100)
