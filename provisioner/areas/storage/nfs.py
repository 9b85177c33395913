"""NFS, pure: /etc/exports lines, nfsd threads, which exports and mounts a node has, the
address and protocol a client mounts over, client mount options."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from provisioner.areas.fabric.decide import node_rdma_networks, rdma_fabric
from provisioner.areas.storage.base import NFS_RDMA_PORT, StorageError, merge_options
from provisioner.areas.storage.zfs import property_text
from provisioner.manifest.fields import NETWORK_NAMES, NetworkName
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.ranges import contract
from provisioner.manifest.select import select_nodes, selects
from provisioner.manifest.storage import NfsExport, NfsMount


def node_network_ip(node: Node, net: NetworkName) -> str | None:
    iface = node.interfaces.get(net)
    return str(iface.ip) if iface is not None else None


def spread(client_ip: str, count: int) -> int:
    """Which of a server's ``count`` NICs on a network a client mounts from: the client's
    address there modulo ``count``. Addresses increment per node in a range, so a range of
    clients takes the NICs in turn; and the choice is the client's own, so adding, removing
    or reordering other nodes moves no mount (a moved mount is a remount)."""
    return int(ipaddress.IPv4Address(client_ip)) % count


def server_nic_ip(server: Node, client: Node, net: NetworkName) -> str | None:
    """The server's address on ``net`` a client mounts from: with one NIC there (a bond is
    one), that NIC's; with several (data, roce), the one :func:`spread` gives the client,
    among the server's NICs the OS configures (those with a name; the first always counts).
    None: the server or the client has no interface on ``net``."""
    server_iface, client_ip = server.interfaces.get(net), node_network_ip(client, net)
    if server_iface is None or client_ip is None:
        return None
    nics = [server_iface, *(nic for nic in server_iface.more if nic.interface)]
    return str(nics[spread(client_ip, len(nics))].ip)


def network_of(m: Manifest, client: str) -> NetworkName | None:
    """The manifest network a client entry names or lies in (None: outside all of them)."""
    if client in NETWORK_NAMES:
        return client
    cidr = ipaddress.IPv4Network(client, strict=False)
    for name in NETWORK_NAMES:
        net = getattr(m.networks, name)
        if net is not None and cidr.subnet_of(net.cidr):
            return name
    return None


def export_clients(m: Manifest, export: NfsExport) -> list[str]:
    """CIDRs allowed to mount: a network name becomes that network's CIDR."""
    out: list[str] = []
    for client in export.clients:
        if client in NETWORK_NAMES:
            net = getattr(m.networks, client)
            if net is None:
                raise StorageError(f"export {export.name!r}: network {client!r} is not defined")
            cidr = str(net.cidr)
        else:
            cidr = str(ipaddress.IPv4Network(client, strict=False))
        if cidr not in out:
            out.append(cidr)
    return out


def export_options(export: NfsExport) -> list[str]:
    generated = [
        "rw" if export.rw else "ro",
        "sync" if export.sync else "async",
        "root_squash" if export.root_squash else "no_root_squash",
        "no_subtree_check",
    ]
    return merge_options(generated, export.options)


def root_writes(export: NfsExport) -> bool:
    """Whether a client's root may write under the export: read-write, root not squashed
    (``root_squash``, the default, or ``all_squash`` make root the server's anonymous user)."""
    options = export_options(export)
    return "rw" in options and "root_squash" not in options and "all_squash" not in options


def exports_line(path: str, clients: Sequence[str], options: Sequence[str]) -> str:
    """One /etc/exports line: ``/path cidr1(opts) cidr2(opts)``."""
    if not clients:
        raise StorageError(f"export {path}: no clients")
    opts = ",".join(options)
    return " ".join([_exports_path(path), *(f"{c}({opts})" for c in clients)])


def _exports_path(path: str) -> str:
    # exports(5): a path with blanks is written in double quotes
    return f'"{path}"' if re.search(r"\s", path) else path


def nfsd_threads(cores: int, override: int | None = None) -> int:
    """nfsd threads: the manifest's number, else 4 per physical core within 8..256."""
    if override is not None:
        return override
    return max(8, min(256, 4 * cores))


