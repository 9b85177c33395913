"""The storage area's verify checks: the local scratch file system, NFS and MergerFS mounts
with a short write/read through each, ZFS pool health, the age of each dataset's newest
snapshot."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.areas.storage import mergerfs, nfs, scratch, snapshots, zfs
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import (
    Check,
    CheckList,
    Judge,
    NodeChecks,
    Outcome,
    Output,
    judged,
    stderr_hint,
)
from provisioner.nodecheck.parsers import ParseError

# the generated NFS options the kernel shows in the mount table (findmnt)
SHOWN_NFS_OPTIONS = frozenset({"vers", "proto", "port", "nconnect", "rsize", "wsize", "hard", "soft"})
# The client asks for these; the kernel settles them with the server (knfsd's largest block
# size follows its memory) and the transport (NFS/RDMA caps them): less than asked is normal.
NEGOTIATED_NFS_OPTIONS = frozenset({"rsize", "wsize"})
IO_MB = 64  # the short write/read on a shared mount


# --------------------------------------------------------------------------- parsers
@dataclass(frozen=True)
class Mount:
    source: str
    fstype: str
    options: frozenset[str]


def parse_findmnt(text: str) -> Mount | None:
    """``findmnt -J -o SOURCE,FSTYPE,OPTIONS --mountpoint PATH`` (empty: not mounted)."""
    if not text.strip():
        return None
    try:
        systems = json.loads(text)["filesystems"]
        first = systems[0]
        return Mount(str(first["source"]), str(first["fstype"]), frozenset(str(first["options"]).split(",")))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ParseError(f"not findmnt's JSON ({exc})") from None


@dataclass(frozen=True)
class DdRun:
    write_ok: bool
    read_ok: bool
    write_rate: str = ""
    read_rate: str = ""


def parse_io(text: str) -> DdRun:
    """Our short write/read: ``write rc=N`` / ``read rc=N`` lines after each dd's summary."""
    rates = re.findall(r"copied, [0-9.]+ s, ([0-9.]+ [kMGT]?B/s)", text)
    w = re.search(r"^write rc=(\d+)", text, re.MULTILINE)
    r = re.search(r"^read rc=(\d+)", text, re.MULTILINE)
    if not w:
        raise ParseError("no 'write rc=N' line")
    write_ok = w.group(1) == "0"
    read_ok = bool(r and r.group(1) == "0")
    return DdRun(write_ok, read_ok, rates[0] if rates else "", rates[1] if len(rates) > 1 else "")


def parse_list(text: str) -> bool:
    """``list rc=N`` after ``ls``: whether the listing worked."""
    rc = re.search(r"^list rc=(\d+)", text, re.MULTILINE)
    if not rc:
        raise ParseError("no 'list rc=N' line")
    return rc.group(1) == "0"


@dataclass(frozen=True)
class PoolStatus:
    state: str
    data_errors: bool  # "errors:" says anything but "No known data errors"
    device_errors: int  # READ/WRITE/CKSUM counters that are not 0 (zpool prints 1.2K for large ones)
    scan: str = ""
    scan_errors: int = 0  # "... with N errors" of the last scrub/resilver


COUNTER_RE = re.compile(r"^\d+(\.\d+)?[KMGT]?$")


def parse_zpool_status(text: str) -> PoolStatus:
    state = re.search(r"^\s*state:\s*(\S+)", text, re.MULTILINE)
    if not state:
        raise ParseError("no 'state:' line (is the pool imported?)")
    errors = re.search(r"^\s*errors:\s*(.*)$", text, re.MULTILINE)
    scan = re.search(r"^\s*scan:\s*(.*)$", text, re.MULTILINE)
    scan_text = scan.group(1).strip() if scan else ""
    scan_err = re.search(r"with (\d+) errors", scan_text)
    device_errors = 0
    in_config = False
    for line in text.splitlines():
        cells = line.split()
        if cells[:1] == ["NAME"] and "CKSUM" in cells:
            in_config = True
            continue
        if in_config:
            if not cells:  # a blank line ends the table
                in_config = False
            elif len(cells) >= 5 and all(COUNTER_RE.match(c) for c in cells[2:5]):
                device_errors += sum(c != "0" for c in cells[2:5])
    return PoolStatus(
        state=state.group(1),
        data_errors=not (errors and errors.group(1).strip() == "No known data errors"),
        device_errors=device_errors,
        scan=scan_text,
        scan_errors=int(scan_err.group(1)) if scan_err else 0,
    )


@dataclass(frozen=True)
class SnapshotList:
    now: int  # the node's clock, seconds since the epoch
    names: tuple[str, ...]  # dataset@snapshot


