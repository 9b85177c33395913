"""provisioner.areas.storage.verify: ib_write_bw between fabric peers, NFS and MergerFS mounts
with a write/read through each, ZFS pool health."""

from __future__ import annotations

import copy
import subprocess
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


def test_a_ring_of_peers_and_a_lonely_node(kit: Any) -> None:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    m = kit.load(data).manifest
    checks = catalog.plan(m)
    bw = by_name(checks, "node01", "rdma.write_bw")
    assert bw.skip == "" and bw.command is not None and bw.command.setup is not None
    assert bw.command.setup[0] == "node02" and "10.0.3.22" in bw.command.text
    ping = by_name(checks, "node02", "mtu.infiniband")
    assert "-s 2016" in ping.command.text and "10.0.3.21" in ping.command.text  # type: ignore[union-attr]
    # head01 has no InfiniBand interface: no such checks there
    assert "rdma.write_bw" not in names(checks, "head01")
    # one node alone on the fabric: the pair test applies but has no peer
    del data["nodes"][1]["interfaces"]["infiniband"]
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    lonely = catalog.plan(kit.load(data).manifest)
    assert by_name(lonely, "head01", "rdma.write_bw").skip == "no other node on the infiniband network"
    assert by_name(lonely, "head01", "mtu.infiniband").skip == "no other node on the infiniband network"


def test_write_bw_on_roce_uses_the_gid_index_and_the_devices(kit: Any) -> None:
    """RoCE: ``rdma.write_bw.roce`` with -x <gid_index> (GID 0 is link-local and does not
    route) and each side's own device; its floor per fabric; mtu.roce at 9000."""
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000, "gid_index": 1}
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][0]["interfaces"]["roce"] = {"ip": "10.0.4.10", "interface": "eth2", "rdma_device": "rxe0"}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0", "rdma_device": "mlx5_1"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    data["verify"] = {"write_bw_fraction": {"roce": 0.5}, "ib_write_bw_fraction": 0.8}
    m = kit.load(data).manifest
    checks = catalog.plan(m)
    roce = by_name(checks, "node02", "rdma.write_bw.roce")  # ring: head01 -> node01 -> node02 -> head01
    assert roce.command is not None and roce.command.setup is not None
    assert "/sys/class/infiniband/mlx5_1/ports/1/rate" in roce.command.text
    assert roce.command.text.endswith("ib_write_bw --report_gbits -D 3 -p 18515 -d mlx5_1 -x 1 10.0.4.10")
    assert roce.command.setup[0] == "head01" and "ib_write_bw --report_gbits -D 3 -p 18515 -d rxe0 -x 1 >" \
        in roce.command.setup[1]
    ib = by_name(checks, "node02", "rdma.write_bw")  # InfiniBand: no -x, no device named
    assert ib.command is not None and ib.command.text.endswith("ib_write_bw --report_gbits -D 3 -p 18515 10.0.3.21")
    assert "rdma.write_bw" not in names(checks, "head01")
    half = "rate=100 Gb/sec (4X EDR)\n 65536 5000 60.0 60.0 0.1\n"
    assert roce.judge(Output(stdout=half)).status == "PASS"  # 0.5 of the link on RoCE
    assert ib.judge(Output(stdout=half)).status == "FAIL"  # 0.8 elsewhere
    ping = by_name(checks, "head01", "mtu.roce")
    assert ping.command is not None and "-s 8972" in ping.command.text and "10.0.4.21" in ping.command.text
    data["networks"]["roce"]["rdma"] = False  # plain Ethernet: the MTU is checked, no RDMA
    checks = catalog.plan(kit.load(data).manifest)
    assert "rdma.write_bw.roce" not in names(checks, "node02") and "mtu.roce" in names(checks, "node02")


def test_write_bw_runs_on_every_roce_port(kit: Any) -> None:
    """Two RoCE ports per node: each its own pair test from its device to the peer's port on
    the same rail (its device on the server side, its address for the client)."""
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    data["nodes"][1]["interfaces"]["roce"] = [
        {"ip": "10.0.4.21", "interface": "ens2f0", "rdma_device": "mlx5_2"},
        {"ip": "10.0.4.121", "interface": "ens2f1", "rdma_device": "mlx5_3"}]
    checks = catalog.plan(kit.load(data).manifest)  # node01 <-> node02
    first, second = by_name(checks, "node02", "rdma.write_bw.roce"), by_name(checks, "node02", "rdma.write_bw.roce.2")
    assert first.command is not None and second.command is not None
    assert second.command.setup is not None and first.command.setup is not None
    assert first.command.text.endswith("-d mlx5_2 -x 3 10.0.4.21")
    assert second.command.text.endswith("-d mlx5_3 -x 3 10.0.4.121")
    assert "/sys/class/infiniband/mlx5_3/ports/1/rate" in second.command.text
    assert second.command.setup[0] == "node01" and "-d mlx5_3 -x 3 >" in second.command.setup[1]
    assert "-d mlx5_2 -x 3 >" in first.command.setup[1]
    assert "rdma.write_bw.roce.3" not in names(checks, "node02")


def _fabric_pair(kit: Any) -> Check:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    return by_name(catalog.plan(kit.load(data).manifest), "node01", "rdma.write_bw")


