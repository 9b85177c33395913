"""provisioner.areas.storage.precheck: the disks a new scratch volume or pool would take,
judged before an apply from the observations the roles make (lsblk, wipefs, blkid, zpool),
with the roles' own functions. The commands meet real disks in the VM lab (test_lab.py's
refused apply)."""

from __future__ import annotations

import json
from typing import Any

from provisioner.areas.storage import precheck as P
from provisioner.areas.storage import scratch as S

EXT4 = json.dumps({"signatures": [{"device": "sdb", "offset": "0x438", "type": "ext4", "uuid": "cdb5",
                                   "label": "keepme"}]})


def lsblk(name: str, fstype: str | None = None, mountpoint: str | None = None) -> str:
    return json.dumps({"blockdevices": [{"name": name, "type": "disk", "fstype": fstype, "pttype": None,
                                         "partlabel": None, "mountpoint": mountpoint}]})


def manifest(kit: Any, *, force: bool = False, scratch_layout: str | None = None) -> Any:
    data = kit.base(storage=True)
    data["zfs"]["pools"][0]["force"] = force
    if scratch_layout:
        data["nodes"][1]["hardware"]["disks"] = [{"id": "nvme-SCRATCH_[1-2]", "kind": "nvme", "use": "scratch"}]
        data["nodes"][1]["scratch"] = {"raid": scratch_layout}
    return kit.load(data).manifest


def blank(m: Any, node: str, lsblk_of: dict[str, tuple[int, str]] | None = None
          ) -> dict[tuple[str, ...], tuple[int, str]]:
    """Every command answered as on a real machine with blank disks and nothing made yet;
    ``lsblk_of``: other lsblk answers, by disk."""
    out: dict[tuple[str, ...], tuple[int, str]] = {}
    for argv in P.commands(m, m.node(node)):
        if argv == P.IN_CONTAINER:
            out[argv] = (1, "none\n")
        elif argv[0] == "lsblk":
            out[argv] = (0, lsblk(argv[-1].rsplit("/", 1)[-1]))
        elif argv[:2] == ("zpool", "import"):
            out[argv] = (1, "no pools available to import\n")
        elif argv[0] in ("zpool", "blkid", "test"):
            out[argv] = (1 if argv[0] != "blkid" else 2, "")
        else:  # wipefs of a blank disk, the layout tool's version
            out[argv] = (0, "")
    for disk, answer in (lsblk_of or {}).items():
        out[P.disk_commands(disk)[0]] = answer
    return out


def test_reads_each_disk_once_with_what_tells_a_pool_made_before(kit: Any) -> None:
    m = manifest(kit)
    argvs = P.commands(m, m.node("head01"))
    assert argvs[0] == P.IN_CONTAINER
    assert ("zpool", "list", "-H", "-o", "name", "tank") in argvs and P.ZPOOL_IMPORTABLE in argvs
    disks = [a[-1] for a in argvs if a[0] == "wipefs"]
    assert disks == [f"/dev/disk/by-id/ata-DISK_{i}" for i in range(1, 5)]
    assert len(argvs) == len(set(argvs))
    assert P.commands(m, m.node("node01"))[1][:4] == ("blkid", "-p", "-o", "export")


def test_a_node_with_nothing_to_make_reads_nothing(kit: Any) -> None:
    m = kit.load(kit.base()).manifest  # no pools; head01 has no scratch disk
    assert P.commands(m, m.node("head01")) == []


def test_blank_disks_pass(kit: Any) -> None:
    m = manifest(kit)
    assert P.refusals(m, m.node("head01"), blank(m, "head01")) == ([], [])
    assert P.refusals(m, m.node("node01"), blank(m, "node01")) == ([], [])


def test_a_disk_with_a_filesystem_refuses_in_the_roles_words(kit: Any) -> None:
    m = manifest(kit)
    out = blank(m, "head01")
    out[P.disk_commands("ata-DISK_3")[0]] = (0, lsblk("sdc", fstype="ext4"))
    out[P.disk_commands("ata-DISK_3")[1]] = (0, EXT4)
    refused, notes = P.refusals(m, m.node("head01"), out)
    assert refused[0].startswith("REFUSED: pool tank is not created; its disks are missing, in use or hold data")
    assert refused[1:] == ["ata-DISK_3: holds a ext4 signature"]
    assert notes == []