def parse_snapshot_list(text: str) -> SnapshotList:
    """``now=<epoch>`` then ``zfs list -H -o name -t snapshot`` (:func:`snapshot_command`)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or not re.fullmatch(r"now=\d+", lines[0]):
        raise ParseError("no 'now=<seconds>' line first")
    names = tuple(line for line in lines[1:] if "@" in line)
    return SnapshotList(int(lines[0].removeprefix("now=")), names)


# --------------------------------------------------------------------------- verdicts
def mount_verdict(fstypes: tuple[str, ...], options: list[str], path: str) -> Callable[[Mount | None], Outcome]:
    def verdict(mnt: Mount | None) -> Outcome:
        if mnt is None:
            return Outcome("FAIL", f"{path} is not mounted")
        if mnt.fstype not in fstypes:
            return Outcome("FAIL", f"{path} is {mnt.fstype} from {mnt.source}, expected {'/'.join(fstypes)}")
        missing, settled = [], []
        live = dict(o.split("=", 1) for o in mnt.options if "=" in o)
        for want in options:
            key, _, value = want.partition("=")
            if want in mnt.options:
                continue
            if key in NEGOTIATED_NFS_OPTIONS and live.get(key, "").isdigit() and value.isdigit() \
                    and 0 < int(live[key]) < int(value):
                settled.append(f"{key}={live[key]}")
                continue
            missing.append(want)
        if missing:
            return Outcome("FAIL", f"{path} lacks {', '.join(missing)}")
        note = f" ({', '.join(settled)}: the most the server and transport offer)" if settled else ""
        return Outcome("PASS", f"{mnt.fstype} from {mnt.source}{note}")
    return verdict


def io_verdict(path: str) -> Callable[[DdRun], Outcome]:
    def verdict(r: DdRun) -> Outcome:
        if not r.write_ok:
            return Outcome("FAIL", f"cannot write {IO_MB} MiB under {path}")
        if not r.read_ok:
            return Outcome("FAIL", f"cannot read back {IO_MB} MiB under {path}")
        return Outcome("PASS", f"write {r.write_rate or '?'}, read {r.read_rate or '?'}")
    return verdict


def list_verdict(path: str) -> Callable[[bool], Outcome]:
    def verdict(listed: bool) -> Outcome:
        if not listed:
            return Outcome("FAIL", f"cannot list {path}")
        return Outcome("PASS", "listed (root may not write on this export: no write probe)")
    return verdict


def pool_verdict(pool: str) -> Callable[[PoolStatus], Outcome]:
    def verdict(s: PoolStatus) -> Outcome:
        problems = []
        if s.state != "ONLINE":
            problems.append(f"state {s.state}")
        if s.device_errors:
            problems.append(f"{s.device_errors} device error counters not 0")
        if s.scan_errors:
            problems.append(f"last scan: {s.scan_errors} errors")
        if s.data_errors:
            problems.append("data errors")
        if problems:
            return Outcome("FAIL", f"{pool}: {', '.join(problems)}")
        return Outcome("PASS", f"{pool} ONLINE" + (f"; {s.scan}" if s.scan else ""))
    return verdict


SNAPSHOT_HINT = "systemctl status provision-zfs-snapshot@*"


def snapshot_verdict(dataset: str, policy: dict[str, int],
                     hint: str = SNAPSHOT_HINT) -> Callable[[SnapshotList], Outcome]:
    """PASS while the newest snapshot of ours is younger than twice the shortest period kept
    (the same limit as the ZfsSnapshotLate alert; for a replica, ZfsReplicationLate's)."""
    limit = snapshots.max_age(policy)

    def verdict(listed: SnapshotList) -> Outcome:
        newest = snapshots.newest(dataset, listed.names)
        if newest == 0:
            return Outcome("FAIL", f"{dataset} has no provision snapshot ({hint})")
        age = listed.now - newest
        if snapshots.late(policy, newest, listed.now):
            return Outcome("FAIL", f"{dataset}: newest provision snapshot is {age // 60} min old, "
                                   f"more than {limit // 60} min ({hint})")
        return Outcome("PASS", f"{dataset}: newest provision snapshot {max(age, 0) // 60} min old")
    return verdict


def replica_hint(source_node: str) -> str:
    return f"on {source_node}: systemctl status provision-zfs-replicate; journalctl -u provision-zfs-replicate"


def snapshot_judge(dataset: str, policy: dict[str, int], hint: str = SNAPSHOT_HINT) -> Judge:
    """:func:`snapshot_verdict`, and a failed ``zfs list`` (no such dataset) fails with its error."""
    listed = judged(parse_snapshot_list, snapshot_verdict(dataset, policy, hint))

    def judge(out: Output) -> Outcome:
        if not out.error and out.rc != 0:
            return Outcome("FAIL", f"cannot list the snapshots of {dataset}{stderr_hint(out)}")
        return listed(out)
    return judge


def snapshot_command(dataset: str) -> str:
    return f"echo now=$(date -u +%s); zfs list -H -o name -t snapshot -d 1 {shlex.quote(dataset)}"


def io_command(path: str, node: str) -> str:
    f = shlex.quote(f"{path.rstrip('/')}/.provision-verify-{node}")
    return (f"dd if=/dev/zero of={f} bs=1M count={IO_MB} conv=fsync 2>&1; echo \"write rc=$?\"; "
            f"dd if={f} of=/dev/null bs=1M 2>&1; echo \"read rc=$?\"; rm -f {f}")


def list_command(path: str) -> str:
    """The probe of an export root may not write to (read-only, or root squashed: root on the
    client is the server's anonymous user, and root owns the export): a bounded listing."""
    return f"ls -A {shlex.quote(path)} > /dev/null; echo \"list rc=$?\""


def findmnt_command(path: str) -> str:
    return f"findmnt -J -o SOURCE,FSTYPE,OPTIONS --mountpoint {shlex.quote(path)}; true"


# mount(8) options that set the atime behaviour; the last one given wins
ATIME_OPTIONS = frozenset({"atime", "noatime", "relatime", "norelatime", "strictatime", "nostrictatime"})


def scratch_options(volume: scratch.ScratchVolume) -> list[str]:
    """The scratch mount's options the kernel shows: ``noatime`` (``nofail`` lives in fstab
    only), unless a later option of the manifest's sets atime otherwise (``relatime``). The
    manifest's other options are left to the file system, which shows them its own way."""
    last_atime = [o for o in volume.options if o in ATIME_OPTIONS][-1:]
    return ["noatime"] if last_atime == ["noatime"] else []


def mount_checks(m: Manifest, node: Node, out: CheckList) -> None:
    """``mount:<path>`` and ``io:<path>`` for the node's scratch file system, each NFS mount
    and each MergerFS union."""
    volume = scratch.scratch_volume(node)
    if volume is not None:
        out.add(f"mount:{volume.path}", findmnt_command(volume.path),
                judged(parse_findmnt, mount_verdict((volume.fs,), scratch_options(volume), volume.path)), "kernel")
        out.add(f"io:{volume.path}", io_command(volume.path, node.name), judged(parse_io, io_verdict(volume.path)),
                "kernel")
    for mount in nfs.mounts_for(m, node):
        proto = nfs.mount_proto(m, mount, node)
        want = [o for o in nfs.mount_options(mount, proto) if o.split("=")[0] in SHOWN_NFS_OPTIONS]
        fstypes = ("nfs",) if mount.vers == "3" else ("nfs4",)
        out.add(f"mount:{mount.path}", findmnt_command(mount.path),
                judged(parse_findmnt, mount_verdict(fstypes, want, mount.path)), "kernel")
        if nfs.root_writes(nfs.export_by_name(m, mount.export)):
            out.add(f"io:{mount.path}", io_command(mount.path, node.name), judged(parse_io, io_verdict(mount.path)),
                    "kernel")
        else:
            out.add(f"io:{mount.path}", list_command(mount.path), judged(parse_list, list_verdict(mount.path)),
                    "kernel")
    for union in mergerfs.unions_for(m, node):
        out.add(f"mount:{union.path}", findmnt_command(union.path),
                judged(parse_findmnt, mount_verdict(("fuse.mergerfs",), [], union.path)), "kernel")
        out.add(f"io:{union.path}", io_command(union.path, node.name), judged(parse_io, io_verdict(union.path)),
                "kernel")


def checks(m: Manifest) -> NodeChecks:
    replicas = zfs.replications(m)

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        mount_checks(m, node, out)
        for pool in m.zfs.pools:
            if pool.node == node.name:
                out.add(f"zfs:{pool.name}", f"zpool status -v {shlex.quote(pool.name)}",
                        judged(parse_zpool_status, pool_verdict(pool.name)), "kernel")
                for dataset, policy in zfs.snapshot_policies(pool).items():
                    out.add(f"snapshots:{dataset}", snapshot_command(dataset), snapshot_judge(dataset, policy),
                            "kernel")
        for rep in replicas:
            if rep.to == node.name:
                out.add(f"replica:{rep.target}", snapshot_command(rep.target),
                        snapshot_judge(rep.target, rep.policy, replica_hint(rep.node)), "kernel")
        return out.checks

    return node_checks