@pytest.mark.parametrize(("fails", "status"), [(False, "PASS"), (True, "FAIL")])
def test_write_bw_client_runs_once_and_its_own_error_is_shown(kit: Any, tmp_path: Path, fails: bool,
                                                              status: str) -> None:
    """The client's shell text with a stand-in ib_write_bw: one run against the listening
    server (a failed run ended that server: no retries that could only say "cannot connect"),
    and a failure's own message in the verdict."""
    bw = _fabric_pair(kit)
    assert bw.command is not None
    fake = tmp_path / "ib_write_bw"
    fake.write_text("#!/bin/sh\n"
                    f"echo run >> {tmp_path}/runs\n"
                    f"if {'true' if fails else 'false'}; then echo ' Failed to modify QP to RTR' >&2; exit 1; fi\n"
                    "echo ' #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]'\n"
                    "echo ' 65536 1000 0.00 91.2 0.17'\n")
    fake.chmod(0o755)
    r = subprocess.run(["sh", "-c", bw.command.text], capture_output=True, text=True, timeout=30, check=False,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert r.returncode == (1 if fails else 0), r.stdout + r.stderr
    assert (tmp_path / "runs").read_text() == "run\n"
    verdict = bw.judge(Output(rc=r.returncode, stdout=r.stdout.replace("rate=", "rate=100 Gb/sec (4X EDR)", 1),
                              stderr=r.stderr))
    assert verdict.status == status, verdict
    assert ("Failed to modify QP to RTR" in verdict.detail) == fails


def _server_bin(tmp_path: Path, ib_write_bw: str) -> dict[str, str]:
    """A PATH with a stand-in ib_write_bw and an ss that shows a listener once it made one."""
    (tmp_path / "ib_write_bw").write_text(f"#!/bin/sh\n{ib_write_bw}\n")
    (tmp_path / "ss").write_text(f"#!/bin/sh\n[ -e {tmp_path}/listening ] && echo 'LISTEN 0 1 0.0.0.0:18515'\n"
                                 "exit 0\n")
    for f in ("ib_write_bw", "ss"):
        (tmp_path / f).chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_write_bw_server_returns_once_it_listens(kit: Any, tmp_path: Path) -> None:
    """The peer side returns when the server listens (here after a slow device open), not
    after a fixed pause, and leaves the server running for the client."""
    bw = _fabric_pair(kit)
    assert bw.command is not None and bw.command.setup is not None
    assert "-p 18515" in bw.command.setup[1] and "-p 18515" in bw.command.text
    env = _server_bin(tmp_path, f"echo \"$@\" > {tmp_path}/args; sleep 1; touch {tmp_path}/listening; sleep 2")
    r = subprocess.run(["sh", "-c", bw.command.setup[1]], capture_output=True, text=True, timeout=30, check=False,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "listening").exists()
    assert (tmp_path / "args").read_text().split() == ["--report_gbits", "-D", "3", "-p", "18515"]


@pytest.mark.parametrize(("server", "said"), [
    ("echo ' Failed to open device rxe0'; exit 1", "Failed to open device rxe0"),  # exits: said at once
    ("sleep 20", "after 2 s"),  # never listens: bounded
])
def test_write_bw_server_that_cannot_listen_fails_with_its_output(tmp_path: Path, server: str, said: str) -> None:
    env = _server_bin(tmp_path, server)
    r = subprocess.run(["sh", "-c", verify.write_bw_server(wait_s=2)], capture_output=True, text=True,
                       timeout=30, check=False, env=env)
    assert r.returncode == 1
    assert "ib_write_bw server not listening on port 18515" in r.stderr and said in r.stderr


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


def test_write_bw_verdict() -> None:
    bw = verify.write_bw_verdict(0.75)
    assert bw(verify.WriteBw(100, 96.4)).status == "PASS"
    assert bw(verify.WriteBw(100, 60.0)).detail == "60 Gb/s, below 0.75 of the 100 Gb/s link"


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
IB_WRITE_BW = """\
rate=100 Gb/sec (4X EDR)
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : mlx5_0
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      454000           0.00               96.41              0.183888
---------------------------------------------------------------------------------------
"""


ZPOOL_OK = (RECORDED / "zpool-status-ok.txt").read_text()


ZPOOL_DEGRADED = (RECORDED / "zpool-status-degraded.txt").read_text()


def test_ib_write_bw() -> None:
    assert verify.parse_write_bw(IB_WRITE_BW) == verify.WriteBw(100.0, 96.41)
    with pytest.raises(ParseError, match="rate"):
        verify.parse_write_bw(IB_WRITE_BW.replace("rate=100 Gb/sec (4X EDR)\n", ""))
    with pytest.raises(ParseError, match="result row"):
        verify.parse_write_bw("rate=100 Gb/sec (4X EDR)\n Couldn't connect to 10.0.3.2:18515\n")


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
    data = kit.base(storage=True)
    store = copy.deepcopy(data["nodes"][0])
    store.update(name="store01", roles=["storage"])
    store["interfaces"]["management"].update(ip="10.0.0.11", mac="52:54:00:00:00:11")
    store["interfaces"]["data"]["ip"] = "10.0.2.11"
    store["bmc"]["address"] = "10.0.1.11"
    store["hardware"]["disks"] = [{"id": "ata-BACKUP_[1-2]", "kind": "hdd", "use": "zfs"}]
    data["nodes"].append(store)
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
