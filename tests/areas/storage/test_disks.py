"""provisioner.areas.storage.disks: whether a pool may take a disk, from lsblk and wipefs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import base, disks

ROOT = Path(__file__).resolve().parents[3]
HGST = "ata-HGST_HUS726T6TALE6L4_V8G0000"


# =========================================================================== disk safety
def lsblk(children: list[dict[str, Any]] | None = None, **top: Any) -> str:
    dev: dict[str, Any] = {"name": "sdb", "type": "disk", "fstype": None, "pttype": None,
                           "mountpoint": None}
    dev.update(top)
    if children:
        dev["children"] = children
    return json.dumps({"blockdevices": [dev]})


def wipefs(*sigs: tuple[str, str]) -> str:
    if not sigs:
        return ""  # wipefs prints nothing for a blank disk
    return json.dumps({"signatures": [
        {"device": "sdb", "offset": off, "type": kind, "uuid": None, "label": None}
        for kind, off in sigs
    ]})


def probe(disk: str = "ata-X", exists: bool = True, lsblk_text: str = "", wipefs_text: str = "") -> disks.DiskProbe:
    return disks.DiskProbe.from_outputs(disk, exists, lsblk_text or (lsblk() if exists else ""), wipefs_text)


def test_blank_disks_are_safe() -> None:
    verdict = disks.disk_safety([probe("a"), probe("b")], force=False)
    assert verdict == disks.SafetyVerdict(ok=True)


def test_partitions_refuse_unless_forced() -> None:
    used = probe(lsblk_text=lsblk(
        [{"name": "sdb1", "type": "part", "fstype": "ext4", "mountpoint": None}], pttype="gpt"),
        wipefs_text=wipefs(("gpt", "0x200"), ("PMBR", "0x1fe")))
    refused = disks.disk_safety([used], force=False)
    assert not refused.ok
    assert refused.refused == (
        "ata-X: has a gpt partition table",
        "ata-X: has part sdb1 (ext4)",
        "ata-X: carries a PMBR signature at offset 0x1fe",
    )
    forced = disks.disk_safety([used], force=True)
    assert forced.ok
    assert forced.overridden == refused.refused
    assert forced.refused == ()


def test_filesystem_signature_on_whole_disk() -> None:
    verdict = disks.disk_safety([probe(lsblk_text=lsblk(fstype="xfs"), wipefs_text=wipefs(("xfs", "0x0")))], False)
    assert verdict.refused == ("ata-X: holds a xfs signature",)


def test_zfs_label_gets_a_hint() -> None:
    verdict = disks.disk_safety([probe(wipefs_text=wipefs(("zfs_member", "0x3f000")))], False)
    assert verdict.refused == (
        "ata-X: carries a zfs_member signature at offset 0x3f000 (a ZFS label: an old or foreign pool)",
    )


def test_mounted_or_missing_disks_refuse_even_with_force() -> None:
    mounted = probe("os", lsblk_text=lsblk(
        [{"name": "sdb1", "type": "part", "fstype": "vfat", "mountpoint": "/boot/efi"},
         {"name": "sdb2", "type": "part", "fstype": "swap", "mountpoints": ["[SWAP]"]}]))
    missing = probe("gone", exists=False)
    verdict = disks.disk_safety([mounted, missing, probe("fine")], force=True)
    assert not verdict.ok
    assert verdict.refused == (
        "os: sdb1 is in use (mounted at /boot/efi)",
        "os: sdb2 is in use (mounted at [SWAP])",
        "gone: not present under /dev/disk/by-id",
    )
    assert "os: has part sdb1 (vfat)" in verdict.overridden


def test_unreadable_probe_output() -> None:
    with pytest.raises(base.StorageError, match="lsblk"):
        disks.DiskProbe.from_outputs("a", True, "{not json", "")
    with pytest.raises(base.StorageError, match="wipefs"):
        disks.DiskProbe.from_outputs("a", True, lsblk(), "[1, 2")


def test_probes_from_registered_ansible_loops() -> None:
    lsblk_results = [
        {"item": "a", "rc": 0, "stdout": lsblk()},
        {"item": "b", "rc": 32, "stdout": "", "stderr": "lsblk: /dev/disk/by-id/b: not a block device"},
    ]
    wipefs_results = [
        {"item": "a", "rc": 0, "stdout": wipefs(("ext4", "0x438"))},
        {"item": "b", "rc": 1, "stdout": ""},
    ]
    probes = disks.probes_from_ansible(lsblk_results, wipefs_results)
    assert [(p.disk, p.exists) for p in probes] == [("a", True), ("b", False)]
    verdict = disks.disk_safety(probes, force=False)
    assert verdict.refused == (
        "a: carries a ext4 signature at offset 0x438",
        "b: not present under /dev/disk/by-id",
    )