def dataset_mountpoint(m: Manifest, node_name: str, dataset: str) -> str:
    """Where ZFS mounts ``pool/dataset`` on ``node_name``: the ``mountpoint`` property the
    manifest sets on it, else on its nearest listed ancestor (the pool's own properties
    included) with the rest of the name appended, else ZFS's default ``/<pool>/<dataset>``."""
    parts = dataset.split("/")
    pool = next((p for p in m.zfs.pools if p.name == parts[0] and p.node == node_name), None)
    props: dict[str, Mapping[str, Any]] = {}
    if pool is not None:
        props[pool.name] = pool.properties
        props.update({f"{pool.name}/{ds.name}": ds.properties for ds in pool.datasets})
    for i in range(len(parts), 0, -1):
        owner = "/".join(parts[:i])
        value = props.get(owner, {}).get("mountpoint")
        if value is None:
            continue
        text = property_text(value)
        inherited = "" if owner == dataset else f" (inherited from {owner})"
        if text in ("none", "legacy"):
            raise StorageError(
                f"dataset {dataset} has mountpoint={text}{inherited}: ZFS does not mount it, so it cannot be "
                "exported; give it a mountpoint or export a path")
        if not text.startswith("/"):
            raise StorageError(f"dataset {dataset}: mountpoint {text!r}{inherited} is not an absolute path")
        rest = "/".join(parts[i:])
        base = text.rstrip("/")
        return (f"{base}/{rest}" if rest else base) or "/"
    return "/" + dataset


def export_path(m: Manifest, export: NfsExport) -> str:
    """The exported directory: the export's ``path``, or its dataset's ZFS mountpoint."""
    if export.path is not None:
        return export.path
    return dataset_mountpoint(m, export.node, str(export.dataset))


def exports_for(m: Manifest, node: Node) -> list[NfsExport]:
    return [e for e in m.nfs.exports if e.node == node.name]


def export_by_name(m: Manifest, name: str) -> NfsExport:
    for exp in m.nfs.exports:
        if exp.name == name:
            return exp
    raise StorageError(f"unknown export {name!r}")


def mounts_for(m: Manifest, node: Node) -> list[NfsMount]:
    return [mnt for mnt in m.nfs.mounts if selects(m, mnt.nodes, node.name)]


def mounts_of_export(m: Manifest, export: NfsExport) -> list[NfsMount]:
    return [mnt for mnt in m.nfs.mounts if mnt.export == export.name]


def export_networks(m: Manifest, export: NfsExport) -> list[NetworkName]:
    """Networks an export serves, in the order its clients list them."""
    out: list[NetworkName] = []
    for client in export.clients:
        net = network_of(m, client)
        if net is not None and net not in out:
            out.append(net)
    return out


def rdma_network(m: Manifest, export: NfsExport, client: Node) -> NetworkName | None:
    """The RDMA fabric (InfiniBand or RoCE with rdma: true) a client reaches an export's
    server over: one both ends sit on, those the export serves first, in its order."""
    server = m.node(export.node)
    shared = [net for net in node_rdma_networks(m, client) if net in server.interfaces]
    served = [net for net in export_networks(m, export) if net in shared]
    return next(iter(served or shared), None)


def no_fabric_node(m: Manifest, client: Node, server: Node) -> str:
    """Which end of an RDMA mount is to change: the one on no RDMA fabric, else the client."""
    return server.name if node_rdma_networks(m, client) and not node_rdma_networks(m, server) else client.name


def no_shared_fabric(m: Manifest, mount: NfsMount, client: Node, server: Node) -> str:
    """Why an RDMA mount cannot be: an end on no RDMA fabric (the other's), or two fabrics."""
    c_nets, s_nets = node_rdma_networks(m, client), node_rdma_networks(m, server)
    if not c_nets or not s_nets:
        lacking, other = (client, s_nets) if not c_nets else (server, c_nets)
        kinds = " or ".join(other or m.networks.rdma())
        return f"mount {mount.path}: proto rdma but {lacking.name} has no {kinds} interface"
    return (f"mount {mount.path}: proto rdma but {client.name} ({', '.join(c_nets)}) and {server.name} "
            f"({', '.join(s_nets)}) share no RDMA fabric")


def mount_proto(m: Manifest, mount: NfsMount, client: Node) -> str:
    """tcp or rdma. ``auto`` picks rdma when the export serves an RDMA fabric (InfiniBand or
    RoCE with rdma: true) both ends have an interface on."""
    export = export_by_name(m, mount.export)
    server = m.node(export.node)
    net = rdma_network(m, export, client)
    if mount.proto == "rdma":
        if not rdma_fabric(m):
            raise StorageError(f"mount {mount.path}: proto rdma needs an infiniband or roce network with rdma: true")
        if net is None:
            raise StorageError(no_shared_fabric(m, mount, client, server), node=no_fabric_node(m, client, server))
        return "rdma"
    if mount.proto == "tcp":
        return "tcp"
    if net is not None and net in export_networks(m, export):
        return "rdma"
    return "tcp"


