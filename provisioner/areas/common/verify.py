"""The common area's verify checks: /etc/hosts, the clock, each network's MTU end to end, bonds."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import Check, CheckList, NodeChecks, Outcome, Ring, judged
from provisioner.nodecheck.parsers import ParseError

NETWORKS = ("management", "data", "infiniband", "roce")  # the networks whose MTU is checked, in this order


# --------------------------------------------------------------------------- parsers
@dataclass(frozen=True)
class Tracking:
    synchronised: bool
    offset_s: float  # system time minus NTP time (positive: fast)
    reference: str = ""


def parse_chrony_tracking(text: str) -> Tracking:
    """``chronyc -n tracking``."""
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}
    if "System time" not in fields or "Leap status" not in fields:
        raise ParseError("no 'System time' / 'Leap status' lines (is chronyd running?)")
    m = re.match(r"([0-9.]+) seconds (fast|slow) of NTP time", fields["System time"])
    if not m:
        raise ParseError(f"System time {fields['System time']!r} is not 'N seconds fast|slow of NTP time'")
    offset = float(m.group(1)) * (1 if m.group(2) == "fast" else -1)
    return Tracking(fields["Leap status"] != "Not synchronised", offset, fields.get("Reference ID", ""))


@dataclass(frozen=True)
class HostsFile:
    names: dict[str, set[str]] = field(default_factory=dict)  # name -> addresses


def parse_hosts(text: str) -> HostsFile:
    names: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = line.split("#", 1)[0].split()
        for name in cells[1:]:
            names.setdefault(name, set()).add(cells[0])
    return HostsFile(names)


@dataclass(frozen=True)
class Ping:
    sent: int
    received: int
    too_big: bool  # "message too long" / "Frag needed": the path's MTU is smaller


def parse_ping(text: str) -> Ping:
    too_big = bool(re.search(r"message too long|Frag needed", text))
    m = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", text)
    if not m:
        if too_big:
            return Ping(0, 0, True)
        raise ParseError("no 'N packets transmitted, M received' line")
    return Ping(int(m.group(1)), int(m.group(2)), too_big)


@dataclass(frozen=True)
class BondMember:
    name: str
    up: bool
    mac: str  # the permanent MAC, lower case ("" when not shown)


@dataclass(frozen=True)
class Bonding:
    mode: str  # "802.3ad" or "active-backup" (else the driver's words)
    up: bool
    members: tuple[BondMember, ...]
    mtu: int | None


def parse_bonding(text: str) -> Bonding:
    """``/proc/net/bonding/<bond>`` and a ``mtu=N`` line: the bond's mode and MII status, each
    member's name, MII status and permanent MAC."""
    mode_line = re.search(r"^Bonding Mode: (.+)$", text, re.MULTILINE)
    if not mode_line:
        raise ParseError("no 'Bonding Mode:' line (no such bond?)")
    words = mode_line.group(1)
    mode = "802.3ad" if "802.3ad" in words else "active-backup" if "active-backup" in words else words
    head, *parts = re.split(r"^Slave Interface: ", text, flags=re.MULTILINE)
    members = []
    for part in parts:
        name = part.splitlines()[0].strip()
        status = re.search(r"^MII Status: (\S+)", part, re.MULTILINE)
        mac = re.search(r"^Permanent HW addr: (\S+)", part, re.MULTILINE)
        members.append(BondMember(name, bool(status and status.group(1) == "up"),
                                  mac.group(1).lower() if mac else ""))
    bond_status = re.search(r"^MII Status: (\S+)", head, re.MULTILINE)
    mtu = re.search(r"^mtu=(\d+)$", text, re.MULTILINE)
    return Bonding(mode, bool(bond_status and bond_status.group(1) == "up"), tuple(members),
                   int(mtu.group(1)) if mtu else None)


