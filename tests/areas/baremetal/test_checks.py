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


def test_a_uefi_pxe_install_warns_that_secure_boot_must_be_off(kit: Any) -> None:
    """Issue 19 item 12: the PXE chain's iPXE is unsigned; once per manifest entry, at install."""
    data = kit.base()
    data["nodes"][1].update(install="pxe", install_disks=["nvme-D_[1-2]"])
    text = kit.dump(data)
    warnings = [d for d in kit.load(text).warnings if "Secure Boot" in d.message]
    assert len(warnings) == 1  # once for the entry node[01-02]
    assert warnings[0].path == "nodes[1].install" and warnings[0].line == kit.line_of(text, "install: pxe")
    assert "must have Secure Boot off" in warnings[0].message and warnings[0].severity == "warning"
    data["nodes"][1]["bmc"]["secure_boot"] = False  # the operator says it is off
    assert not [d for d in kit.load(data).warnings if "Secure Boot" in d.message]
    data["nodes"][1]["bmc"]["secure_boot"] = True
    err = kit.error(data, "with Secure Boot on")
    assert err.path == "nodes[1].bmc.secure_boot"
    data["nodes"][1]["bmc"]["boot_mode"] = "legacy"  # BIOS boot has no Secure Boot
    assert not [d for d in kit.load(data).warnings if "Secure Boot" in d.message]
