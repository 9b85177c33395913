"""How verify's results are shown: a table, JSON, JUnit XML; and the exit code."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from provisioner.verify.run import Result

STYLES = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow"}


def exit_code(results: list[Result]) -> int:
    """0 only when nothing failed (SKIPs do not fail a run)."""
    return 1 if any(r.status == "FAIL" for r in results) else 0


def counts(results: list[Result]) -> dict[str, int]:
    c = Counter(r.status for r in results)
    return {s: c.get(s, 0) for s in ("PASS", "FAIL", "SKIP")}


def summary(results: list[Result]) -> str:
    c = counts(results)
    nodes = len({r.node for r in results})
    return f"verify: {c['PASS']} passed, {c['FAIL']} failed, {c['SKIP']} skipped on {nodes} nodes"


def table(results: list[Result], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("node", "check", "result", "detail"):
        t.add_column(col, overflow="fold")
    last = ""
    for r in results:
        t.add_row("" if r.node == last else r.node, r.check, f"[{STYLES[r.status]}]{r.status}[/]", r.detail)
        last = r.node
    return t


def print_results(console: Console, results: list[Result], cluster: str) -> None:
    console.print(table(results, f"verify {cluster}"))
    console.print(summary(results), highlight=False, markup=False,
                  style="red" if exit_code(results) else "green")


def to_json(results: list[Result]) -> dict[str, Any]:
    return {
        "passed": exit_code(results) == 0,
        "counts": counts(results),
        "results": [{"node": r.node, "check": r.check, "status": r.status, "detail": r.detail,
                     "seconds": round(r.seconds, 3)} for r in results],
    }


def junit(results: list[Result], cluster: str) -> str:
    """JUnit XML: one testsuite per node, one testcase per check (SKIP is <skipped>)."""
    root = ET.Element("testsuites", name=f"provision verify {cluster}")
    nodes: dict[str, ET.Element] = {}
    for r in results:
        suite = nodes.get(r.node)
        if suite is None:
            suite = nodes[r.node] = ET.SubElement(root, "testsuite", name=r.node)
        case = ET.SubElement(suite, "testcase", classname=f"{cluster}.{r.node}", name=r.check,
                             time=f"{r.seconds:.3f}")
        if r.status == "FAIL":
            ET.SubElement(case, "failure", message=r.detail)
        elif r.status == "SKIP":
            ET.SubElement(case, "skipped", message=r.detail)
    for name, suite in nodes.items():
        mine = [r for r in results if r.node == name]
        c = counts(mine)
        suite.set("tests", str(len(mine)))
        suite.set("failures", str(c["FAIL"]))
        suite.set("skipped", str(c["SKIP"]))
        suite.set("errors", "0")
    c = counts(results)
    root.set("tests", str(len(results)))
    root.set("failures", str(c["FAIL"]))
    root.set("skipped", str(c["SKIP"]))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
