"""Generate docs/api.md, the field reference, from the same schema as the CRD."""

from __future__ import annotations

from typing import Any

from eop_operator import GROUP, KIND, PLURAL, VERSION, VERSIONS
from eop_operator.api.crd import openapi_schema


def _type(node: dict[str, Any]) -> str:
    kind = node.get("type", "object")
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    if kind == "array":
        return f"list of {_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type(node['additionalProperties'])}"
    return str(kind)


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    for key, label in (
        ("default", "default"),
        ("minimum", "min"),
        ("maximum", "max"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("pattern", "pattern"),
    ):
        if key in node:
            parts.append(f"{label} `{node[key]}`")
    for rule in node.get("x-kubernetes-validations", []):
        parts.append(rule["message"])
    return "; ".join(parts).replace("|", "\\|")


def _rows(node: dict[str, Any], path: str, required: bool) -> list[str]:
    description = " ".join(node.get("description", "").split()).replace("|", "\\|")
    description = description.replace("``", "`")
    rows = [
        f"| `{path}` | {_type(node)} | {'yes' if required else ''} | {description} "
        f"| {_constraints(node)} |"
    ]
    target = node
    if node.get("type") == "array" and node["items"].get("properties"):
        target = node["items"]
        path = f"{path}[]"
    for name, child in target.get("properties", {}).items():
        rows += _rows(child, f"{path}.{name}", name in target.get("required", []))
    return rows


def _versions() -> list[str]:
    """The section on API versions: what is served, what is stored, how to migrate."""
    served = ", ".join(f"`{GROUP}/{v}`" for v in VERSIONS)
    newest, crd = VERSIONS[-1], f"{PLURAL}.{GROUP}"
    return [
        "## API versions",
        "",
        f"Served: {served}. Stored: `{GROUP}/{VERSION}`, the version the operator reads",
        "and writes. The versions have the same schema, so the API server converts between",
        "them without a webhook (`conversion.strategy: None`): an object created as one version",
        "reads as any other with the same spec and status, only `apiVersion` differs.",
        f"`kubectl get eop` shows `{newest}`, the preferred version; apply manifests of either.",
        "",
        f"The storage version stays `{VERSION}` while an operator that knows only `{VERSION}` may",
        "be rolled back to; a later release makes the newest version the storage version, and",
        "an older version is served until no object is stored in it.",
        "",
        "### Compatibility between operator versions",
        "",
        "- **Unknown fields.** The API server drops fields the installed CRD does not declare",
        "  (`kubectl apply` refuses them, naming them, with its default `--validate=strict`).",
        "  An operator reading objects written for a newer one (rolled back while the newer CRD",
        "  stays installed) ignores the fields it does not know, with a Warning event",
        "  `UnknownFields` naming them, and writes only its own status fields: the others,",
        "  conditions of other types included, stay as they are.",
        "- **Rules ratchet.** A rule that a newer operator adds or tightens never turns a running",
        "  pipeline `Invalid`. A spec that an operator accepted (`status.observedGeneration`",
        "  equals `metadata.generation`, phase not `Invalid`) and that has not changed since keeps",
        "  running; the condition `SpecNoLongerValid` and a Warning event of that reason name each",
        "  rule it breaks. Any change of the spec must pass every rule. The API server (Kubernetes",
        "  1.30 and later) ratchets the CRD's rules the same way. Rules between fields and field",
        "  rules with a message (the *rules* column below) ratchet; a narrower type, pattern,",
        "  bound or enum of a field comes only with a new API version. The driver checks the",
        "  rules of `source`, `transform`, `sink` and `trigger` again when it starts: a driver",
        "  restarted on a Spark image whose rules are tighter ends with `ConfigError` naming",
        "  the rule (phase `Degraded`); pin `spec.image` to keep such a pipeline on its image.",
        "",
        "### Storage migration",
        "",
        "After a CRD that makes another version the storage version is applied, objects stay",
        "stored in the old one until they are written again. To rewrite every object and then",
        "drop the old version from the CRD's record of stored versions:",
        "",
        "```sh",
        f"kubectl get {crd} -A -o json | kubectl replace -f -",
        f"kubectl get crd {crd} -o jsonpath='{{.status.storedVersions}}'",
        f"kubectl patch crd {crd} --subresource=status --type=merge \\",
        f'  -p \'{{"status":{{"storedVersions":["{newest}"]}}}}\'',
        "```",
        "",
        "`kubectl replace` writes each object unchanged (its `metadata.resourceVersion` guards",
        "against a concurrent change: repeat the command for an object it reports as conflicting).",
        "The spec does not change, so no driver restarts.",
        "",
    ]


def api_reference() -> str:
    """docs/api.md: every spec and status field with type, default and rules."""
    schema = openapi_schema()
    lines = [
        "<!-- Generated by `make crds` from operator/eop_operator/api/models.py. Do not edit. -->",
        f"# {KIND} API reference (`{GROUP}`)",
        "",
        "Every rule below is enforced by the API server (`kubectl apply` fails with the",
        "message) and by `eop run` / `eop render` on a laptop.",
        "",
        *_versions(),
        "## metadata",
        "",
        *(f"- {rule['message']}" for rule in schema["x-kubernetes-validations"]),
        "",
    ]
    for section in ("spec", "status"):
        lines += [
            f"## {section}",
            "",
            "| field | type | required | description | rules |",
            "| --- | --- | --- | --- | --- |",
            *_rows(schema["properties"][section], section, section in schema["required"])[1:],
            "",
        ]
    return "\n".join(lines)
