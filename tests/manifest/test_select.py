"""provisioner.manifest.select: selectors resolved once per node list, asked per node."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.manifest.select import SelectorError, select_nodes, selects


def test_selects_answers_as_select_nodes(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    for items in (["@compute"], ["node[01-02]"], ["head01", "node02"], [], ["@head", "@compute"]):
        chosen = select_nodes(m, items)
        assert [n for n in m.node_names() if selects(m, items, n)] == chosen
    assert not selects(m, ["@compute"], "ghost")


def test_the_list_handed_out_is_a_copy(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    select_nodes(m, ["@compute"]).append("intruder")
    assert select_nodes(m, ["@compute"]) == ["node01", "node02"]


def test_errors_are_raised_every_time(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    for _ in range(2):
        with pytest.raises(SelectorError, match="unknown node 'node03'"):
            selects(m, ["node[01-03]"], "node01")


def test_a_new_node_list_is_resolved_anew(kit: Any) -> None:
    """The resolved selectors belong to one node list: a copy of the manifest with other
    nodes (how tests and the pxe molecule helper change a manifest) resolves them again."""
    m = kit.load(kit.base()).manifest
    assert select_nodes(m, ["@compute"]) == ["node01", "node02"]
    data = kit.base()
    data["nodes"][1]["name"] = "node[01-03]"
    more = m.model_copy(update={"nodes": kit.load(data).manifest.nodes})
    assert select_nodes(more, ["@compute"]) == ["node01", "node02", "node03"]
    assert selects(more, ["@compute"], "node03")
    assert select_nodes(m, ["@compute"]) == ["node01", "node02"]
