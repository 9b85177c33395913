"""Local scratch, pure: a node's ``use: scratch`` disks as one file system at a path.

* Layout: one disk gets one GPT partition; several become RAID 0 (``mdadm``) or one striped
  logical volume (``lvm``) over one partition each. The partitions carry the GPT name
  :data:`PARTLABEL`, the file system the label :data:`FS_LABEL`: that is how the scratch
  role knows its own work again.
* Paths by id: members ``/dev/disk/by-id/<disk>-part1``, the RAID ``md-name-any:scratch``
  (created with ``--homehost=any``, so it keeps its name on any host), the LV
  ``dm-name-scratch-scratch``; the mount names the same path.
* Safety, as for ZFS pools (:func:`provisioner.areas.storage.decide.disk_findings`): a
  missing or mounted disk always refuses; partitions, partition tables and signatures refuse
  unless the node's ``scratch.force`` says so. Only an empty partition of our own (a first
  run that stopped after partitioning) counts as nothing.
* Checks for validate: paths that must lie on a node's scratch (Docker's data-root), GPU
  compute nodes without any.

The scratch role reaches the runtime parts (safety, "is the volume there") through its
filter plugin, so the same code decides in unit tests and on real machines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from provisioner.areas.storage.base import BY_ID_DIR, StorageError, merge_options
from provisioner.areas.storage.disks import DiskProbe, Findings, SafetyVerdict, disk_findings, disk_safety
from provisioner.areas.storage.mergerfs import unions_for
from provisioner.areas.storage.nfs import dataset_mountpoint, mounts_for
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node, Scratch
from provisioner.manifest.ranges import expand_all

PARTLABEL = "provision-scratch"  # GPT partition name of every scratch partition we make
FS_LABEL = "scratch"  # file system label (xfs allows 12 characters, ext4 16)
MD_NAME = "scratch"  # mdadm --name, with --homehost=any: the array's name is any:scratch
LVM_VG = "scratch"
LVM_LV = "scratch"
BASE_OPTIONS = ("noatime", "nofail")  # nofail: a dead NVMe must not stop the node's boot
# Where a path sits on the root file system by convention (Docker's own default is there).
ROOT_FS_PREFIX = "/var/lib/"
# What GPT leaves on a whole disk besides its table: ours when the disk's one partition is.
_TABLE_SIGNATURES = frozenset({"gpt", "PMBR"})

Layout = Literal["single", "mdadm", "lvm"]


@dataclass(frozen=True)
class ScratchVolume:
    """The scratch file system of one node, as the scratch role builds it."""

    path: str
    fs: str
    layout: Layout
    disks: tuple[str, ...]
    options: tuple[str, ...]
    force: bool

    @property
    def members(self) -> list[str]:
        """The partitions the volume is made of (one per disk)."""
        return [partition_path(d) for d in self.disks]

    @property
    def device(self) -> str:
        """The block device that carries the file system, by id (also the mount's source)."""
        if self.layout == "mdadm":
            return f"{BY_ID_DIR}/md-name-any:{MD_NAME}"
        if self.layout == "lvm":
            return f"{BY_ID_DIR}/dm-name-{LVM_VG}-{LVM_LV}"
        return self.members[0]

    def summary(self) -> str:
        """``2 disks, RAID 0 (mdadm), xfs at /scratch`` (for plan and messages)."""
        what = {"single": "1 disk", "mdadm": f"{len(self.disks)} disks, RAID 0 (mdadm)",
                "lvm": f"{len(self.disks)} disks, striped LVM"}[self.layout]
        return f"{what}, {self.fs} at {self.path}"

    def to_vars(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "fs": self.fs,
            "layout": self.layout,
            "disks": list(self.disks),
            "members": self.members,
            "device": self.device,
            "label": FS_LABEL,
            "partlabel": PARTLABEL,
            "md_name": MD_NAME,
            "vg": LVM_VG,
            "lv": LVM_LV,
            "mkfs_options": mkfs_options(self.fs),
            "mount_options": ",".join(self.options),
            "force": self.force,
            "summary": self.summary(),
        }


def partition_path(disk: str) -> str:
    return f"{BY_ID_DIR}/{disk}-part1"


def scratch_disks(node: Node) -> list[str]:
    """The node's ``use: scratch`` disks, ranges expanded, in manifest order."""
    return expand_all([d.id for d in node.hardware.disks if d.use == "scratch"])


def mkfs_options(fs: str) -> str:
    """mkfs options: our label; ext4 keeps no blocks for root (it is scratch, not /)."""
    if fs == "ext4":
        return f"-L {FS_LABEL} -m 0"
    if fs == "xfs":
        return f"-L {FS_LABEL}"
    raise StorageError(f"scratch: unknown file system {fs!r}")


def mount_options(settings: Scratch) -> tuple[str, ...]:
    """noatime,nofail and the manifest's own (which win over a generated one)."""
    return tuple(merge_options(BASE_OPTIONS, settings.options))


def scratch_volume(node: Node) -> ScratchVolume | None:
    """The node's scratch volume (None: no ``use: scratch`` disk). StorageError where the
    node's ``scratch:`` settings have no disk to act on, or a disk is listed twice."""
    disks = scratch_disks(node)
    if not disks:
        if node.scratch is not None:
            raise StorageError("scratch: is set, but no disk in hardware.disks has use: scratch")
        return None
    if len(set(disks)) != len(disks):
        dup = next(d for d in disks if disks.count(d) > 1)
        raise StorageError(f"scratch disk {dup!r} is listed twice")
    settings = node.scratch or Scratch()
    layout: Layout = "single" if len(disks) == 1 else settings.raid
    return ScratchVolume(settings.path, settings.fs, layout, tuple(disks), mount_options(settings), settings.force)


# =========================================================================== on the node
def blkid_fields(text: str) -> dict[str, str]:
    """``blkid -o export DEVICE`` output as a dict (empty output: no signature)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def volume_ready(blkid_text: str, fs: str) -> bool:
    """Does the volume's device carry our file system (its type and our label)? Then the
    role only mounts it: nothing is partitioned, assembled or formatted again."""
    fields = blkid_fields(blkid_text)
    return fields.get("TYPE") == fs and fields.get("LABEL") == FS_LABEL


def _our_empty_partitions(probe: DiskProbe) -> bool:
    """A GPT disk whose partitions are all ours and empty (no file system or member
    signature, nothing below them, nothing mounted): an earlier run partitioned it."""
    devices = (probe.lsblk or {}).get("blockdevices") or []
    if not devices:
        return False
    for top in devices:
        parts = top.get("children") or []
        if top.get("pttype") != "gpt" or top.get("fstype") or top.get("mountpoint") or not parts:
            return False
        for part in parts:
            if (part.get("partlabel") != PARTLABEL or part.get("fstype") or part.get("children")
                    or part.get("mountpoint") or part.get("mountpoints") not in (None, [], [None])):
                return False
    return True


def scratch_findings(probe: DiskProbe) -> Findings:
    """What on a disk refuses its use as scratch: :func:`disk_findings`, except that our
    own empty partition (and the GPT table around it) is no data."""
    if not probe.exists or not _our_empty_partitions(probe):
        return disk_findings(probe)
    rest = tuple(s for s in probe.signatures if str(s.get("type")) not in _TABLE_SIGNATURES)
    return disk_findings(DiskProbe(probe.disk, True, lsblk=None, signatures=rest))


def scratch_safety(probes: Iterable[DiskProbe], force: bool) -> SafetyVerdict:
    """May the scratch volume be made on these disks? Missing or mounted disks always
    refuse; data (partitions, tables, signatures not ours) refuses unless ``force``."""
    return disk_safety(probes, force, scratch_findings)


def wipe_targets(probes: Iterable[DiskProbe]) -> list[str]:
    """What ``wipefs --all`` erases before a forced use, per disk that holds data: its
    partitions first, then the disk (kernel names, as lsblk shows them)."""
    out: list[str] = []
    for probe in probes:
        if not probe.exists or not scratch_findings(probe).data:
            continue
        for top in (probe.lsblk or {}).get("blockdevices") or []:
            parts = [str(p["name"]) for p in top.get("children") or () if p.get("type") == "part" and p.get("name")]
            out.extend(f"/dev/{name}" for name in [*parts, str(top.get("name", ""))] if name)
    return out


# =========================================================================== validate
def under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def provisioned_mounts(m: Manifest, node: Node) -> list[tuple[str, str]]:
    """(mount point, what) of the local file systems the manifest makes on ``node``: its
    scratch and the mountpoints of its ZFS pools and datasets."""
    out: list[tuple[str, str]] = []
    volume = scratch_volume(node)
    if volume is not None:
        out.append((volume.path, "scratch"))
    for pool in m.zfs.pools:
        if pool.node != node.name:
            continue
        for name in [pool.name, *(f"{pool.name}/{ds.name}" for ds in pool.datasets)]:
            try:
                out.append((dataset_mountpoint(m, node.name, name), f"ZFS {name}"))
            except StorageError:
                continue  # not mounted (mountpoint=none/legacy): nothing lives there
    return out


def local_path_problem(m: Manifest, node: Node, path: str, what: str, folder: str = "docker") -> str | None:
    """Why ``path`` (``what`` names the setting) cannot hold bulk data on ``node``, or None.

    Under /var/lib it stays on the root file system, as the daemons' defaults do. Anywhere
    else it must lie below a file system the manifest makes there (scratch, a ZFS dataset);
    a path on no such file system is a folder on the root disk that fills it. The mount
    point itself is refused: the role owning the folder would fight the scratch role over
    its mode. ``folder``: the example folder below the mount point the message suggests."""
    if under(path, ROOT_FS_PREFIX.rstrip("/")):
        return None
    mounts = provisioned_mounts(m, node)
    for point, kind in mounts:
        if path == point:
            return (f"{what} {path} is the mount point of {node.name}'s {kind} itself; "
                    f"use a folder below it (e.g. {point.rstrip('/')}/{folder})")
        if under(path, point):
            return None
    volume = scratch_volume(node)
    have = f"its scratch is at {volume.path}" if volume else "it has no disk with use: scratch"
    return (f"{what} {path} is on no file system the manifest makes on {node.name} ({have}): it would be a "
            "folder on the root disk; give the node scratch disks (hardware.disks: use: scratch, "
            "mounted at scratch.path, default /scratch), point it below that path, or keep it under /var/lib")


def mount_clash(m: Manifest, node: Node) -> str | None:
    """Why the node's scratch path cannot be mounted there (None: it can): another file
    system the manifest puts on the node (an NFS mount, a MergerFS union, a ZFS dataset)
    has the same mount point, and one would hide the other."""
    volume = scratch_volume(node)
    if volume is None:
        return None
    others = [(mnt.path, f"the NFS mount of export {mnt.export!r}") for mnt in mounts_for(m, node)]
    others += [(union.path, "a MergerFS union") for union in unions_for(m, node)]
    others += [(point, kind) for point, kind in provisioned_mounts(m, node) if kind != "scratch"]
    for point, what in others:
        if point == volume.path:
            return (f"scratch.path {volume.path} is also the mount point of {what} on {node.name}: "
                    "one would hide the other; give scratch another path (e.g. /scratch)")
    return None


def lacks_scratch(node: Node) -> bool:
    """A GPU compute node without local scratch: datasets, images and job tmp go to the
    root disk or NFS."""
    return node.gpu_count > 0 and node.has_role("compute") and not scratch_disks(node)



def format_summary(m: Manifest, node: Node) -> str:
    """What the scratch role may do to the node's disks, in words, for plan ("" without
    scratch): blank disks are partitioned and formatted; disks holding data are refused, or
    with ``scratch.force`` overwritten. A volume already made is only mounted."""
    volume = scratch_volume(node)
    if volume is None:
        return ""
    disks = ", ".join(volume.disks)
    if volume.force:
        return f"scratch FORCE: overwrites {disks} ({volume.summary()}) even where they hold data"
    return f"scratch: formats {disks} where blank ({volume.summary()}); disks holding data are refused"
