"""JUnit XML for CI systems: one test case per (configuration, metric).

CI servers (GitLab, Jenkins, GitHub test reporters) already know how to show
JUnit results, so ``vnetbench compare --fail-on regression`` speaks it.
Only a regression fails: an improvement or "unchanged" passes, and so does
"inconclusive" -- marking it skipped or failed would either hide real results
or fail builds on noise -- but its reason goes into ``<system-out>`` so the
reader sees why no verdict was possible.

Builds a string only (no file I/O); the CLI writes it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable

from .compare import REGRESSED, VERDICTS

__all__ = ["junit_xml"]


def junit_xml(suite_name: str, cases: Iterable[tuple[str, str, str, str]]) -> str:
    """JUnit XML document for one comparison.

    ``cases``: ``(classname, name, verdict, message)`` tuples, where classname
    is the configuration label (e.g. ``"env=container,nic=virtio"``), name the
    metric, verdict one of improved/regressed/unchanged/inconclusive and
    message the human reason. A ``regressed`` case gets a ``<failure>``; every
    other case passes and carries its verdict and message in ``<system-out>``.
    """
    cases = list(cases)
    root = ET.Element("testsuites", name=str(suite_name))
    suite = ET.SubElement(root, "testsuite", name=str(suite_name))
    failures = 0
    for i, case in enumerate(cases):
        try:
            classname, name, verdict, message = case
        except (TypeError, ValueError):
            raise ValueError(f"case {i}: expected (classname, name, verdict, message), got {case!r}") from None
        if verdict not in VERDICTS:
            raise ValueError(f"case {i} ({classname} / {name}): unknown verdict {verdict!r}; expected one of {VERDICTS}")
        tc = ET.SubElement(suite, "testcase", classname=str(classname), name=str(name), time="0")
        text = f"{verdict}: {message}"
        if verdict == REGRESSED:
            failures += 1
            failure = ET.SubElement(tc, "failure", message=str(message), type="regression")
            failure.text = text
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = text
    stats = {
        "tests": str(len(cases)),
        "failures": str(failures),
        "errors": "0",
        "skipped": "0",
    }
    for el in (root, suite):
        for k, v in stats.items():
            el.set(k, v)
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body + "\n"