def test_force_takes_a_disk_with_data_but_never_a_missing_or_mounted_one(kit: Any) -> None:
    m = manifest(kit, force=True)
    out = blank(m, "head01")
    out[P.disk_commands("ata-DISK_3")[0]] = (0, lsblk("sdc", fstype="ext4"))
    assert P.refusals(m, m.node("head01"), out) == ([], [])
    out[P.disk_commands("ata-DISK_2")[0]] = (0, lsblk("sdb", fstype="ext4", mountpoint="/srv"))
    out[P.disk_commands("ata-DISK_4")[0]] = (32, "")  # lsblk: no such device
    refused, _ = P.refusals(m, m.node("head01"), out)
    assert refused[1:] == ["ata-DISK_2: sdb is in use (mounted at /srv)",
                           "ata-DISK_4: not present under /dev/disk/by-id"]


def test_a_pool_made_before_is_not_probed(kit: Any) -> None:
    m = manifest(kit)
    mounted = (0, lsblk("sda", fstype="zfs_member", mountpoint="/tank"))
    listed = blank(m, "head01", {"ata-DISK_1": mounted})
    listed[("zpool", "list", "-H", "-o", "name", "tank")] = (0, "tank\n")
    assert P.refusals(m, m.node("head01"), listed) == ([], [])
    importable = blank(m, "head01", {"ata-DISK_1": mounted})
    importable[P.ZPOOL_IMPORTABLE] = (0, "   pool: tank\n     id: 123\n  state: ONLINE\n")
    assert P.refusals(m, m.node("head01"), importable) == ([], [])


def test_without_zpool_the_pool_is_left_to_the_role(kit: Any) -> None:
    """ZFS not installed yet: the role installs it and may find the pool to import."""
    m = manifest(kit)
    out = blank(m, "head01", {"ata-DISK_1": (0, lsblk("sda", fstype="zfs_member"))})
    out[("zpool", "list", "-H", "-o", "name", "tank")] = (P.MISSING, "")
    out[P.ZPOOL_IMPORTABLE] = (P.MISSING, "")
    assert P.refusals(m, m.node("head01"), out) == (
        [], ["pool tank: not read before the apply (zpool is not installed yet); the role checks its disks"])


def test_a_scratch_volume_made_before_is_only_used(kit: Any) -> None:
    m = manifest(kit)
    volume = S.scratch_volume(m.node("node01"))
    assert volume is not None
    ours = f"TYPE={volume.fs}\nLABEL={S.FS_LABEL}\n"
    out = blank(m, "node01", {"nvme-SCRATCH": (0, lsblk("nvme0n1", fstype="ext4"))})
    out[("blkid", "-p", "-o", "export", volume.device)] = (0, ours)
    assert P.refusals(m, m.node("node01"), out) == ([], [])
    out[("blkid", "-p", "-o", "export", volume.device)] = (2, "")
    refused, _ = P.refusals(m, m.node("node01"), out)
    assert refused[0].startswith(f"REFUSED: scratch volume {volume.summary()} is not made")
    assert "(scratch.force: true overwrites data)" in refused[0]


def test_an_array_of_ours_without_a_filesystem_is_not_probed(kit: Any) -> None:
    m = manifest(kit, scratch_layout="mdadm")
    volume = S.scratch_volume(m.node("node01"))
    assert volume is not None and volume.layout == "mdadm"
    member = (0, lsblk("nvme0n1", fstype="linux_raid_member"))
    out = blank(m, "node01", {"nvme-SCRATCH_1": member})
    assert P.refusals(m, m.node("node01"), out)[0]  # no array there: the member refuses
    out[("test", "-e", volume.device)] = (0, "")
    assert P.refusals(m, m.node("node01"), out) == ([], [])
    out[("mdadm", "--version")] = (P.MISSING, "")
    assert P.refusals(m, m.node("node01"), out) == (
        [], [f"scratch volume {volume.summary()}: not read before the apply (mdadm is not installed yet); "
             "the role checks its disks"])


def test_in_a_container_nothing_is_judged(kit: Any) -> None:
    """The roles skip kernel work in a container (and say so): no disk is theirs to refuse."""
    m = manifest(kit)
    out = blank(m, "head01", {"ata-DISK_1": (32, "")})
    out[P.IN_CONTAINER] = (0, "podman\n")
    assert P.refusals(m, m.node("head01"), out) == ([], [])
