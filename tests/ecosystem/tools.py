"""The ecosystem's own tools, run for real: Lua (Argo CD's health check), kstatus, PromQL.

The Go tools are built from their Go modules by ``devenv/build-tools.sh`` (a no-op when
cached in ``~/.cache/eop/<tool>/<version>``); ``lua5.4`` is Debian's interpreter, which
the same script installs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from devenv.versions import cache_root, versions

ROOT = Path(__file__).resolve().parents[2]
HEALTH_LUA = ROOT / "charts" / "eop" / "gitops" / "argocd" / "health.lua"
TOOL_VERSIONS = {
    "kstatus-check": "CLI_UTILS_VERSION",
    "promql-check": "PROMETHEUS_MODULE_VERSION",
    "promtool": "PROMETHEUS_MODULE_VERSION",
}


def tool(name: str) -> Path:
    """The path of a Go tool, built by devenv/build-tools.sh if it is not cached yet."""
    path = cache_root() / name / versions()[TOOL_VERSIONS[name]] / "bin" / name
    if not path.exists():
        subprocess.run(["bash", str(ROOT / "devenv" / "build-tools.sh"), name], check=True)
    return path


def lua() -> str:
    """Debian's Lua 5.4 interpreter (devenv/build-tools.sh installs it)."""
    found = shutil.which("lua5.4")
    if found is None:
        subprocess.run(["bash", str(ROOT / "devenv" / "build-tools.sh"), "lua5.4"], check=True)
        found = shutil.which("lua5.4")
    assert found is not None, "lua5.4 is not installed"
    return found


def _lua_string(text: str) -> str:
    """A Lua string literal (decimal escapes for anything but printable ASCII)."""
    out = []
    for byte in text.encode():
        char = chr(byte)
        out.append(char if 32 <= byte < 127 and char not in '"\\' else f"\\{byte:03d}")
    return '"' + "".join(out) + '"'


def lua_literal(value: Any) -> str:
    """A JSON value as a Lua expression, as Argo CD hands objects to health scripts."""
    if isinstance(value, dict):
        items = (
            f"[{_lua_string(k)}] = {lua_literal(v)}" for k, v in value.items() if v is not None
        )
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return _lua_string(str(value))


def argocd_health(obj: dict[str, Any], script: Path = HEALTH_LUA) -> tuple[str, str]:
    """Run the health script on ``obj`` with the real interpreter: (hs.status, hs.message)."""
    harness = (
        f"obj = {lua_literal(obj)}\n"
        f"local hs = dofile({_lua_string(str(script))})\n"
        'io.write(hs.status, "\\n", hs.message)\n'
    )
    result = subprocess.run(
        [lua(), "-"], input=harness, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    status, _, message = result.stdout.partition("\n")
    return status, message


def _json_tool(name: str, data: Any, *, ok: tuple[int, ...] = (0,)) -> Any:
    """Run a Go tool with ``data`` as JSON on stdin; its JSON answer."""
    result = subprocess.run(
        [str(tool(name))],
        input=json.dumps(data),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode in ok, f"{name}: {result.stderr}"
    return json.loads(result.stdout)


def kstatus(obj: dict[str, Any]) -> tuple[str, str]:
    """sigs.k8s.io/cli-utils kstatus's verdict on ``obj``: (status, message)."""
    verdict = _json_tool("kstatus-check", obj)
    return verdict["status"], verdict["message"]


def promql_metrics(exprs: list[str]) -> list[dict[str, Any]]:
    """Each expression parsed by Prometheus's parser: {"expr", "metrics", "error"}
    (the tool exits 1 when one does not parse)."""
    return list(_json_tool("promql-check", exprs, ok=(0, 1)))


def exported_metrics() -> set[str]:
    """The sample names the operator and the driver really export, read from the code."""
    from prometheus_client.parser import text_string_to_metric_families

    from eop_operator import metrics as operator_metrics
    from eop_spark.runtime.metrics import Counters

    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    for family in operator_metrics.REGISTRY.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    for family in text_string_to_metric_families(Counters().render_prometheus("p")):
        names.update(sample.name for sample in family.samples)
    return names


def series_names(text: str) -> set[str]:
    """Metric names of the series in a promtool test file's input_series."""
    return {m.group(1) for m in re.finditer(r"series:\s*'([a-zA-Z_:][a-zA-Z0-9_:]*)", text)}