def server_address(m: Manifest, export: NfsExport, client: Node, proto: str) -> str:
    """The server IP a client mounts from: on a network where both ends have an interface
    and the export allows the client's address there (the server checks the source address
    of the mount, which is the client's address on that network). The networks the export
    names come first, in its order (the shared RDMA fabric for rdma); a CIDR that spans
    several networks (10.0.0.0/16) is matched by address. A server with several NICs there
    spreads its clients over them (:func:`server_nic_ip`). No such network: StorageError (the
    server would refuse the mount)."""
    server = m.node(export.node)
    if proto == "rdma":
        net = rdma_network(m, export, client)
        ip = server_nic_ip(server, client, net) if net is not None else None
        if ip is None:
            raise StorageError(f"export {export.name!r}: {server.name} has no interface on an RDMA fabric "
                               f"{client.name} is on", node=server.name)
        return ip
    allowed = [ipaddress.IPv4Network(c) for c in export_clients(m, export)]
    named = export_networks(m, export)
    for net in [*named, *(n for n in NETWORK_NAMES if n not in named)]:
        server_ip = server_nic_ip(server, client, net)
        client_ip = node_network_ip(client, net)
        if server_ip is None or client_ip is None:
            continue
        if any(ipaddress.IPv4Address(client_ip) in cidr for cidr in allowed):
            return server_ip
    raise StorageError(
        f"{client.name} cannot mount export {export.name!r}: {server.name} allows only "
        f"{', '.join(str(c) for c in allowed)}, and {client.name} has no address there on a network "
        f"{server.name} is on; add the network to the export's clients or the interface to {client.name}"
    )


def export_network_problems(m: Manifest, export: NfsExport) -> list[tuple[int, str]]:
    """(index in clients, message) for every client network of an export its server has
    no interface on: clients there would mount an address the export does not allow."""
    server = m.node(export.node)
    out: list[tuple[int, str]] = []
    for i, client in enumerate(export.clients):
        net = network_of(m, client)
        if net is not None and net not in server.interfaces:
            out.append((i, f"export {export.name!r} is limited to the {net} network ({client}), but its server "
                           f"{server.name} has no {net} interface, so no client can mount it over that network; "
                           f"give {server.name} an interfaces.{net} entry or serve a network it is on"))
    return out


def check_one_path_per_server(m: Manifest, client: Node) -> None:
    """NFS 4.1+ clients detect that two addresses belong to one server (session trunking)
    and send every mount of that server through the connection of the first one. Mounts of
    one server over different addresses or transports then fail (the server sees the first
    network's address and refuses an export it does not serve there) or silently leave
    RDMA. So a client mounts all NFSv4 exports of one server the same way."""
    seen: dict[str, tuple[str, str, str]] = {}
    for mount in mounts_for(m, client):
        if mount.vers == "3":
            continue
        export = export_by_name(m, mount.export)
        proto = mount_proto(m, mount, client)
        address = server_address(m, export, client, proto)
        first = seen.setdefault(export.node, (address, proto, mount.path))
        if first[:2] != (address, proto):
            raise StorageError(
                f"mounts {first[2]} and {mount.path} reach server {export.node} over {first[0]} ({first[1]}) "
                f"and {address} ({proto}): NFS 4.1+ shares one connection per server, so the second "
                "would use the first one's network; mount every export of a server over the same "
                "network and proto (serve them to the same clients)"
            )


def _nconnect_option(opt: str) -> bool:
    return opt.split("=", 1)[0] == "nconnect"


def mount_options(mount: NfsMount, proto: str) -> list[str]:
    """Mount options. Over RDMA there is no ``nconnect``: the NFS/RDMA transport of the
    Ubuntu 22.04/24.04 and Debian 12 kernels ignores it (validate warns when a manifest
    sets it there, :func:`nconnect_ignored`)."""
    generated = [f"vers={mount.vers}", f"proto={proto}"]
    if proto == "rdma":
        generated.append(f"port={NFS_RDMA_PORT}")
    else:
        generated.append(f"nconnect={mount.nconnect}")
    generated += [
        f"rsize={mount.rsize}",
        f"wsize={mount.wsize}",
        "hard" if mount.hard else "soft",
        "_netdev",
    ]
    extra = [o for o in mount.options if not (proto == "rdma" and _nconnect_option(o))]
    return merge_options(generated, extra)


def nconnect_ignored(m: Manifest, mount: NfsMount) -> str | None:
    """Why the manifest's nconnect for this mount has no effect (None: it has, or it is
    not set): clients that mount it over RDMA do not render it."""
    explicit = "nconnect" in mount.model_fields_set or any(_nconnect_option(o) for o in mount.options)
    if not explicit:
        return None
    try:
        rdma = sorted(n for n in select_nodes(m, mount.nodes) if mount_proto(m, mount, m.node(n)) == "rdma")
    except (StorageError, KeyError, ValueError):
        return None  # the mount's own problem is reported elsewhere
    if not rdma:
        return None
    return (f"mount {mount.path}: nconnect has no effect with proto=rdma (the NFS/RDMA transport of these "
            f"kernels ignores it) and is left out for {', '.join(contract(rdma))}; remove it")
