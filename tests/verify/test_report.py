"""provisioner.verify.report: table, JSON, JUnit XML, exit code."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET

from rich.console import Console

from provisioner.verify import report
from provisioner.verify.run import Result

RESULTS = [
    Result("head01", "reach", "PASS", "no container, 0 GPU device files", 0.2),
    Result("head01", "clock", "FAIL", "chrony not synchronised (offset +1.0 ms)", 0.1),
    Result("gpu01", "gpu.count", "SKIP", "no GPU device in this podman container"),
    Result("gpu01", "hosts", "PASS", "3 nodes"),
]


def test_exit_code_fails_only_on_fail() -> None:
    assert report.exit_code(RESULTS) == 1
    assert report.exit_code([r for r in RESULTS if r.status != "FAIL"]) == 0
    assert report.exit_code([]) == 0


def test_table_and_summary() -> None:
    buf = io.StringIO()
    report.print_results(Console(file=buf, width=160, color_system=None), RESULTS, "c1")
    text = buf.getvalue()
    assert "verify c1" in text and "chrony not synchronised" in text and "SKIP" in text
    assert text.count("head01") == 1  # the node is named once per group
    assert "verify: 2 passed, 1 failed, 1 skipped on 2 nodes" in text


def test_json() -> None:
    data = report.to_json(RESULTS)
    assert data["passed"] is False and data["counts"] == {"PASS": 2, "FAIL": 1, "SKIP": 1}
    assert data["results"][2] == {"node": "gpu01", "check": "gpu.count", "status": "SKIP",
                                  "detail": "no GPU device in this podman container", "seconds": 0.0}


def test_junit() -> None:
    root = ET.fromstring(report.junit(RESULTS, "c1"))
    assert root.get("tests") == "4" and root.get("failures") == "1" and root.get("skipped") == "1"
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"head01", "gpu01"}
    clock = suites["head01"].find("testcase[@name='clock']")
    assert clock is not None and clock.find("failure").get("message").startswith("chrony")  # type: ignore[union-attr]
    skipped = suites["gpu01"].find("testcase[@name='gpu.count']/skipped")
    assert skipped is not None and "podman" in str(skipped.get("message"))
    assert suites["gpu01"].find("testcase[@name='hosts']/failure") is None
