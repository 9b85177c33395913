"""Structural whole-manifest checks: uniqueness, references between sections, layout arithmetic.

Each check returns diagnostics positioned at the offending value in the source file. The
areas' deeper checks (what a node's OS can install, what the storage logic can build) live
in ``provisioner/areas/<area>/checks.py`` and run after these, from ``provisioner.validate``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from provisioner.errors import Diagnostic
from provisioner.manifest.fields import NETWORK_NAMES, RDMA_NETWORKS, NetworkName
from provisioner.manifest.model import Manifest
from provisioner.manifest.networks import Network
from provisioner.manifest.nodes import MULTI_NIC_NETWORKS, Node, is_mac
from provisioner.manifest.ranges import RangeError, expand
from provisioner.manifest.select import SelectorError, select_nodes
from provisioner.manifest.source import PathKey, Source
from provisioner.platforms import NODE_ROLES

Check = Callable[[Manifest, Source], list[Diagnostic]]


def node_path(node: Node, *rest: str | int) -> PathKey:
    return ("nodes", node.source_index, *rest)


def nic_path(node: Node, net: str, index: int, *rest: str | int) -> PathKey:
    """Where a node's NIC on ``net`` is: the network's own entry, or (``index`` > 0) the
    list item of a further NIC (``more:`` instead of a list falls back to the network)."""
    return node_path(node, "interfaces", net, *((index,) if index else ()), *rest)


# Names the inventory uses for groups; a host with the same name confuses Ansible.
RESERVED_NAMES = frozenset({
    "all", "ungrouped", "localhost", *NODE_ROLES, "gpu",
    "infiniband", "roce", "scratch", "zfs", "nfs_server", "nfs_client", "mergerfs", "docker", "slurm_controller",
    "slurm_compute", "slurm_node",
})


def check_unique_nodes(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    names: dict[str, Node] = {}
    ips: dict[ipaddress.IPv4Address, str] = {}
    macs: dict[str, str] = {}
    bmcs: dict[str, str] = {}
    entries: set[int] = set()
    for node in m.nodes:
        if node.name in RESERVED_NAMES:
            out.append(src.diag(node_path(node, "name"),
                                f"{node.name!r} is reserved (an inventory group name); choose another host name"))
        if node.name in names:
            out.append(src.diag(node_path(node, "name"), f"duplicate host name {node.name!r}"))
        names[node.name] = node
        for net, k, iface in node.all_nics():
            if iface.ip in ips:
                out.append(
                    src.diag(nic_path(node, net, k, "ip"),
                             f"{node.name}: IP {iface.ip} is already used by {ips[iface.ip]}")
                )
            ips[iface.ip] = f"{node.name} ({net})"
            if iface.mac:
                if iface.mac in macs:
                    out.append(
                        src.diag(nic_path(node, net, k, "mac"),
                                 f"{node.name}: MAC {iface.mac} is already used by {macs[iface.mac]}")
                    )
                macs[iface.mac] = f"{node.name} ({net})"
        if node.source_index not in entries:  # a ranged entry's NICs are alike on every node: once
            entries.add(node.source_index)
            out += _nic_name_problems(node, src)
        if node.bmc is not None:
            addr = str(node.bmc.address)
            if addr in bmcs:
                out.append(src.diag(node_path(node, "bmc", "address"),
                                    f"{node.name}: BMC address {addr} is already used by {bmcs[addr]}"))
            bmcs[addr] = node.name
    for node in m.nodes:  # after the loop: the IP may belong to a node listed later
        bip = node.bmc.ipv4 if node.bmc is not None else None
        if bip is not None and bip in ips:
            out.append(src.diag(node_path(node, "bmc", "address"),
                                f"{node.name}: BMC address {bip} is also a node IP ({ips[bip]})"))
    return out


def _nic_name_problems(node: Node, src: Source) -> list[Diagnostic]:
    """A NIC named on two networks, or several NICs on a network that takes one."""
    out: list[Diagnostic] = []
    seen: dict[str, str] = {}
    for net, k, iface in node.all_nics():
        if iface.interface and iface.interface in seen:
            out.append(src.diag(nic_path(node, net, k, "interface"),
                                f"{node.name}: NIC {iface.interface} is already on the {seen[iface.interface]} "
                                "network; a NIC is in one place"))
        if iface.interface:
            seen.setdefault(iface.interface, net)
        if k and net not in MULTI_NIC_NETWORKS:
            out.append(src.diag(nic_path(node, net, k),
                                f"{node.name}: one NIC on the {net} network; several NICs go on "
                                f"{' or '.join(MULTI_NIC_NETWORKS)} (or bond the management or data network)"))
    return out


def _inside(net: Network, ip: ipaddress.IPv4Address) -> str | None:
    if ip not in net.cidr:
        return f"{ip} is outside {net.cidr}"
    if net.cidr.prefixlen < 31 and ip in (net.cidr.network_address, net.cidr.broadcast_address):
        return f"{ip} is the network or broadcast address of {net.cidr}"
    if net.gateway is not None and ip == net.gateway:
        return f"{ip} is the gateway of {net.cidr}"
    return None


def check_addresses(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    nets = m.networks
    for node in m.nodes:
        for net_name, k, iface in node.all_nics():
            net: Network | None = getattr(nets, net_name)
            if net is None:
                if k == 0:
                    out.append(src.diag(node_path(node, "interfaces", net_name),
                                        f"{node.name}: network {net_name!r} is not defined under networks"))
                continue
            problem = _inside(net, iface.ip)
            if problem:
                out.append(src.diag(nic_path(node, net_name, k, "ip"), f"{node.name}: {problem}"))
        if node.bmc is not None and nets.bmc is not None:
            bip = node.bmc.ipv4
            if bip is None:
                continue
            problem = _inside(nets.bmc, bip)
            if problem:
                out.append(src.diag(node_path(node, "bmc", "address"), f"{node.name}: BMC {problem}"))
    # networks must not overlap each other
    defined = nets.defined()
    for i, (a, na) in enumerate(defined):
        for b, nb in defined[i + 1 :]:
            if na.cidr.overlaps(nb.cidr):
                out.append(src.diag(("networks", b, "cidr"), f"{nb.cidr} overlaps the {a} network {na.cidr}"))
    return out


def check_rdma_devices(m: Manifest, src: Source) -> list[Diagnostic]:
    """``rdma_device`` names an RDMA NIC: it belongs on an infiniband or roce interface only,
    and one device serves one network."""
    out: list[Diagnostic] = []
    for node in m.nodes:
        seen: dict[str, str] = {}
        for net, k, iface in node.all_nics():
            if iface.rdma_device is None:
                continue
            if net not in RDMA_NETWORKS:
                out.append(src.diag(nic_path(node, net, k, "rdma_device"),
                                    f"{node.name}: rdma_device is for the infiniband and roce networks, not {net}"))
            elif iface.rdma_device in seen:
                out.append(src.diag(nic_path(node, net, k, "rdma_device"),
                                    f"{node.name}: RDMA device {iface.rdma_device} is already on the "
                                    f"{seen[iface.rdma_device]} network"))
            seen.setdefault(iface.rdma_device, net)
    return out


# the networks whose interface may be a bond; a management bond is built by the node's install
# (installer seed or image), never reconfigured live (docs/baremetal.md, "A bonded management link")
BONDED_NETWORKS: tuple[NetworkName, ...] = ("management", "data")


def _bond_users(node: Node) -> dict[str, list[NetworkName]]:
    """bond name -> the networks whose interface names it."""
    return {name: [net for net, iface in node.interfaces.items() if iface.interface == name] for name in node.bonds}


def check_bonds(m: Manifest, src: Source) -> list[Diagnostic]:
    """Bonds (issue 28 item 2): each carries exactly one network, management or data (a
    management bond lists the NIC it PXE-boots from, the management ``mac``); its MTU agrees with
    that network's; no NIC is in two places (two bonds, or a bond and a network's own
    interface, by name or MAC, on this node or, by MAC, on another)."""
    out: list[Diagnostic] = []

    def add(report: bool, diag: Diagnostic) -> None:
        if report:
            out.append(diag)

    owner: dict[str, str] = {}  # MAC -> "node (what)" over the whole cluster
    for node in m.nodes:
        for net, _, iface in node.all_nics():
            if iface.mac:
                owner.setdefault(iface.mac, f"{node.name} ({net})")
    entries: set[int] = set()  # a ranged entry's nodes share its bonds: report once per entry
    for node in m.nodes:
        first = node.source_index not in entries
        entries.add(node.source_index)
        users = _bond_users(node)
        names = {iface.interface: net for net, _, iface in node.all_nics() if iface.interface}
        macs = {iface.mac: net for net, _, iface in node.all_nics() if iface.mac}
        seen: dict[str, str] = {}
        for bond_name, bond in node.bonds.items():
            at = node_path(node, "bonds", bond_name)
            nets = users[bond_name]
            if not nets:
                add(first, src.diag(at, f"{node.name}: bond {bond_name} carries no network; name it as the "
                                        f"interface of one ({', '.join(BONDED_NETWORKS)}: interface: {bond_name})"))
            for net in nets:
                if net not in BONDED_NETWORKS:
                    add(first, src.diag(node_path(node, "interfaces", net, "interface"),
                                        f"{node.name}: bonds carry the {' or '.join(BONDED_NETWORKS)} network, "
                                        f"not {net}"))
            pxe = node.interfaces["management"].mac if "management" in nets else None
            if pxe is not None and pxe not in bond.members and all(is_mac(x) for x in bond.members):
                add(first, src.diag((*at, "members"),
                                    f"{node.name}: the management MAC {pxe} (the NIC the node boots and "
                                    f"installs over) is not a member of bond {bond_name}; list it among them"))
            if len(nets) > 1:
                add(first, src.diag(at, f"{node.name}: bond {bond_name} is the interface of {' and '.join(nets)}; "
                                        "a bond carries one network"))
            network = m.networks.named(nets[0]) if nets else None
            if bond.mtu is not None and network is not None and bond.mtu != network.mtu:
                add(first, src.diag((*at, "mtu"), f"{node.name}: bond {bond_name} MTU {bond.mtu} disagrees with "
                                                  f"the {nets[0]} network's MTU {network.mtu}"))
            for i, member in enumerate(bond.members):
                where = (*at, "members", i)
                if member in seen:
                    add(first, src.diag(where, f"{node.name}: {member} is a member of {seen[member]} too"))
                elif member in names:
                    add(first, src.diag(where, f"{node.name}: {member} is the {names[member]} network's own "
                                               "interface; a NIC is in one place"))
                elif member == pxe:
                    pass  # the management bond's own PXE NIC
                elif member in macs:
                    add(first, src.diag(where, f"{node.name}: {member} is the MAC of the {macs[member]} "
                                               "network's interface; a NIC is in one place"))
                elif member in owner and not owner[member].startswith(f"{node.name} "):
                    add(True, src.diag(where, f"{node.name}: MAC {member} is already used by {owner[member]}"))
                seen.setdefault(member, f"bond {bond_name}")
                if is_mac(member):
                    owner.setdefault(member, f"{node.name} (bond {bond_name})")
        for net, iface in node.interfaces.items():
            if iface.interface in users:
                continue
            if iface.interface and iface.interface.startswith("bond") and net in BONDED_NETWORKS:
                add(first, src.diag(node_path(node, "interfaces", net, "interface"),
                                    f"{node.name}: no bond {iface.interface} under the node's bonds"))
    return out


def check_roles(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    heads = m.with_role("head")
    if not heads:
        out.append(src.diag(("nodes",), "no node has role 'head' (the head node runs the controller, NTP and PXE)"))
    elif len(heads) > 1:
        out.append(src.diag(node_path(heads[1], "roles"),
                            f"{heads[1].name}: only one head node is supported (already {heads[0].name})"))
    for node in m.nodes:
        if any(m.networks.named(net) is None for net in node.interfaces):
            continue  # reported by check_addresses
        if len(node.install_disks) == 2 and node.install_disks[0] == node.install_disks[1]:
            out.append(src.diag(node_path(node, "install_disks"), f"{node.name}: the two install disks are the same"))
        try:  # count disks, not entries: "ata-X[1-4]" and "ata-X2" name ata-X2 twice
            disk_ids = [name for d in node.hardware.disks for name in expand(d.id)]
        except RangeError as exc:
            out.append(src.diag(node_path(node, "hardware", "disks"), f"{node.name}: {exc}"))
            continue
        for did in sorted({d for d in disk_ids if disk_ids.count(d) > 1}):
            out.append(src.diag(node_path(node, "hardware", "disks"), f"{node.name}: disk {did!r} is listed twice"))
    return out


def check_zfs(m: Manifest, src: Source) -> tuple[list[Diagnostic], list[Diagnostic]]:
    errors: list[Diagnostic] = []
    warnings: list[Diagnostic] = []
    names = set(m.node_names())
    seen_pools: set[tuple[str, str]] = set()
    disks_on: dict[str, dict[str, str]] = {}  # node -> disk -> where used: pools on one node share its disks
    for i, pool in enumerate(m.zfs.pools):
        base: PathKey = ("zfs", "pools", i)
        if pool.node not in names:
            errors.append(src.diag((*base, "node"), f"pool {pool.name!r} names unknown node {pool.node!r}"))
        elif not m.node(pool.node).has_role("storage"):
            errors.append(
                src.diag((*base, "node"), f"pool {pool.name!r}: node {pool.node!r} does not have role 'storage'")
            )
        if (pool.node, pool.name) in seen_pools:
            errors.append(src.diag((*base, "name"), f"pool {pool.name!r} is defined twice on {pool.node}"))
        seen_pools.add((pool.node, pool.name))
        used = disks_on.setdefault(pool.node, {})
        groups = [("vdevs", pool.vdevs)] + ([("special", pool.special)] if pool.special else [])
        for key, group in groups:
            assert group is not None
            try:
                disks = [d for item in group.disks for d in expand(item)]
            except RangeError as exc:
                errors.append(src.diag((*base, key, "disks"), str(exc)))
                continue
            minimum = {"mirror": 2, "raidz1": 3, "raidz2": 4, "raidz3": 5, "stripe": 1}[group.type]
            if group.width < minimum:
                errors.append(src.diag((*base, key, "width"),
                                       f"a {group.type} group needs a width of at least {minimum}"))
            elif len(disks) % group.width:
                errors.append(src.diag((*base, key, "disks"),
                                       f"{len(disks)} disks do not divide into {group.type} groups of {group.width}"))
            if key == "vdevs" and pool.purpose == "training-data" and group.type.startswith("raidz"):
                warnings.append(src.diag((*base, key, "type"),
                                         f"pool {pool.name!r} holds training data on {group.type}: mirrors keep "
                                         "random reads fast; raidz bottlenecks ETL and training", "warning"))
            if group.type == "stripe" and key == "vdevs":
                warnings.append(src.diag((*base, key, "type"),
                                         f"pool {pool.name!r} has no redundancy: one disk failure loses the pool",
                                         "warning"))
            for d in disks:
                if d in used:
                    errors.append(src.diag((*base, key, "disks"), f"disk {d!r} is used twice (also in {used[d]})"))
                used[d] = f"pool {pool.name!r} {key}"
        for key in ("log", "cache"):
            try:
                devs = [d for item in getattr(pool, key) for d in expand(item)]
            except RangeError as exc:
                errors.append(src.diag((*base, key), str(exc)))
                continue
            for d in devs:
                if d in used:
                    errors.append(src.diag((*base, key), f"disk {d!r} is used twice (also in {used[d]})"))
                used[d] = f"pool {pool.name!r} {key}"
        try:
            log_devices = [d for item in pool.log for d in expand(item)]  # count devices, not entries
        except RangeError:
            log_devices = []  # reported above
        if len(log_devices) == 1:
            warnings.append(src.diag((*base, "log"), f"pool {pool.name!r}: a single SLOG device is not mirrored",
                                     "warning"))
        ds_names = [d.name for d in pool.datasets]
        for dup in {n for n in ds_names if ds_names.count(n) > 1}:
            errors.append(src.diag((*base, "datasets"), f"dataset {dup!r} is listed twice"))
    return errors, warnings


def check_nfs(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    names = set(m.node_names())
    exports: dict[str, int] = {}
    for i, exp in enumerate(m.nfs.exports):
        base: PathKey = ("nfs", "exports", i)
        if exp.name in exports:
            out.append(src.diag((*base, "name"), f"export name {exp.name!r} is used twice"))
        exports[exp.name] = i
        if exp.node not in names:
            out.append(src.diag((*base, "node"), f"export {exp.name!r} names unknown node {exp.node!r}"))
        if exp.dataset is not None:
            pool = exp.dataset.split("/")[0]
            if not any(p.name == pool and p.node == exp.node for p in m.zfs.pools):
                out.append(src.diag((*base, "dataset"), f"export {exp.name!r}: no pool {pool!r} on {exp.node}"))
        for c, client in enumerate(exp.clients):
            if client in NETWORK_NAMES:
                if getattr(m.networks, client) is None:
                    out.append(src.diag((*base, "clients", c), f"network {client!r} is not defined"))
                continue
            try:
                ipaddress.IPv4Network(client, strict=False)
            except ValueError:
                out.append(src.diag((*base, "clients", c), f"{client!r} is neither a network name nor a CIDR"))
    mount_paths: dict[tuple[str, str], int] = {}
    for i, mnt in enumerate(m.nfs.mounts):
        base = ("nfs", "mounts", i)
        if mnt.export not in exports:
            out.append(src.diag((*base, "export"), f"mount {mnt.path}: unknown export {mnt.export!r}"))
        try:
            nodes = select_nodes(m, mnt.nodes)
        except SelectorError as exc:
            out.append(src.diag((*base, "nodes"), f"mount {mnt.path}: {exc}"))
            continue
        for n in nodes:
            if (n, mnt.path) in mount_paths:
                out.append(src.diag((*base, "path"), f"{n} mounts two things at {mnt.path}"))
            mount_paths[(n, mnt.path)] = i
        if mnt.proto == "rdma" and not m.networks.rdma():
            out.append(src.diag((*base, "proto"), "proto rdma needs an infiniband or roce network with rdma: true"))
    return out


def check_mergerfs(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for i, union in enumerate(m.mergerfs):
        base: PathKey = ("mergerfs", i)
        try:
            select_nodes(m, union.nodes)
        except SelectorError as exc:
            out.append(src.diag((*base, "nodes"), f"union {union.path}: {exc}"))
        if union.path in union.branches:
            out.append(src.diag((*base, "branches"), f"union {union.path} lists itself as a branch"))
        if len(set(union.branches)) != len(union.branches):
            out.append(src.diag((*base, "branches"), "a branch is listed twice"))
    return out


def check_docker(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    if not m.docker.enabled:
        return out
    try:
        select_nodes(m, m.docker.nodes)
    except SelectorError as exc:
        out.append(src.diag(("docker", "nodes"), str(exc)))
    nets = m.networks.defined()
    for i, pool in enumerate(m.docker.address_pools):
        if pool.size < pool.base.prefixlen:
            out.append(src.diag(("docker", "address_pools", i, "size"),
                                f"size /{pool.size} is larger than the pool {pool.base}"))
        for name, net in nets:
            if net is not None and pool.base.overlaps(net.cidr):
                out.append(src.diag(("docker", "address_pools", i, "base"),
                                    f"{pool.base} collides with the {name} network {net.cidr}"))
    admins = {u.name for u in m.cluster.admin_users}
    for i, user in enumerate(m.docker.users):
        if user not in admins:
            out.append(src.diag(("docker", "users", i), f"{user!r} is not one of cluster.admin_users"))
    return out


def check_slurm(m: Manifest, src: Source) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    if not m.slurm.enabled:
        return out
    defaults = [p for p in m.slurm.partitions if p.default]
    if len(defaults) > 1:
        out.append(src.diag(("slurm", "partitions"), "more than one partition has default: true"))
    seen: set[str] = set()
    for i, part in enumerate(m.slurm.partitions):
        base: PathKey = ("slurm", "partitions", i)
        if part.name in seen:
            out.append(src.diag((*base, "name"), f"partition {part.name!r} is defined twice"))
        seen.add(part.name)
        try:
            members = select_nodes(m, part.nodes)
        except SelectorError as exc:
            out.append(src.diag((*base, "nodes"), f"partition {part.name!r}: {exc}"))
            continue
        for name in members:
            if not m.node(name).has_role("compute"):
                out.append(src.diag((*base, "nodes"),
                                    f"partition {part.name!r}: {name} does not have role 'compute'"))
    if m.with_role("compute") and not m.slurm.partitions:
        out.append(src.diag(("slurm",), "slurm is enabled but has no partitions", "warning"))
    return out


CHECKS: list[Check] = [
    check_unique_nodes,
    check_addresses,
    check_rdma_devices,
    check_bonds,
    check_roles,
    check_nfs,
    check_mergerfs,
    check_docker,
    check_slurm,
]


def sort_diagnostics(diags: list[Diagnostic]) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """Split into (errors, warnings), keeping the order."""
    errors = [d for d in diags if d.severity != "warning"]
    return errors, [d for d in diags if d.severity == "warning"]


def run_checks(m: Manifest, src: Source) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """The structural checks: (errors, warnings)."""
    errors, warnings = sort_diagnostics([d for check in CHECKS for d in check(m, src)])
    zerr, zwarn = check_zfs(m, src)
    return errors + zerr, warnings + zwarn
