"""The PXE installs' preflight: its decisions (areas/baremetal/preflight.py) and its edges
(provisioner/preflight.py: the image cache, the proof record, the deploy ramdisk's modules)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from provisioner import packages
from provisioner import preflight as edges
from provisioner.areas.baremetal import preflight
from provisioner.areas.baremetal.preflight import Check, Inputs
from provisioner.image import proof
from provisioner.image.build import sidecar, sidecar_line, write_initramfs
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Bmc, Node

SERVER_NICS = {"ixgbe", "i40e", "ice", "igb", "mlx5_core", "bnxt_en", "tg3"}
KERNEL = "lib/modules/6.1.0-56-amd64/kernel/drivers/net/ethernet"
NIC_PATHS = [f"{KERNEL}/intel/ixgbe/ixgbe.ko", f"{KERNEL}/intel/i40e/i40e.ko", f"{KERNEL}/intel/ice/ice.ko",
             f"{KERNEL}/intel/igb/igb.ko", f"{KERNEL}/mellanox/mlx5/core/mlx5_core.ko",
             f"{KERNEL}/broadcom/bnxt/bnxt_en.ko", f"{KERNEL}/broadcom/tg3.ko.xz"]


def pxe_manifest(kit: Any, *, method: str = "image", disks: Sequence[str] = ("nvme-Samsung_990_S7HE001",),
                 others: Sequence[str] = ()) -> Manifest:
    """The test manifest on Debian 12 with node01 marked for a PXE install (by an IPMI BMC on
    loopback); node02 with ``others`` as its install disks."""
    m = kit.load(kit.on_os(kit.base(), "debian-12")).manifest
    bmc = Bmc.model_validate({"type": "ipmi", "address": "127.0.0.1", "port": 6230, "user": "admin",
                              "password_env": "T_BMC", "boot_mode": "legacy"})
    nodes = list(m.nodes)
    nodes[1] = nodes[1].model_copy(update={"install": "pxe", "install_method": method, "install_disks": list(disks),
                                           "bmc": bmc})
    nodes[2] = nodes[2].model_copy(update={"install_disks": list(others)})
    return m.model_copy(update={"nodes": nodes})


def test_the_server_nic_families_are_intel_mellanox_and_broadcom() -> None:
    assert preflight.NIC_FAMILIES == {"Intel": ("ixgbe", "i40e", "ice", "igb"), "NVIDIA/Mellanox": ("mlx5_core",),
                                      "Broadcom": ("bnxt_en", "tg3")}
    assert {m for mods in preflight.NIC_FAMILIES.values() for m in mods} == SERVER_NICS


def test_module_names_come_from_kernel_module_paths() -> None:
    paths = [*NIC_PATHS, "usr/lib/modules/6.1.0-56-amd64/kernel/drivers/net/ethernet/intel/ixgbevf/ixgbevf.ko",
             "lib/modules/6.1.0-56-amd64/modules.dep", "usr/share/doc/tg3.ko.txt", f"{KERNEL}/intel/igb"]
    assert preflight.module_names(paths) == SERVER_NICS | {"ixgbevf"}
    assert preflight.missing_nic_drivers(SERVER_NICS) == []
    assert preflight.missing_nic_drivers(SERVER_NICS - {"mlx5_core", "tg3"}) == ["NVIDIA/Mellanox mlx5_core",
                                                                                  "Broadcom tg3"]


def test_the_ramdisk_check_names_each_missing_driver(kit: Any) -> None:
    node = pxe_manifest(kit).nodes[1]
    assert preflight.ramdisk_check(node, SERVER_NICS).ok
    bad = preflight.ramdisk_check(node, SERVER_NICS - {"mlx5_core"})
    assert not bad.ok and bad.detail.startswith("lacks the NIC drivers NVIDIA/Mellanox mlx5_core")
    assert "no deploy ramdisk" in preflight.ramdisk_check(node, None).detail


@pytest.mark.parametrize(("disks", "others", "expect"), [
    (("nvme-Samsung_990_S7HE001",), (), None),
    (("ata-ST4000_ZC1", "ata-ST4000_ZC2"), (), None),
    (("wwn-0x5000c500a1b2c3d4",), (), "does not name a disk by its serial"),
    (("nvme-Samsung_990_S7HE001-part1",), (), "does not name a disk by its serial"),
    (("sda",), (), "does not name a disk by its serial"),
    (("nvme-Samsung_990_S7HE001",), ("nvme-Samsung_990_S7HE001",), "is also the install disk of"),
])
def test_the_install_disk_must_be_named_by_serial_and_its_own(kit: Any, disks: tuple[str, ...],
                                                               others: tuple[str, ...], expect: str | None) -> None:
    m = pxe_manifest(kit, disks=disks, others=others)
    check = preflight.disk_check(m, m.nodes[1])
    assert check.ok is (expect is None), check
    if expect:
        assert expect in check.detail
    else:
        assert check.detail.startswith("/dev/disk/by-id/")


def test_the_install_disk_carries_a_serial_the_bmc_lists(kit: Any) -> None:
    m = pxe_manifest(kit, disks=("nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W200001",))
    node = m.nodes[1]
    ok = preflight.disk_check(m, node, ("S7HENJ0W200001", "S7HENJ0W200002"))
    assert ok.ok and ok.detail.endswith("(a drive its BMC lists)")
    wrong = preflight.disk_check(m, node, ("S7HENJ0W200007",))
    assert not wrong.ok and wrong.detail == ("nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W200001 carries none of the "
                                             "serials of the drives its BMC lists (S7HENJ0W200007)")
    assert "lists (none)" in preflight.disk_check(m, node, ()).detail
    # no inventory (IPMI): the name alone, the agent checks the disk is there
    assert preflight.disk_check(m, node, None).detail.endswith("(the agent refuses it if absent)")
    inputs = Inputs({"debian-12": ("debian-12.tar.gz", "a" * 64, None)}, SERVER_NICS,
                    {node.name: (True, "power off", ("S7HENJ0W200007",))})
    assert [c.ok for c in preflight.checks(m, [node.name], inputs) if c.what == "install disk"] == [False]


def test_no_install_disks_fails(kit: Any) -> None:
    m = pxe_manifest(kit)
    node = m.nodes[1].model_copy(update={"install_disks": []})
    assert preflight.disk_check(m, node) == Check(node.name, "install disk", False, "no install_disks in the manifest")


def test_image_and_bmc_checks(kit: Any) -> None:
    node = pxe_manifest(kit).nodes[1]
    assert "run provision image build MANIFEST --os debian-12" in preflight.image_check(
        node, "debian-12.tar.gz", None, None).detail
    unproven = preflight.image_check(node, "debian-12.tar.gz", "a" * 64, "it has no proof (run provision image build)")
    assert not unproven.ok and unproven.detail == "debian-12.tar.gz: it has no proof (run provision image build)"
    assert preflight.image_check(node, "debian-12.tar.gz", "a" * 64, None).ok
    assert preflight.bmc_check(node, True, "power off").detail == "ipmi 127.0.0.1:6230 answers (power off)"
    refused = preflight.bmc_check(node, False, "BMC 127.0.0.1 rejected the credentials for node01")
    assert not refused.ok and refused.detail == "BMC 127.0.0.1 rejected the credentials for node01"


def test_checks_per_method_and_the_refusal(kit: Any) -> None:
    m = pxe_manifest(kit)
    name = m.nodes[1].name
    inputs = Inputs({"debian-12": ("debian-12.tar.gz", None, None)}, SERVER_NICS, {name: (True, "power off", None)})
    found = preflight.checks(m, [name], inputs)
    assert [(c.what, c.ok) for c in found] == [("image", False), ("deploy ramdisk", True), ("install disk", True),
                                              ("BMC", True)]
    text = preflight.refusal(found)
    assert text.splitlines() == [
        "preflight of the PXE installs failed; nothing was changed, no node was armed or powered:",
        f"  {name}: image: FAILED: no debian-12.tar.gz in the image cache: run provision image build MANIFEST "
        "--os debian-12"]
    installer = pxe_manifest(kit, method="installer")
    assert [c.what for c in preflight.checks(installer, [name], Inputs({}, None, None))] == ["install disk"]


# --------------------------------------------------------------------------- edges
def ramdisk(cache: Path, paths: Sequence[str]) -> None:
    tree = cache / "tree"
    for p in paths:
        (tree / p).parent.mkdir(parents=True, exist_ok=True)
        (tree / p).write_bytes(b"\x7fELF module")
    (cache / "deploy-ramdisk").mkdir()
    write_initramfs(tree, cache / "deploy-ramdisk" / "initrd.img")


def test_the_ramdisk_modules_are_read_from_its_initramfs(tmp_path: Path) -> None:
    ramdisk(tmp_path, [*NIC_PATHS, "etc/hostname"])
    assert edges.ramdisk_modules(tmp_path) == SERVER_NICS
    assert edges.ramdisk_modules(tmp_path / "none") is None
    (tmp_path / "deploy-ramdisk" / "initrd.img").write_bytes(b"not gzip")
    with pytest.raises(Exception, match="cannot read the deploy ramdisk"):
        edges.ramdisk_modules(tmp_path)


def publish(kit: Any, m: Manifest, cache: Path, *, proven: bool) -> str:
    image = cache / "debian-12-0123456789abcdef.tar.zst"
    image.write_bytes(b"image")
    digest = "c" * 64
    sidecar(image).write_text(sidecar_line(digest, image))
    (cache / "debian-12.tar.zst").symlink_to(image.name)
    sidecar(cache / "debian-12.tar.zst").write_text(sidecar_line(digest, cache / "debian-12.tar.zst"))
    if proven:
        wanted = packages.wanted(m, "debian-12", "6.1.0-56-amd64")
        looked = proof.sources(packages.os_sources(m, "debian-12"), wanted.repositories)
        record = proof.Record("debian-12", digest, wanted.kernel, looked, wanted.packages)
        proof.record_path(image).write_text(proof.record_text(record))
    return digest


def bmc_says(answers: Mapping[str, tuple[bool, str, tuple[str, ...] | None]]) -> Any:
    def ask(nodes: Sequence[Node]) -> Mapping[str, tuple[bool, str, tuple[str, ...] | None]]:
        return {n.name: answers[n.name] for n in nodes}
    return ask


def test_run_passes_a_proven_image_a_full_ramdisk_and_an_answering_bmc(kit: Any, tmp_path: Path) -> None:
    m = pxe_manifest(kit)
    name = m.nodes[1].name
    ramdisk(tmp_path, NIC_PATHS)
    publish(kit, m, tmp_path, proven=True)
    found = edges.run(m, tmp_path, [name], bmc_says({name: (True, "power off", None)}))
    assert [(c.what, c.ok) for c in found] == [("image", True), ("deploy ramdisk", True), ("install disk", True),
                                              ("BMC", True)], found
    assert edges.run(m, tmp_path, [], bmc_says({})) == []
    # plan asks no BMC
    assert [c.what for c in edges.run(m, tmp_path, [name], None)] == ["image", "deploy ramdisk", "install disk"]


def test_run_fails_an_unproven_image_and_a_silent_bmc(kit: Any, tmp_path: Path) -> None:
    m = pxe_manifest(kit)
    name = m.nodes[1].name
    ramdisk(tmp_path, NIC_PATHS[:-1])  # no tg3
    publish(kit, m, tmp_path, proven=False)
    found = edges.run(m, tmp_path, [name], bmc_says({name: (False, "BMC 127.0.0.1 of node01 is unreachable", None)}))
    bad = {c.what: c.detail for c in preflight.failed(found)}
    assert bad == {"image": "debian-12.tar.zst: it has no proof (run provision image build)",
                   "deploy ramdisk": "lacks the NIC drivers Broadcom tg3: a node booting from such a NIC gets no "
                                     "address",
                   "BMC": "BMC 127.0.0.1 of node01 is unreachable"}


def test_a_proof_of_fewer_packages_does_not_cover_a_manifest_that_asks_for_more(kit: Any, tmp_path: Path) -> None:
    m = pxe_manifest(kit)
    name = m.nodes[1].name
    ramdisk(tmp_path, NIC_PATHS)
    publish(kit, m, tmp_path, proven=True)
    more = m.model_copy(update={"role_vars": {"all": {"common_packages": ["htop", "iotop"]}}})
    found = edges.run(more, tmp_path, [name], None)
    assert found[0].what == "image" and not found[0].ok
    assert "its proof does not cover iotop" in found[0].detail
