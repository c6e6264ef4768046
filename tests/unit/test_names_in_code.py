"""Names that mean one thing (issue 30, item 4): the words the code once used for two things stay gone.

docs/how-to/extend.md ("Words the code uses") gives each word's one meaning: an endpoint is where workloads run,
a node runs its commands, a host is a machine, a rate qdisc is tbf or htb.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "vnetbench"

# old name -> what it is called now
GONE = {
    "Host": "NamespaceNode (a namespace that runs commands; a host is a machine)",
    "VmHost": "GuestNode",
    "EngineHost": "EngineNode",
    "TrialHosts": "TrialEndpoints",
    "GraphHosts": "GraphEndpoints",
    "attach_node": "wired_namespace",
    "wire_node": "wired_namespace",
    "wire_namespace": "wired_namespace (the lab wires every endpoint's namespace: lab/graph_lab.py)",
    "plain_host": "namespace_node",
    "workload_hosts": "workload_endpoints",
    "group_hosts": "group_endpoints",
    "shaper": "rate_qdisc (the scenario calls it qdisc)",
    "ShaperBackend": "RateQdiscBackend",
    "SHAPER_NEEDS": "RATE_QDISC_NEEDS",
}
# attribute reads of an old name, on the objects that carry lab endpoints
GONE_ATTRIBUTES = re.compile(r"\b(lab|ctx)\.hosts\b")


def code_names(path: Path) -> list[tuple[int, str]]:
    """The identifiers in a module's code (not its strings or comments), with their lines."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.NAME]


def test_no_module_uses_a_name_that_meant_two_things():
    found = [f"{p.relative_to(SRC)}:{line}: {name} -> {GONE[name]}"
             for p in sorted(SRC.rglob("*.py")) for line, name in code_names(p) if name in GONE]
    found += [f"{p.relative_to(SRC)}:{n}: {m.group(0)} -> {m.group(1)}.endpoints"
              for p in sorted(SRC.rglob("*.py")) for n, text in enumerate(p.read_text().splitlines(), 1)
              for m in GONE_ATTRIBUTES.finditer(text)]
    assert not found, "\n".join(found)


def test_a_kernel_rate_qdisc_is_not_called_a_shaper_in_prose_either():
    found = [f"{p.relative_to(SRC)}:{n}" for p in sorted(SRC.rglob("*.py"))
             for n, text in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bshapers?\b", text)]
    assert not found, "\n".join(found)


def test_the_checks_see_an_old_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class Host:\n    pass\n# a Host in a comment is prose\nx = 'Host *'\n")
    assert code_names(module)[:2] == [(1, "class"), (1, "Host")]
    assert [name for _, name in code_names(module) if name in GONE] == ["Host"]
