"""JUnit XML: parses back, only regressions fail, reasons are visible."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from vnetbench.stats.junit import junit_xml

CASES = [
    ("env=container,nic=virtio", "throughput.rx_mbps", "regressed", "median -12.0% (95% CI -15% to -9%)"),
    ("env=container,nic=virtio", "rtt.p99_ms", "inconclusive", "fewer than 4 trials per side (a=3, b=10)"),
    ("env=vm,nic=e1000", "throughput.rx_mbps", "improved", "median +20%"),
    ("env=vm,nic=e1000", "udp.loss_ratio", "unchanged", "within noise"),
    ("env=bare", "rtt.p50_ms", "regressed", 'p<0.05 & "quoted" <tag>'),
]


def test_parses_back_with_the_right_counts():
    xml = junit_xml("compare A vs B", CASES)
    root = ET.fromstring(xml)
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "compare A vs B"
    cases = suite.findall("testcase")
    assert len(cases) == 5
    assert suite.get("tests") == "5" and root.get("tests") == "5"
    assert suite.get("failures") == "2" and root.get("failures") == "2"
    assert suite.get("errors") == "0" and suite.get("skipped") == "0"
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("classname"), c.get("name")) for c in failed] == [
        ("env=container,nic=virtio", "throughput.rx_mbps"),
        ("env=bare", "rtt.p50_ms"),
    ]
    assert not suite.findall(".//skipped")


def test_inconclusive_passes_with_its_reason_in_system_out():
    suite = ET.fromstring(junit_xml("s", CASES)).find("testsuite")
    case = suite.findall("testcase")[1]
    assert case.find("failure") is None and case.find("skipped") is None
    assert case.findtext("system-out") == "inconclusive: fewer than 4 trials per side (a=3, b=10)"


def test_special_characters_round_trip():
    case = ET.fromstring(junit_xml("s", CASES)).find("testsuite").findall("testcase")[4]
    failure = case.find("failure")
    assert failure.get("message") == 'p<0.05 & "quoted" <tag>'
    assert failure.get("type") == "regression"
    assert failure.text == 'regressed: p<0.05 & "quoted" <tag>'


def test_empty_and_invalid():
    root = ET.fromstring(junit_xml("nothing", []))
    assert root.get("tests") == "0" and root.get("failures") == "0"
    with pytest.raises(ValueError, match="unknown verdict"):
        junit_xml("s", [("c", "m", "worse", "x")])
    with pytest.raises(ValueError):
        junit_xml("s", [("c", "m", "regressed")])
