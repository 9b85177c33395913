"""provisioner.areas.storage.verify: NFS and MergerFS mounts with a write/read through each,
ZFS pool health."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import verify
from provisioner.nodecheck.check import Check, Outcome, Output
from provisioner.nodecheck.parsers import ParseError
from provisioner.verify import catalog

RECORDED = Path(__file__).parent / "recorded"


def names(checks: list[Check], node: str) -> list[str]:
    return [c.name for c in checks if c.node == node]


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def test_mount_and_pool_verdicts(kit: Any) -> None:
    checks = catalog.plan(kit.load(kit.base(storage=True)).manifest)
    mount = by_name(checks, "node01", "mount:/data")
    good = ('{"filesystems": [{"source": "10.0.2.10:/tank/data", "fstype": "nfs4", "options": '
            '"rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp,nconnect=8,port=0"}]}')
    assert mount.judge(Output(stdout=good)).status == "PASS"
    soft = good.replace(",hard,", ",soft,").replace("nconnect=8", "nconnect=1")
    assert mount.judge(Output(stdout=soft)).detail == "/data lacks nconnect=8, hard"
    assert mount.judge(Output(stdout="")).detail == "/data is not mounted"
    # rsize/wsize are settled with the server and the transport: less than asked is reported,
    # more than asked (or none) is not what the unit asked for
    small = good.replace("rsize=1048576,wsize=1048576", "rsize=131072,wsize=262144")
    assert mount.judge(Output(stdout=small)) == Outcome(
        "PASS", "nfs4 from 10.0.2.10:/tank/data (rsize=131072, wsize=262144: the most the server and "
        "transport offer)")
    big = good.replace("rsize=1048576", "rsize=2097152")
    assert mount.judge(Output(stdout=big)).detail == "/data lacks rsize=1048576"
    none = good.replace("wsize=1048576,", "")
    assert mount.judge(Output(stdout=none)).detail == "/data lacks wsize=1048576"
    local = good.replace('"nfs4"', '"ext4"')
    assert mount.judge(Output(stdout=local)).status == "FAIL"
    union = by_name(checks, "node01", "mount:/union")
    assert union.judge(Output(stdout='{"filesystems": [{"source": "data:scratch", "fstype": "fuse.mergerfs", '
                                     '"options": "rw,relatime"}]}')).status == "PASS"
    pool = by_name(checks, "head01", "zfs:tank")
    assert pool.judge(Output(stdout="  pool: tank\n state: ONLINE\nerrors: No known data errors\n")).status == "PASS"
    assert pool.judge(Output(stdout="  pool: tank\n state: FAULTED\nerrors: No known data errors\n")).detail == (
        "tank: state FAULTED")


def test_scratch_is_checked_mounted_with_its_options_and_written(kit: Any) -> None:
    """Issue 28: a node's scratch file system (node01, node02: nvme-SCRATCH) gets
    ``mount:/scratch`` (its file system, noatime) and ``io:/scratch``; a node without
    scratch disks gets neither."""
    data = kit.base()
    data["nodes"][1]["scratch"] = {"path": "/local", "fs": "ext4", "options": ["discard"]}
    checks = catalog.plan(kit.load(data).manifest)
    mount = by_name(checks, "node01", "mount:/local")
    assert mount.needs == "kernel" and "--mountpoint /local" in mount.command.text  # type: ignore[union-attr]
    good = ('{"filesystems": [{"source": "/dev/nvme1n1p1", "fstype": "ext4", '
            '"options": "rw,noatime,discard"}]}')
    assert mount.judge(Output(stdout=good)) == Outcome("PASS", "ext4 from /dev/nvme1n1p1")
    assert mount.judge(Output(stdout=good.replace("noatime", "relatime"))).detail == "/local lacks noatime"
    assert mount.judge(Output(stdout=good.replace('"ext4"', '"xfs"'))).detail == (
        "/local is xfs from /dev/nvme1n1p1, expected ext4")
    assert mount.judge(Output(stdout="")).detail == "/local is not mounted"
    io = by_name(checks, "node02", "io:/local")
    assert ".provision-verify-node02" in io.command.text  # type: ignore[union-attr]
    assert io.judge(Output(stdout="write rc=1\nread rc=1\n")).detail == "cannot write 64 MiB under /local"
    assert not [n for n in names(checks, "head01") if n.endswith("/local") or n.endswith("/scratch")]
    # the manifest's own atime option replaces noatime: the check asks for no atime option then
    data["nodes"][1]["scratch"]["options"] = ["relatime"]
    relatime = by_name(catalog.plan(kit.load(data).manifest), "node01", "mount:/local")
    assert relatime.judge(Output(stdout=good.replace("noatime", "relatime"))).status == "PASS"


def test_io_verdict(kit: Any) -> None:
    data = kit.base(storage=True)
    data["nfs"]["exports"][0]["root_squash"] = False
    m = kit.load(data).manifest
    io = by_name(catalog.plan(m), "node01", "io:/data")
    assert ".provision-verify-node01" in io.command.text  # type: ignore[union-attr]
    assert io.judge(Output(stdout="write rc=1\nread rc=1\n")).detail == "cannot write 64 MiB under /data"
    assert io.judge(Output(stdout="write rc=0\nread rc=1\n")).detail == "cannot read back 64 MiB under /data"


@pytest.mark.parametrize("export", [{}, {"root_squash": False, "options": ["all_squash"]},
                                    {"root_squash": False, "rw": False},
                                    {"root_squash": False, "options": ["root_squash"]}])
def test_io_on_an_export_root_may_not_write_lists_it(kit: Any, export: dict[str, Any]) -> None:
    """Root squashed (the default), all squashed or read-only: root on the client cannot write
    under the export (the server's anonymous user, a root-owned directory), so a dd there would
    fail on a healthy mount; the check lists the mount instead."""
    data = kit.base(storage=True)
    data["nfs"]["exports"][0].update(export)
    io = by_name(catalog.plan(kit.load(data).manifest), "node01", "io:/data")
    assert io.command.text.startswith("ls -A /data ")  # type: ignore[union-attr]
    assert "dd " not in io.command.text  # type: ignore[union-attr]
    assert io.judge(Output(stdout="list rc=0\n")).status == "PASS"
    failed = io.judge(Output(stdout="ls: cannot access '/data': Stale file handle\nlist rc=2\n"))
    assert (failed.status, failed.detail) == ("FAIL", "cannot list /data")
    assert io.judge(Output(stdout="")).status == "FAIL"  # no "list rc=" line: unparsable


# --------------------------------------------------------------------------- parsers
ZPOOL_OK = (RECORDED / "zpool-status-ok.txt").read_text()


ZPOOL_DEGRADED = (RECORDED / "zpool-status-degraded.txt").read_text()


def test_findmnt() -> None:
    text = ('{"filesystems": [{"source": "10.0.2.10:/tank/data", "fstype": "nfs4", '
            '"options": "rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp,nconnect=8"}]}')
    mnt = verify.parse_findmnt(text)
    assert mnt is not None and mnt.fstype == "nfs4" and "nconnect=8" in mnt.options
    assert verify.parse_findmnt("") is None
    with pytest.raises(ParseError):
        verify.parse_findmnt("findmnt: unknown column")


def test_io() -> None:
    text = ("64+0 records in\n64+0 records out\n67108864 bytes (67 MB, 64 MiB) copied, 0.31 s, 216 MB/s\n"
            "write rc=0\n64+0 records in\n64+0 records out\n67108864 bytes (67 MB, 64 MiB) copied, 0.05 s, 1.3 GB/s\n"
            "read rc=0\n")
    assert verify.parse_io(text) == verify.DdRun(True, True, "216 MB/s", "1.3 GB/s")
    failed = "dd: failed to open '/data/x': Read-only file system\nwrite rc=1\ndd: failed to open\nread rc=1\n"
    assert verify.parse_io(failed) == verify.DdRun(False, False)


def test_zpool_status() -> None:
    ok = verify.parse_zpool_status(ZPOOL_OK)
    assert (ok.state, ok.data_errors, ok.device_errors, ok.scan_errors) == ("ONLINE", False, 0, 0)
    bad = verify.parse_zpool_status(ZPOOL_DEGRADED)
    assert (bad.state, bad.data_errors, bad.device_errors, bad.scan_errors) == ("DEGRADED", True, 1, 3)
    with pytest.raises(ParseError, match="state"):
        verify.parse_zpool_status("cannot open 'tank': no such pool\n")


def test_snapshot_age_is_checked_on_each_policy_d_dataset(kit: Any) -> None:
    data = kit.base(storage=True)
    data["zfs"]["pools"][0]["datasets"] = [{"name": "data", "snapshots": {"hourly": 24, "daily": 7}},
                                           {"name": "tmp"}]
    checks = catalog.plan(kit.load(data).manifest)
    assert [n for n in names(checks, "head01") if n.startswith("snapshots:")] == ["snapshots:tank/data"]
    check = by_name(checks, "head01", "snapshots:tank/data")
    assert check.needs == "kernel"
    assert check.command is not None and "zfs list -H -o name -t snapshot -d 1 tank/data" in check.command.text
    now = 1764226800  # 2025-11-27 07:00 UTC
    listed = "tank/data@manual\ntank/data@provision-daily-20251127T000000Z\n"
    fresh = f"now={now}\n{listed}tank/data@provision-hourly-20251127T060000Z\n"
    assert check.judge(Output(stdout=fresh)) == Outcome("PASS", "tank/data: newest provision snapshot 60 min old")
    # only the daily one, 7 h old: more than twice the shortest period (hourly) kept
    assert check.judge(Output(stdout=f"now={now}\n{listed}")) == Outcome(
        "FAIL", "tank/data: newest provision snapshot is 420 min old, more than 120 min "
                "(systemctl status provision-zfs-snapshot@*)")
    assert check.judge(Output(stdout=f"now={now}\ntank/data@manual\n")).detail == (
        "tank/data has no provision snapshot (systemctl status provision-zfs-snapshot@*)")
    assert check.judge(Output(stdout="tank/data@manual\n")).status == "FAIL"  # no clock line
    missing = Output(rc=1, stdout=f"now={now}\n", stderr="cannot open 'tank/data': dataset does not exist\n")
    assert check.judge(missing).detail == (
        "cannot list the snapshots of tank/data (cannot open 'tank/data': dataset does not exist)")


def test_a_replica_s_newest_snapshot_is_checked_on_its_node(kit: Any) -> None:
    """Issue 31: the replica of tank/data on store01's pool backup is judged there, with the
    source's retention (hourly kept: late after 2 h), and the hint names the sending node."""
    data = kit.add_backup_store(kit.base(storage=True))
    data["zfs"]["pools"].append({"name": "backup", "node": "store01",
                                 "vdevs": {"type": "mirror", "width": 2, "disks": ["ata-BACKUP_[1-2]"]}})
    data["zfs"]["pools"][0]["datasets"] = [{"name": "data", "snapshots": {"hourly": 24, "daily": 7},
                                            "replicate": {"to": "store01", "pool": "backup"}}]
    checks = catalog.plan(kit.load(data).manifest)
    assert [n for n in names(checks, "store01") if n.startswith("replica:")] == ["replica:backup/data"]
    assert not [n for n in names(checks, "head01") if n.startswith("replica:")]
    check = by_name(checks, "store01", "replica:backup/data")
    assert check.command is not None and "zfs list -H -o name -t snapshot -d 1 backup/data" in check.command.text
    now = 1764226800  # 2025-11-27 07:00 UTC
    fresh = f"now={now}\nbackup/data@provision-hourly-20251127T060000Z\n"
    assert check.judge(Output(stdout=fresh)) == Outcome("PASS", "backup/data: newest provision snapshot 60 min old")
    late = f"now={now}\nbackup/data@provision-hourly-20251127T040000Z\n"
    assert check.judge(Output(stdout=late)).detail == (
        "backup/data: newest provision snapshot is 180 min old, more than 120 min (on head01: systemctl status "
        "provision-zfs-replicate; journalctl -u provision-zfs-replicate)")
    assert check.judge(Output(stdout=f"now={now}\nbackup/data@operator\n")).status == "FAIL"
