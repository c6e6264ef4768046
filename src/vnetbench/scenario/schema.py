"""The JSON Schema of a scenario file (`vnetbench schema`), generated from the scenario's models.

Editors read it to complete keys and mark mistakes while a scenario is typed: with Taplo (the TOML language
server behind VS Code's Even Better TOML, and others) a first line ``#:schema ./scenario.schema.json`` binds a
file to it (docs/reference/schema.md).

It describes the file as written, not the values it is parsed into: pydantic's validation-mode schema, in which
every parser of the models declares the forms it reads (a rate as a number of bit/s or "100Mbit", a buffer as
bytes or a time, a loss as "1%" or a table; see ``json_schema_input_type`` and
:func:`vnetbench.quantities.written_also_as`). What a schema cannot say is still the loader's to check: limits
that depend on other keys (a buffer at its rate, omit against duration), names the file defines (``during``,
``workloads``), expressions (``offered``), matrix values (each axis sets a key of [lab] or of a workload) and
files a value names (a schedule's trace). ``vnetbench plan`` checks all of it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from vnetbench import __version__
from vnetbench.scenario.model import Scenario
from vnetbench.workloads import registry

DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: Where a copy of the schema lives in the repository, beside the docs that explain it.
REPOSITORY_COPY = "docs/reference/scenario.schema.json"


class _Generator(GenerateJsonSchema):
    def generate(self, schema: Any, mode: Any = "validation") -> dict[str, Any]:
        out = super().generate(schema, mode=mode)
        return {"$schema": DIALECT, **out}


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a scenario file."""
    schema = Scenario.model_json_schema(mode="validation", schema_generator=_Generator)
    schema["title"] = "vnetbench scenario"
    schema["description"] = (f"A vnetbench {__version__} scenario file (TOML): the lab, the matrix of "
                             "configurations, the workloads and how to repeat them. `vnetbench plan FILE` "
                             "checks what a schema cannot (keys that depend on each other, matrix values).")
    return _readable_names(schema)


def _readable_names(schema: dict[str, Any]) -> dict[str, Any]:
    """Every workload tool's options model is called Options in its own module; pydantic names their
    definitions by module path (vnetbench__workloads__iperf3__Options). Name them by tool, as files do."""
    defs = schema.get("$defs", {})
    renames = {old: new for old, new in workload_def_names().items() if old in defs}
    for old, new in renames.items():
        defs[new] = defs.pop(old)
        defs[new]["title"] = f"[workload.NAME] with tool = \"{registry.driver(new.removeprefix('workload_')).tool}\""
    refs = {f"#/$defs/{old}": f"#/$defs/{new}" for old, new in renames.items()}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (refs.get(v, v) if k == "$ref" else walk(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out = walk(schema)
    _one_value_as_enum(out)
    mapping = out["properties"]["workload"]["additionalProperties"].get("discriminator", {}).get("mapping", {})
    for tool, ref in mapping.items():
        mapping[tool] = refs.get(ref, ref)
    out["$defs"] = dict(sorted(out["$defs"].items()))
    return out


def workload_def_names() -> dict[str, str]:
    """pydantic's name of each tool's options model in a schema's $defs -> the name the schema gives it."""
    return {f"{model.__module__}.{model.__qualname__}".replace(".", "__"): f"workload_{tool}"
            for tool, model in registry.options_models().items()}


def _one_value_as_enum(node: Any) -> None:
    """``{"const": "iperf3"}`` as ``{"enum": ["iperf3"]}``: the same to draft 2020-12, and draft 4 (which some
    editors' validators still implement: Taplo's documentation names it) knows no const, so each workload
    table would match every tool's options."""
    if isinstance(node, dict):
        if "const" in node:
            node["enum"] = [node.pop("const")]
        for v in node.values():
            _one_value_as_enum(v)
    elif isinstance(node, list):
        for v in node:
            _one_value_as_enum(v)


def schema_text() -> str:
    """The schema as `vnetbench schema` prints it (and as the repository's copy holds it)."""
    return json.dumps(scenario_schema(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"
