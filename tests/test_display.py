"""provisioner.display: the plan table."""

from __future__ import annotations

import io

from rich.console import Console

from provisioner.display import plan_rows, print_plan
from provisioner.plan import NodePlan, Plan, Status


def _node(name: str, status: Status = "new", plays: tuple[str, ...] = ("common",)) -> NodePlan:
    return NodePlan(name, status, [], "new", True, list(plays))


def test_runs_of_alike_nodes_share_a_row() -> None:
    nodes = [_node("head01", plays=("common", "slurm")), *(_node(f"gpu{i:04d}") for i in range(1, 2001)),
             _node("gpu2001", "unchanged", ()), _node("gpu2002"), _node("gpu2003")]
    rows = plan_rows(Plan(nodes, True, []))
    assert rows == [
        ("head01", "new", "new", "-", "", "common, slurm"),
        ("gpu[0001-2000]", "new", "new", "-", "", "common"),
        ("gpu2001", "unchanged", "new", "-", "", "-"),
        ("gpu[2002-2003]", "new", "new", "-", "", "common"),
    ]


def test_alike_rows_apart_in_numbering_stay_apart() -> None:
    rows = plan_rows(Plan([_node("gpu01"), _node("gpu03"), _node("gpu04")], False, []))
    assert [r[0] for r in rows] == ["gpu01", "gpu[03-04]"]


def test_changed_sections_tell_rows_apart() -> None:
    a, b = _node("gpu01", "changed"), _node("gpu02", "changed")
    a.sections, b.sections = ["storage"], ["gpu"]
    assert [r[0] for r in plan_rows(Plan([a, b], False, []))] == ["gpu01", "gpu02"]


def test_print_plan_lists_every_target() -> None:
    out = io.StringIO()
    plan = Plan([_node("gpu01"), _node("gpu02")], True, ["gpu01", "gpu02"])
    print_plan(Console(file=out, width=160), plan, "c")
    text = out.getvalue()
    assert "gpu[01-02]" in text
    assert "2 new; cluster-wide files change; node-local plays on: gpu01, gpu02" in text
