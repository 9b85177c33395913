"""provisioner.areas.fabric.verify: ib_write_bw between fabric peers, on InfiniBand and RoCE."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.fabric import verify
from provisioner.nodecheck.check import Check, Output
from provisioner.nodecheck.parsers import ParseError
from provisioner.verify import catalog


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


def test_write_bw_verdict() -> None:
    bw = verify.write_bw_verdict(0.75)
    assert bw(verify.WriteBw(100, 96.4)).status == "PASS"
    assert bw(verify.WriteBw(100, 60.0)).detail == "60 Gb/s, below 0.75 of the 100 Gb/s link"


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


def test_ib_write_bw() -> None:
    assert verify.parse_write_bw(IB_WRITE_BW) == verify.WriteBw(100.0, 96.41)
    with pytest.raises(ParseError, match="rate"):
        verify.parse_write_bw(IB_WRITE_BW.replace("rate=100 Gb/sec (4X EDR)\n", ""))
    with pytest.raises(ParseError, match="result row"):
        verify.parse_write_bw("rate=100 Gb/sec (4X EDR)\n Couldn't connect to 10.0.3.2:18515\n")
