"""The disks apply would take, read before it changes anything, pure.

A node's new scratch volume and new ZFS pools take disks that must be blank (or forced).
The scratch and zfs roles check them on the node before they write, and fail there; by
then the apply has already run the plays before storage on every node. Read first, from
the control machine, the same observations the roles make (``blkid``, ``zpool list`` and
``zpool import``, ``lsblk`` and ``wipefs`` of each disk) and judge them with the same
functions (:func:`provisioner.areas.storage.scratch.scratch_safety`,
:func:`provisioner.areas.storage.disks.disk_safety`): a disk that holds data or is in use
refuses the apply before anything runs anywhere.

What cannot be judged here is left to the role, with a note: a container (the roles skip
kernel work there), or a node without the tool that tells a volume or pool made before
(``zpool``, ``mdadm``, ``lvm``: the role installs it and may find one to import or assemble).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from provisioner.areas.storage.base import BY_ID_DIR
from provisioner.areas.storage.disks import disk_safety, probes_from_ansible
from provisioner.areas.storage.scratch import ScratchVolume, scratch_safety, scratch_volume, volume_ready
from provisioner.areas.storage.zfs import importable_pools, pool_layout
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

Argv = tuple[str, ...]
Outputs = Mapping[Argv, tuple[int, str]]  # per command: its exit status and standard output

IN_CONTAINER: Argv = ("systemd-detect-virt", "--container")
ZPOOL_IMPORTABLE: Argv = ("zpool", "import", "-d", BY_ID_DIR)
# The columns both roles ask lsblk for (the scratch role's: the zfs role's and PARTLABEL).
LSBLK_COLUMNS = "NAME,TYPE,FSTYPE,PTTYPE,PARTLABEL,MOUNTPOINT"
# The tool that finds a volume made before, per scratch layout ("" for one disk: blkid does).
LAYOUT_TOOL: dict[str, Argv] = {"mdadm": ("mdadm", "--version"), "lvm": ("lvm", "version")}
MISSING = 127  # a shell's status for a command it did not find


@dataclass(frozen=True)
class Claim:
    """Disks one new volume or pool would take on a node; ``made`` is the command whose
    answer says it was made before (then its disks are not probed: the role only uses it)."""

    what: str  # the role's words: "scratch volume 1 disk, ext4 at /scratch", "pool tank"
    disks: tuple[str, ...]
    force: bool
    scratch: ScratchVolume | None = None  # None: a ZFS pool
    pool: str = ""


def claims(m: Manifest, node: Node) -> list[Claim]:
    """The scratch volume and ZFS pools of ``node``, as its roles would make them."""
    out: list[Claim] = []
    volume = scratch_volume(node)
    if volume is not None:
        out.append(Claim(f"scratch volume {volume.summary()}", volume.disks, volume.force, scratch=volume))
    for pool in m.zfs.pools:
        if pool.node == node.name:
            out.append(Claim(f"pool {pool.name}", tuple(pool_layout(pool).disks()), pool.force, pool=pool.name))
    return out


def disk_commands(disk: str) -> tuple[Argv, Argv]:
    path = f"{BY_ID_DIR}/{disk}"
    return ("lsblk", "--json", "--output", LSBLK_COLUMNS, path), ("wipefs", "--json", path)


def made_commands(claim: Claim) -> list[Argv]:
    if claim.scratch is not None:
        tool = LAYOUT_TOOL.get(claim.scratch.layout)
        device = claim.scratch.device
        return [("blkid", "-p", "-o", "export", device), ("test", "-e", device), *([tool] if tool else [])]
    return [("zpool", "list", "-H", "-o", "name", claim.pool), ZPOOL_IMPORTABLE]


def commands(m: Manifest, node: Node) -> list[Argv]:
    """The read-only commands to run on ``node``, in order, each once ([]: nothing to read)."""
    found = claims(m, node)
    if not found:
        return []
    wanted: list[Argv] = [IN_CONTAINER]
    for claim in found:
        wanted += made_commands(claim)
        for disk in claim.disks:
            wanted += disk_commands(disk)
    return list(dict.fromkeys(wanted))


def _made(claim: Claim, out: Outputs) -> tuple[bool, str]:
    """(made before, why it is not judged here: "" when it is)."""
    answers = [out.get(argv, (MISSING, "")) for argv in made_commands(claim)]
    if claim.scratch is not None:
        (_, blkid), (test_rc, _), *tool = answers
        if tool and tool[0][0] == MISSING:
            return False, f"{made_commands(claim)[-1][0]} is not installed yet"
        if volume_ready(blkid, claim.scratch.fs):
            return True, ""
        # an array or LV of ours without a file system: an earlier run stopped before mkfs
        return claim.scratch.layout != "single" and test_rc == 0 and not blkid.strip(), ""
    (listed_rc, _), (import_rc, importable) = answers
    if listed_rc == MISSING or import_rc == MISSING:
        return False, "zpool is not installed yet"
    return listed_rc == 0 or claim.pool in importable_pools(importable), ""


def judge(claim: Claim, out: Outputs) -> tuple[list[str], str]:
    """(the refusal's lines, [] when the disks may be used; a note when it is not judged here)."""
    made, unjudged = _made(claim, out)
    if unjudged:
        return [], f"{claim.what}: not read before the apply ({unjudged}); the role checks its disks"
    if made:
        return [], ""
    lsblk: list[dict[str, object]] = []
    wipefs: list[dict[str, object]] = []
    for disk in claim.disks:
        for argv, results in zip(disk_commands(disk), (lsblk, wipefs), strict=True):
            rc, text = out.get(argv, (MISSING, ""))
            results.append({"item": disk, "rc": rc, "stdout": text})
    probes = probes_from_ansible(lsblk, wipefs)
    verdict = scratch_safety(probes, claim.force) if claim.scratch is not None else disk_safety(probes, claim.force)
    if verdict.ok:
        return [], ""
    if claim.scratch is not None:
        verb, force = "made", "scratch.force: true overwrites data"
    else:
        verb, force = "created", "set force: true on the pool only if that data may be destroyed"
    head = f"REFUSED: {claim.what} is not {verb}; its disks are missing, in use or hold data ({force}):"
    return [head, *verdict.refused], ""


def refusals(m: Manifest, node: Node, out: Outputs) -> tuple[list[str], list[str]]:
    """What the read of :func:`commands` on ``node`` says: (refusal lines, notes)."""
    if out.get(IN_CONTAINER, (1, ""))[0] == 0:
        return [], []  # a container: the roles skip the disks there, and say so
    lines: list[str] = []
    notes: list[str] = []
    for claim in claims(m, node):
        refused, note = judge(claim, out)
        lines += refused
        notes += [note] if note else []
    return lines, notes
