"""The fabric area's verify checks: RDMA bandwidth (ib_write_bw) against the next node of
each RDMA fabric's ring, judged against a share of the port's link rate."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.areas.fabric import decide
from provisioner.manifest.fields import NetworkName
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import Check, CheckList, NodeChecks, Outcome, Ring, judged
from provisioner.nodecheck.parsers import ParseError

WRITE_BW_PORT = 18515  # ib_write_bw's own default, named: the server side waits until it listens there
WRITE_BW_LISTEN_S = 20  # how long the server side may take to open its device and listen
# what both sides of rdma.write_bw pass (they must agree on the port and the duration)
WRITE_BW_ARGS = f"--report_gbits -D 3 -p {WRITE_BW_PORT}"
# perftest times its run by the CPU's cycle counter, calibrated against the clock at start;
# where the samples do not line up (r^2 < 0.9: a node starved of CPU, a VM under emulation)
# it measured nothing and says so. The pair is measured again (provisioner.verify.run.PAIR_TRIES).
WRITE_BW_CALIBRATION_FAILED = "Can't produce a report"


# --------------------------------------------------------------------------- parsers
@dataclass(frozen=True)
class WriteBw:
    link_gbps: float  # the port's rate (sysfs), Gb/s
    average_gbps: float  # ib_write_bw --report_gbits, the largest message size's average


def parse_link_rate(text: str) -> float:
    """``/sys/class/infiniband/<dev>/ports/<n>/rate``: ``100 Gb/sec (4X EDR)``."""
    m = re.search(r"^rate=([0-9.]+) Gb/sec", text, re.MULTILINE)
    if not m:
        raise ParseError("no 'rate=N Gb/sec' line (no RDMA device?)")
    return float(m.group(1))


def parse_write_bw(text: str) -> WriteBw:
    rate = parse_link_rate(text)
    rows = [line.split() for line in text.splitlines()]
    data = [r for r in rows if len(r) >= 4 and r[0].isdigit() and _is_number(r[3])]
    if not data:
        raise ParseError("no ib_write_bw result row (#bytes #iterations peak average ...)")
    return WriteBw(rate, float(data[-1][3]))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- checks
def write_bw_verdict(fraction: float) -> Callable[[WriteBw], Outcome]:
    def verdict(w: WriteBw) -> Outcome:
        floor = w.link_gbps * fraction
        if w.average_gbps < floor:
            return Outcome("FAIL", f"{w.average_gbps:g} Gb/s, below {fraction:g} of the {w.link_gbps:g} Gb/s link")
        return Outcome("PASS", f"{w.average_gbps:g} Gb/s of {w.link_gbps:g} Gb/s")
    return verdict


def write_bw_server(wait_s: int = WRITE_BW_LISTEN_S, fabric_args: str = "") -> str:
    """The peer side of rdma.write_bw: start an ib_write_bw server that waits for one client
    (90 s at most) and return once it listens on WRITE_BW_PORT, so the client never races its start
    (opening a device takes seconds on a loaded node). A server that exits or does not listen
    within ``wait_s`` fails the setup with its own output (and is stopped). ``fabric_args``:
    the peer's device and GID index (:func:`fabric_args`)."""
    port = WRITE_BW_PORT
    args = f"{WRITE_BW_ARGS} {fabric_args}".rstrip()
    return (f"log=$(mktemp); nohup timeout 90 ib_write_bw {args} >\"$log\" 2>&1 </dev/null & "
            f"pid=$!; i=0; while [ $i -lt {wait_s * 2} ]; do "
            f"if ss -Hltn 'sport = :{port}' | grep -q .; then rm -f \"$log\"; exit 0; fi; "
            "kill -0 $pid 2>/dev/null || break; sleep 0.5; i=$((i + 1)); done; "
            f"echo \"ib_write_bw server not listening on port {port} after {wait_s} s or exited: "
            "$(cat \"$log\")\" >&2; "
            "kill $pid 2>/dev/null; rm -f \"$log\"; exit 1")


def write_bw_name(net: NetworkName) -> str:
    """The check's name per fabric: ``rdma.write_bw`` on InfiniBand, ``rdma.write_bw.roce``."""
    return "rdma.write_bw" if net == "infiniband" else f"rdma.write_bw.{net}"


def fabric_args(m: Manifest, node: Node, net: NetworkName, k: int = 0) -> str:
    """ib_write_bw's options for ``node``'s ``k``-th NIC on ``net``: its RDMA device where the
    manifest names it (``-d``), and on RoCE the GID index of RoCE v2 over IPv4 (``-x``): without
    it perftest picks GID 0, the link-local one, which does not route."""
    args = []
    device = node.interfaces[net].nics()[k].rdma_device
    if device:
        args.append(f"-d {shlex.quote(device)}")
    roce = m.networks.roce
    if net == "roce" and roce is not None:
        args.append(f"-x {roce.gid_index}")
    return " ".join(args)


def link_rate_command(node: Node, net: NetworkName, k: int = 0) -> str:
    """The port's rate from sysfs: the ``k``-th NIC's named RDMA device's, else the first
    device's."""
    device = node.interfaces[net].nics()[k].rdma_device
    pattern = f"/sys/class/infiniband/{shlex.quote(device)}/ports/1/rate" if device \
        else "/sys/class/infiniband/*/ports/1/rate"
    return f"for r in {pattern}; do echo \"rate=$(cat \"$r\")\"; break; done; "


def write_bw_fraction(m: Manifest, net: NetworkName) -> float:
    """The floor's share of the link rate on this fabric."""
    per_fabric = m.verify.write_bw_fraction
    if net == "infiniband" or net == "roce":
        return per_fabric.get(net, m.verify.ib_write_bw_fraction)
    return m.verify.ib_write_bw_fraction


def rdma_checks(m: Manifest, node: Node, rings: dict[NetworkName, Ring], out: CheckList) -> None:
    """``rdma.write_bw`` (InfiniBand) and ``rdma.write_bw.roce`` against the next node of
    each RDMA fabric's ring the node is on; a node's further RoCE NICs each their own
    (``rdma.write_bw.roce.2``...), from that NIC's device to the peer's NIC of the same place
    (the same rail), else the peer's first."""
    for net in decide.node_rdma_networks(m, node):
        peer = rings[net].peer(node)
        if peer is None:
            out.skip(write_bw_name(net), f"no other node on the {net} network")
            continue
        targets = peer.interfaces[net].nics()
        for k in range(len(node.interfaces[net].nics())):
            name = write_bw_name(net) + (f".{k + 1}" if k else "")
            pk = k if k < len(targets) else 0
            # one try: the server listens already (its setup waited for that) and serves one
            # client, so a failed try leaves nothing to try again against
            args = f"{WRITE_BW_ARGS} {fabric_args(m, node, net, k)}".rstrip()
            client = link_rate_command(node, net, k) + f"ib_write_bw {args} {targets[pk].ip}"
            bw = write_bw_verdict(write_bw_fraction(m, net))
            out.add(name, client, judged(parse_write_bw, bw), "kernel",
                    setup=(peer.name, write_bw_server(fabric_args=fabric_args(m, peer, net, pk))),
                    again_if=WRITE_BW_CALIBRATION_FAILED)


def checks(m: Manifest) -> NodeChecks:
    rings = {net: Ring([n for n in m.nodes if net in n.interfaces]) for net in m.networks.rdma()}

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        rdma_checks(m, node, rings, out)
        return out.checks

    return node_checks