# --------------------------------------------------------------------------- verdicts
def hosts_verdict(m: Manifest) -> Callable[[HostsFile], Outcome]:
    def verdict(hosts: HostsFile) -> Outcome:
        wrong = []
        for node in m.nodes:
            want = str(node.ip)
            for name in (node.name, f"{node.name}.{m.fqdn_suffix}"):
                if want not in hosts.names.get(name, set()):
                    wrong.append(name)
        if wrong:
            return Outcome("FAIL", f"/etc/hosts lacks {', '.join(wrong[:5])}" + (" ..." if len(wrong) > 5 else ""))
        return Outcome("PASS", f"{len(m.nodes)} nodes")
    return verdict


def clock_verdict(limit_ms: float) -> Callable[[Tracking], Outcome]:
    def verdict(t: Tracking) -> Outcome:
        ms = t.offset_s * 1000
        if not t.synchronised:
            return Outcome("FAIL", f"chrony not synchronised (offset {ms:+.1f} ms)")
        if abs(ms) > limit_ms:
            return Outcome("FAIL", f"offset {ms:+.1f} ms, limit {limit_ms:g} ms")
        return Outcome("PASS", f"offset {ms:+.3f} ms")
    return verdict


def ping_verdict(mtu: int, peer: str) -> Callable[[Ping], Outcome]:
    def verdict(p: Ping) -> Outcome:
        if p.too_big:
            return Outcome("FAIL", f"MTU {mtu} does not pass to {peer} unfragmented (a smaller MTU on the path)")
        if p.received == 0:
            return Outcome("FAIL", f"no answer from {peer} at MTU {mtu}")
        return Outcome("PASS", f"MTU {mtu} to {peer}: {p.received}/{p.sent} answered")
    return verdict


def bond_verdict(name: str, mode: str, members: list[str], mtu: int) -> Callable[[Bonding], Outcome]:
    """The bond runs the manifest's mode, is up, every member (by name or MAC) is enslaved
    and up, and its MTU is the network's."""
    def verdict(b: Bonding) -> Outcome:
        problems = []
        if b.mode != mode:
            problems.append(f"mode {b.mode}, not {mode}")
        if not b.up:
            problems.append("down")
        for member in members:
            found = next((s for s in b.members if member in (s.name, s.mac)), None)
            if found is None:
                problems.append(f"{member} not enslaved")
            elif not found.up:
                problems.append(f"{member} down")
        if b.mtu != mtu:
            problems.append(f"MTU {b.mtu}, not {mtu}")
        if problems:
            return Outcome("FAIL", f"{name}: {', '.join(problems)}")
        return Outcome("PASS", f"{name} {mode} up, {len(b.members)} members up, MTU {mtu}")
    return verdict


def bond_command(name: str) -> str:
    return f"cat /proc/net/bonding/{name} && echo \"mtu=$(cat /sys/class/net/{name}/mtu)\""


def checks(m: Manifest) -> NodeChecks:
    """Every node: hosts, clock; per network it is on, ``mtu.<network>`` against the next node
    on that network (a ring in manifest order)."""
    rings = {net: Ring([n for n in m.nodes if net in n.interfaces]) for net in NETWORKS}

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        out.add("hosts", "cat /etc/hosts", judged(parse_hosts, hosts_verdict(m)))
        out.add("clock", "chronyc -n tracking",
                judged(parse_chrony_tracking, clock_verdict(m.verify.clock_offset_ms)))
        for carried, iface in node.interfaces.items():
            bond = node.bonds.get(iface.interface or "")
            network = m.networks.named(carried)
            if bond is not None and network is not None and iface.interface:
                out.add(f"bond:{iface.interface}", bond_command(iface.interface),
                        judged(parse_bonding, bond_verdict(iface.interface, bond.mode, bond.members, network.mtu)),
                        "kernel")
        for net in NETWORKS:
            network = getattr(m.networks, net)
            if network is None or net not in node.interfaces:
                continue
            peer = rings[net].peer(node)
            if peer is None:
                out.skip(f"mtu.{net}", f"no other node on the {net} network")
                continue
            out.add(f"mtu.{net}", f"ping -M do -s {network.mtu - 28} -c 3 -i 0.2 -W 2 {peer.interfaces[net].ip} 2>&1",
                    judged(parse_ping, ping_verdict(network.mtu, peer.name)), "kernel")
        return out.checks

    return node_checks
