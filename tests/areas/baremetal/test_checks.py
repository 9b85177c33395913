"""provisioner.areas.baremetal.checks: `install: pxe` only where the PXE server can install."""

from __future__ import annotations

from typing import Any

import pytest


def test_install_pxe_is_valid_on_an_installable_node(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1].update(install="pxe", install_disks=["nvme-D_[1-2]"])
    m = kit.load(data).manifest
    assert [n.install for n in m.nodes] == ["manual", "pxe", "pxe"]


@pytest.mark.parametrize(
    ("index", "change", "words"),
    [
        (0, {"install_disks": ["nvme-D"]}, "head01 is the head node: it serves PXE"),
        (1, {}, "node01 lists no install_disks"),
        (1, {"install_disks": ["nvme-D_[1-2]"], "bmc": None}, "node01 has no bmc section"),
    ],
)
def test_install_pxe_where_it_cannot_work_is_refused_at_its_line(kit: Any, index: int, change: dict[str, Any],
                                                                  words: str) -> None:
    data = kit.base()
    node = data["nodes"][index]
    node["install"] = "pxe"
    for key, value in change.items():
        if value is None:
            node.pop(key)
        else:
            node[key] = value
    text = kit.dump(data)
    diag = kit.error(text, words)
    assert diag.path == f"nodes[{index}].install"
    assert diag.line == kit.line_of(text, "install: pxe")
    assert diag.message.startswith("install: pxe: ")


def test_install_must_be_manual_or_pxe(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["install"] = "yes"
    assert kit.errors(data)[0].path == "nodes[1].install"
