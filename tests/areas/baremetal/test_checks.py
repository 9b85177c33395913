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


def ramdisk_warnings(kit: Any, data: dict[str, Any]) -> list[Any]:
    return [d for d in kit.load(data).warnings if "deploy ramdisk" in d.message]


def site(kit: Any, data: dict[str, Any]) -> dict[str, Any]:
    data["nodes"][1].update(install="pxe", install_disks=["nvme-D_[1-2]"])
    data["cluster"]["mirrors"] = {"apt": "http://mirror.site/ubuntu", "apt_proxy": "http://proxy.site:3142"}
    return data


def test_an_ubuntu_only_site_with_a_mirror_is_told_the_deploy_ramdisk_needs_debian(kit: Any) -> None:
    """The deploy ramdisk always comes from Debian 12; with no Debian node it is not fetched
    from the manifest's (Ubuntu) mirror, which an air-gapped site must know."""
    data = site(kit, kit.base())
    assert all(not n.get("os", "").startswith("debian") for n in data["nodes"])
    text = kit.dump(data)
    found = [d for d in kit.load(text).warnings if "deploy ramdisk" in d.message]
    assert len(found) == 1 and found[0].severity == "warning" and found[0].path == "cluster.mirrors.apt"
    assert "Debian's own archive (deb.debian.org, through http://proxy.site:3142)" in found[0].message
    assert "not from http://mirror.site/ubuntu" in found[0].message


def test_no_ramdisk_warning_where_the_ramdisk_source_is_no_surprise(kit: Any) -> None:
    # a Debian node: the ramdisk comes from the manifest's mirror
    assert ramdisk_warnings(kit, site(kit, kit.on_os(kit.base(), "debian-12", (1,)))) == []
    no_mirror = site(kit, kit.base())
    no_mirror["cluster"].pop("mirrors")  # Debian's archive, like everything else
    assert ramdisk_warnings(kit, no_mirror) == []
    installer = site(kit, kit.base())
    installer["cluster"]["install_method"] = "installer"  # no ramdisk at all
    assert ramdisk_warnings(kit, installer) == []
