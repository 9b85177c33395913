"""provisioner.areas.common.verify: /etc/hosts, the clock, each network's MTU to the next node."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas.common import verify
from provisioner.nodecheck.check import Check, Outcome, Output
from provisioner.nodecheck.parsers import ParseError
from provisioner.verify import catalog


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def test_clock_and_hosts_verdicts(kit: Any) -> None:
    checks = catalog.plan(kit.load(kit.base(storage=True)).manifest)
    clock = by_name(checks, "node01", "clock")
    near = "System time     : 0.000200000 seconds fast of NTP time\nLeap status     : Normal\n"
    assert clock.judge(Output(stdout=near)) == Outcome("PASS", "offset +0.200 ms")
    far = near.replace("0.000200000", "0.500000000")
    assert clock.judge(Output(stdout=far)).detail == "offset +500.0 ms, limit 100 ms"
    no_daemon = clock.judge(Output(rc=1, stderr="506 Cannot talk to daemon\n"))
    assert no_daemon.detail.endswith("(506 Cannot talk to daemon)")
    hosts = by_name(checks, "node01", "hosts")
    full = "10.0.0.10 head01.test.internal head01\n10.0.0.21 node01.test.internal node01\n" \
           "10.0.0.22 node02.test.internal node02\n"
    assert hosts.judge(Output(stdout=full)) == Outcome("PASS", "3 nodes")
    assert hosts.judge(Output(stdout=full.replace("10.0.0.22", "10.0.0.99"))).detail == (
        "/etc/hosts lacks node02, node02.test.internal")


def test_ping_verdict() -> None:
    ping = verify.ping_verdict(9000, "node02")
    assert ping(verify.Ping(3, 0, True)).status == "FAIL"
    assert ping(verify.Ping(3, 0, False)).detail == "no answer from node02 at MTU 9000"
    assert ping(verify.Ping(3, 3, False)).status == "PASS"


def test_mtu_pings_the_next_node_on_each_network(kit: Any) -> None:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    checks = catalog.plan(kit.load(data).manifest)  # node[01-02]: node01 and node02 on the fabric
    ping = by_name(checks, "node02", "mtu.infiniband")
    assert "-s 2016" in ping.command.text and "10.0.3.21" in ping.command.text  # type: ignore[union-attr]
    assert ping.needs == "kernel"
    assert "mtu.infiniband" not in [c.name for c in checks if c.node == "head01"]  # not on that network
    del data["nodes"][1]["interfaces"]["infiniband"]
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    lonely = catalog.plan(kit.load(data).manifest)
    assert by_name(lonely, "head01", "mtu.infiniband").skip == "no other node on the infiniband network"


# --------------------------------------------------------------------------- parsers
CHRONY_OK = """\
Reference ID    : 0A0D070A (10.213.7.10)
Stratum         : 11
Ref time (UTC)  : Mon Nov 23 05:40:01 2026
System time     : 0.000012345 seconds slow of NTP time
Last offset     : -0.000001234 seconds
RMS offset      : 0.000004321 seconds
Frequency       : 1.234 ppm fast
Leap status     : Normal
"""


CHRONY_UNSYNC = CHRONY_OK.replace("Leap status     : Normal", "Leap status     : Not synchronised").replace(
    "0.000012345 seconds slow", "0.250000000 seconds fast")


def test_ping() -> None:
    ok = "PING 10.0.2.11 (10.0.2.11) 8972(9000) bytes of data.\n...\n3 packets transmitted, 3 received, 0% packet loss"
    assert verify.parse_ping(ok) == verify.Ping(3, 3, False)
    small = ("PING 10.0.2.11 (10.0.2.11) 8972(9000) bytes of data.\nping: local error: message too long, mtu=1500\n"
             "3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2041ms\n")
    assert verify.parse_ping(small) == verify.Ping(3, 0, True)
    with pytest.raises(ParseError):
        verify.parse_ping("ping: connect: Network is unreachable\n")


def test_chrony_tracking() -> None:
    ok = verify.parse_chrony_tracking(CHRONY_OK)
    assert ok.synchronised and ok.offset_s == pytest.approx(-0.000012345)
    bad = verify.parse_chrony_tracking(CHRONY_UNSYNC)
    assert not bad.synchronised and bad.offset_s == pytest.approx(0.25)
    with pytest.raises(ParseError, match="chronyd"):
        verify.parse_chrony_tracking("506 Cannot talk to daemon\n")


def test_hosts() -> None:
    hosts = verify.parse_hosts("127.0.0.1 localhost\n10.0.0.10 head01.test head01 # the head\n")
    assert hosts.names["head01"] == {"10.0.0.10"} and "#" not in hosts.names


# --------------------------------------------------------------------------- bonds (issue 28 item 2)
BONDING_LACP = """Ethernet Channel Bonding Driver: v6.1.0-18-amd64

Bonding Mode: IEEE 802.3ad Dynamic link aggregation
Transmit Hash Policy: layer3+4 (1)
MII Status: up
MII Polling Interval (ms): 100

802.3ad info
LACP active: on
LACP rate: fast

Slave Interface: ens1f0
MII Status: up
Speed: 25000 Mbps
Link Failure Count: 0
Permanent HW addr: 52:54:00:AA:00:01
Slave queue ID: 0

Slave Interface: ens1f1
MII Status: down
Speed: Unknown
Link Failure Count: 1
Permanent HW addr: 52:54:00:aa:00:02
Slave queue ID: 0
mtu=9000
"""


def test_parse_bonding_and_its_verdict() -> None:
    b = verify.parse_bonding(BONDING_LACP)
    assert (b.mode, b.up, b.mtu) == ("802.3ad", True, 9000)
    assert [(s.name, s.up, s.mac) for s in b.members] == [
        ("ens1f0", True, "52:54:00:aa:00:01"), ("ens1f1", False, "52:54:00:aa:00:02")]
    judge = verify.bond_verdict("bond0", "802.3ad", ["ens1f0", "52:54:00:aa:00:02"], 9000)
    assert judge(b) == Outcome("FAIL", "bond0: 52:54:00:aa:00:02 down")
    healthy = verify.parse_bonding(BONDING_LACP.replace("MII Status: down", "MII Status: up"))
    assert judge(healthy) == Outcome("PASS", "bond0 802.3ad up, 2 members up, MTU 9000")
    assert verify.bond_verdict("bond0", "active-backup", ["ens1f0", "ens2f0"], 1500)(healthy) == Outcome(
        "FAIL", "bond0: mode 802.3ad, not active-backup, ens2f0 not enslaved, MTU 9000, not 1500")
    backup = verify.parse_bonding("Bonding Mode: fault-tolerance (active-backup)\nMII Status: down\n")
    assert (backup.mode, backup.up, backup.members, backup.mtu) == ("active-backup", False, (), None)
    with pytest.raises(ParseError):
        verify.parse_bonding("cat: /proc/net/bonding/bond0: No such file or directory\n")


def test_a_bonded_node_gets_its_bond_checked(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["interfaces"]["data"]["interface"] = "bond0"
    data["nodes"][1]["bonds"] = {"bond0": {"mode": "active-backup", "members": ["ens1f0", "ens1f1"]}}
    checks = catalog.plan(kit.load(data).manifest)
    bond = next(c for c in checks if c.node == "node01" and c.name == "bond:bond0")
    assert bond.command is not None and bond.command.text.startswith("cat /proc/net/bonding/bond0 && ")
    assert "mtu.data" in [c.name for c in checks if c.node == "node01"]  # the MTU end to end, over the bond
    assert not [c for c in checks if c.node == "head01" and c.name.startswith("bond:")]
