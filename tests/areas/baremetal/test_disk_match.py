"""The autoinstall disk actions against the Ubuntu installer's own rules for finding disks.

Two models, written from the vendors' sources (not copied):

* udev (systemd's rules.d/60-persistent-storage.rules): which ID_SERIAL a disk gets and
  which /dev/disk/by-id links point to it. NVMe: ID_SERIAL is ``<model>_<serial>``; from
  systemd 254 on the last rule rewrites it to ``<model>_<serial>_<namespace id>`` and adds
  that link (Ubuntu 22.04 runs systemd 249, 24.04 runs 255). ATA: ``ata-<model>_<serial>``;
  virtio: ``virtio-<serial>``; SAS: ``scsi-<ID_SERIAL>``; WWNs: ``wwn-``/``nvme-eui.`` links.
* subiquity (subiquity/models/storage.py, ``apply_autoinstall_config`` and
  ``_make_matchers``): a disk action with ``serial`` takes the probed disk whose serial
  (curtin's ID_SERIAL) is equal; with ``path`` the disk whose kernel path (/dev/nvme0n1) is
  equal; otherwise its ``match`` directive filters the disks not used yet (``serial`` and
  ``path`` are fnmatch patterns over ID_SERIAL and the kernel path, size must be non-zero),
  sorts them (wwn, serial, path) and takes the first. No disk: "<action> matched no disk".
  curtin then validates the action (match removed, path and serial added) against its
  CURTIN-DISK schema, which allows only the keys below.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.baremetal import decide as ic
from provisioner.areas.baremetal import seeds
from provisioner.errors import ManifestError
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.validate import load_manifest, load_text

ROOT = Path(__file__).resolve().parents[3]
SYSTEMD = {"ubuntu-22.04": 249, "ubuntu-24.04": 255}
CURTIN_DISK_KEYS = {"id", "name", "multipath", "device_id", "preserve", "wipe", "type", "ptable", "serial",
                    "path", "model", "wwn", "grub_device", "nvme_controller"}


@dataclass(frozen=True)
class Probed:
    kernel: str
    bus: str  # nvme, ata, virtio, sas
    model: str
    serial: str
    wwn: str
    nsid: int = 1
    size: int = 2 * 10**12


def udev(disk: Probed, systemd: int) -> tuple[str, list[str]]:
    """(ID_SERIAL, by-id link names) of a whole disk."""
    model = "_".join(disk.model.split())  # OPTIONS="string_escape=replace"
    if disk.bus == "nvme":
        serial = f"{model}_{disk.serial}"
        links = [f"nvme-eui.{disk.wwn}", f"nvme-{serial}"]
        if systemd >= 254:
            serial = f"{serial}_{disk.nsid}"
            links.append(f"nvme-{serial}")
        return serial, links
    if disk.bus == "ata":
        serial = f"{model}_{disk.serial}"
        return serial, [f"ata-{serial}", f"wwn-0x{disk.wwn}"]
    if disk.bus == "virtio":
        return disk.serial, [f"virtio-{disk.serial}"]
    serial = f"3{disk.wwn}"  # SAS: scsi_id's NAA identifier
    return serial, [f"scsi-{serial}", f"wwn-0x{disk.wwn}"]


class MatchedNoDisk(AssertionError):
    pass


def subiquity_assign(config: list[dict[str, Any]], disks: list[Probed], systemd: int) -> dict[str, Probed]:
    """Disk action id -> the probed disk subiquity picks; raises like the installer."""
    serial_of = {d.kernel: udev(d, systemd)[0] for d in disks}
    remaining = list(disks)
    picked: dict[str, Probed] = {}
    for action in config:
        if action["type"] != "disk":
            continue
        disk: Probed | None
        if "serial" in action:
            disk = next((d for d in disks if serial_of[d.kernel] == action["serial"]), None)
        elif "path" in action:
            disk = next((d for d in disks if d.kernel == action["path"]), None)
        else:
            match = action.get("match", {})
            candidates = [
                d for d in remaining
                if d.size != 0
                and ("serial" not in match or fnmatch.fnmatchcase(serial_of[d.kernel], match["serial"]))
                and ("path" not in match or fnmatch.fnmatchcase(d.kernel, match["path"]))
            ]
            candidates.sort(key=lambda d: (d.wwn, serial_of[d.kernel], d.kernel))
            disk = candidates[0] if candidates else None
        if disk is None:
            raise MatchedNoDisk(f"{action} matched no disk")
        if disk not in remaining:
            raise MatchedNoDisk(f"{action} matched {disk.kernel} which was already used")
        remaining.remove(disk)
        picked[action["id"]] = disk
        after = {k: v for k, v in action.items() if k != "match"} | {"path": disk.kernel,
                                                                    "serial": serial_of[disk.kernel]}
        assert set(after) <= CURTIN_DISK_KEYS, set(after) - CURTIN_DISK_KEYS
    return picked


# A machine with look-alike disks: two NVMe of one model whose serials share a prefix, two
# SATA SSDs of one model, a virtio disk and a SAS disk.
MACHINE = [
    Probed("/dev/nvme0n1", "nvme", "Samsung SSD 990 PRO 2TB", "S7HENJ0W2000012", "002538b9a1b2c3d4"),
    Probed("/dev/nvme1n1", "nvme", "Samsung SSD 990 PRO 2TB", "S7HENJ0W200001", "002538b9a1b2c3d5"),
    Probed("/dev/sda", "ata", "Samsung SSD 870 EVO 500GB", "S6PWNX0T100001A", "5002538f00000001"),
    Probed("/dev/sdb", "ata", "Samsung SSD 870 EVO 500GB", "S6PWNX0T100002B", "5002538f00000002"),
    Probed("/dev/vda", "virtio", "", "lab[root]*", "0"),
    Probed("/dev/sdc", "sas", "SEAGATE ST4000NM0023", "Z1Z0AB12", "5000c500a1b2c3d4"),
]


def link(disk: Probed, prefix: str, systemd: int = 249) -> str:
    """The by-id link of ``disk`` that starts with ``prefix`` (249: the names every release has)."""
    return next(name for name in udev(disk, systemd)[1] if name.startswith(prefix))


def gpu_node(os_name: str, boot: str, disks: list[str]) -> tuple[Manifest, Node]:
    m = load_manifest(ROOT / "examples" / "llm-200k.yaml").manifest
    node = m.node("gpu01")
    assert node.bmc is not None
    node = node.model_copy(update={"os": os_name, "install_disks": disks,
                                   "bmc": node.bmc.model_copy(update={"boot_mode": boot})})
    return m.model_copy(update={"nodes": [node if n.name == node.name else n for n in m.nodes]}), node


def test_a_by_id_path_matches_no_disk_in_the_installer() -> None:
    """What the installer did with our old actions (path: /dev/disk/by-id/...)."""
    target = MACHINE[1]
    action = {"type": "disk", "id": "disk0", "path": f"/dev/disk/by-id/{link(target, 'nvme-Samsung')}"}
    with pytest.raises(MatchedNoDisk, match="matched no disk"):
        subiquity_assign([action], MACHINE, 249)


CASES = [
    ("one NVMe", [(1, "nvme-Samsung")]),
    ("NVMe RAID1", [(1, "nvme-Samsung"), (0, "nvme-Samsung")]),
    ("SATA RAID1", [(3, "ata-"), (2, "ata-")]),
    ("virtio with pattern characters", [(4, "virtio-")]),
    ("SAS", [(5, "scsi-")]),
]


@pytest.mark.parametrize("os_name", sorted(SYSTEMD))
@pytest.mark.parametrize("boot", ["uefi", "legacy"])
@pytest.mark.parametrize(("name", "wanted"), CASES, ids=[c[0] for c in CASES])
def test_installer_finds_exactly_the_install_disks(os_name: str, boot: str, name: str,
                                                   wanted: list[tuple[int, str]]) -> None:
    targets = [MACHINE[i] for i, _ in wanted]
    _m, node = gpu_node(os_name, boot, [link(MACHINE[i], prefix) for i, prefix in wanted])
    config = seeds.curtin_storage(node)
    disk_actions = [a for a in config if a["type"] == "disk"]
    assert all("path" not in a and a["match"]["serial"] for a in disk_actions)  # never an empty match
    picked = subiquity_assign(config, MACHINE, SYSTEMD[os_name])
    assert [picked[a["id"]] for a in disk_actions] == targets
    assert [a["grub_device"] for a in disk_actions] == [boot == "legacy"] * len(targets)


def test_namespace_suffixed_nvme_link_on_24_04() -> None:
    target = MACHINE[0]
    suffixed = next(n for n in udev(target, 255)[1] if n.endswith("_1"))
    _m, node = gpu_node("ubuntu-24.04", "uefi", [suffixed])
    picked = subiquity_assign(seeds.curtin_storage(node), MACHINE, 255)
    assert picked["disk0"] == target


@pytest.mark.parametrize(("disk", "why"), [
    ("wwn-0x5002538f00000001", "World Wide Name"),
    ("nvme-eui.002538b9a1b2c3d4", "EUI-64"),
    ("scsi-SATA_Samsung_SSD_870_S6PWNX0T100001A", "SCSI compatibility name"),
    ("nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W200001-part2", "partition"),
    ("md-uuid-1234", "carries no disk serial"),
])
def test_names_without_a_serial_are_refused(disk: str, why: str) -> None:
    with pytest.raises(ic.InstallConfigError, match=why):
        ic.installer_disk_serial(disk, "ubuntu-24.04")
    # validate says so at the node's install_disks, for Ubuntu nodes only
    text = (ROOT / "examples" / "llm-200k.yaml").read_text()
    old = '["nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W2000[01-04]"]'
    assert old in text
    with pytest.raises(ManifestError) as err:
        load_text(text.replace(old, f'["{disk}"]'), "llm.yaml")
    diag = err.value.diagnostics[0]
    assert diag.path == "nodes[1].install_disks[0]" and why in diag.message
    # the Debian installer resolves any by-id link (these nodes without GPUs: Debian has no
    # Canonical driver source)
    debian = text.replace(old, f'["{disk}"]').replace("os: ubuntu-22.04\n    install_disks: [\"" + disk,
                                                      "os: debian-12\n    install_disks: [\"" + disk)
    debian = debian.replace("      gpu: {model: RTX A6000, count: 2, memory_gb: 48, nvlink: true}\n", "")
    # the head too: slurmctld must run the newest Slurm (Debian 12's 22.05 > Ubuntu 22.04's 21.08)
    debian = debian.replace("os: ubuntu-22.04", "os: debian-12")
    assert "os: debian-12" in debian and "gpu: {model" not in debian
    assert load_text(debian, "llm.yaml").manifest


def test_namespace_suffix_before_systemd_254_is_a_warning() -> None:
    text = (ROOT / "examples" / "llm-200k.yaml").read_text()
    text = text.replace("S7HENJ0W2000[01-04]", "S7HENJ0W2000[01-04]_1")
    warnings = load_text(text, "llm.yaml").warnings  # once for the four nodes of gpu[01-04]
    assert [w.path for w in warnings if "namespace" in w.message] == ["nodes[1].install_disks[0]"]
