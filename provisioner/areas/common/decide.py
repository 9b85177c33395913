"""Decisions of the common area, pure: who may log in as root; the data network's
interfaces.

root, and a non-root account Ansible connects as (``cluster.ssh.user``, which gets
password-less sudo), are root on every node. So they carry only the SSH keys of admins
allowed root (``sudo: true``) plus the dedicated automation key ``cluster.ssh.public_key``;
an admin with ``sudo: false`` must not reach root through them. The installer
configurations (provisioner.areas.baremetal.seeds) use this, and the common role enforces
the same list in root's authorized_keys on every apply (``common_root_authorized_keys``).

The data network (issue 19 item 11) is configured by the common role from
``common_data_interfaces`` (:func:`data_interfaces`); the two renderers say what the role's
files carry per OS (address, MTU, no gateway; NICs that share a prefix a routing table each),
and the tests hold the role's templates to them.
"""

from __future__ import annotations

from typing import Any

from provisioner.manifest.fields import NetworkName
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node, is_mac

# Interfaces on these networks carry bulk traffic: address and MTU from the manifest. A RoCE
# NIC is an Ethernet NIC like a data one (RDMA rides on its IP address); the ofed role adds
# the RDMA stack (provisioner.areas.fabric.decide).
DATA_NETWORKS: tuple[NetworkName, ...] = ("data", "roce")

# What the common role installs on every node, the same on Debian 12 and Ubuntu 22.04/24.04
# (roles/common/vars/*.yml: __common_required_packages, and the defaults' common_packages;
# the tests hold this to them). A node image carries them (provision image build), so a
# deployed node's first apply finds them installed instead of unpacking them then (100 s of
# the VM lab's deployed node under emulation; minutes on a slow mirror).
BASE_PACKAGES: tuple[str, ...] = (
    "chrony", "sudo", "tzdata", "iproute2", "python3-apt", "ca-certificates",
    "acl", "bash-completion", "ethtool", "htop", "iputils-ping", "jq", "lsof", "numactl", "pciutils", "psmisc",
    "rsync", "tmux", "vim-tiny",
)


def image_packages(m: Manifest) -> tuple[str, ...]:
    """Packages a node OS image built for this manifest carries: the common role's, which
    every node gets."""
    return BASE_PACKAGES


def privileged_keys(m: Manifest) -> list[str]:
    """Keys of root (and of a non-root Ansible account): the keys of admins with sudo, then
    ``cluster.ssh.public_key``; each once, in manifest order."""
    keys = [k for u in m.cluster.admin_users if u.sudo for k in u.ssh_keys]
    if m.cluster.ssh.public_key:
        keys.append(m.cluster.ssh.public_key)
    return list(dict.fromkeys(keys))


def root_authorized_keys(m: Manifest) -> list[str]:
    """root's authorized_keys: the privileged keys when Ansible connects as root, else none
    (root logs in with no key)."""
    return privileged_keys(m) if m.cluster.ssh.user == "root" else []


def enforced_root_keys(m: Manifest) -> list[str] | None:
    """What the common role writes to root's authorized_keys on every apply: the keys of
    :func:`root_authorized_keys`; None (leave root's keys alone) when Ansible connects as
    root and no key is allowed root, since an empty file would lock Ansible out (validate
    warns: :func:`unmanaged_root_keys_problem`)."""
    if m.cluster.ssh.user == "root" and not privileged_keys(m):
        return None
    return root_authorized_keys(m)


def unmanaged_root_keys_problem(m: Manifest) -> str | None:
    """Why root's keys are left as they are (None: the role enforces them)."""
    if enforced_root_keys(m) is not None:
        return None
    return ("no admin has sudo: true and cluster.ssh.public_key is unset, so no key is allowed root and "
            "apply leaves root's authorized_keys as they are (an empty list would lock Ansible out); "
            "keys already there, an admin's with sudo: false included, keep reaching root: give an admin "
            "sudo or set cluster.ssh.public_key")


def ansible_account_problem(m: Manifest) -> str | None:
    """Why Ansible could not log in after an install (None: it can)."""
    user = m.cluster.ssh.user
    admins = {u.name: u for u in m.cluster.admin_users}
    if user in admins:
        if not admins[user].sudo:
            return (f"cluster.ssh.user {user!r} is an admin with sudo: false; Ansible needs root on every node: "
                    "give that admin sudo or connect as another account")
        return None
    if not privileged_keys(m):
        return (f"Ansible connects as {user!r}, which gets only the keys of admins with sudo: true and "
                "cluster.ssh.public_key, and there are none; give an admin sudo or set cluster.ssh.public_key")
    return None


# --------------------------------------------------------------------------- data network
def data_interfaces(m: Manifest, node: Node) -> list[dict[str, Any]]:
    """The node's data-network and RoCE interfaces as the OS is to configure them (issue 19
    item 11: /etc/hosts lists ``<node>-data`` and NFS may use that network, so its address
    must be set): interface, address/prefix and MTU; never a gateway (the default route stays on
    the management network). Interfaces without a name cannot be configured and are left
    out. Several NICs on one network each get a routing table of their own
    (:func:`source_tables`)."""
    out: list[dict[str, Any]] = []
    for net_name in DATA_NETWORKS:
        iface = node.interfaces.get(net_name)
        net = getattr(m.networks, net_name)
        if iface is None or net is None:
            continue
        entries = []
        for nic in iface.nics():  # the network's NIC and its further ones, each its own address
            if not nic.interface:
                continue
            entry: dict[str, Any] = {"interface": nic.interface, "address": f"{nic.ip}/{net.cidr.prefixlen}",
                                     "mtu": net.mtu}
            bond = node.bonds.get(nic.interface)
            if bond is not None:  # only then: a NIC's entry stays what it was before bonds existed
                entry["bond"] = {"mode": bond.mode, "members": [bond_member(member) for member in bond.members]}
            entries.append(entry)
        out.extend(source_tables(entries, str(net.cidr), first_table=SOURCE_TABLE_BASE + 1 + len(out)))
    return out


# The routing tables of NICs that share a network's prefix: 101, 102, ... per node (the main
# table is 254, local 255; 1-252 are free for the site).
SOURCE_TABLE_BASE = 100
# Several NICs on one prefix: each answers ARP only for its own addresses, and announces only
# those (else one NIC answers for all, and every packet to the node arrives there).
SOURCE_ROUTED_SYSCTL: dict[str, int] = {"net.ipv4.conf.all.arp_ignore": 1, "net.ipv4.conf.all.arp_announce": 2}


def source_tables(entries: list[dict[str, Any]], network: str, first_table: int) -> list[dict[str, Any]]:
    """A network's interface entries; where there are several (NICs sharing the prefix), each
    with ``table`` (its own routing table: the prefix on that NIC) and ``network`` (the
    prefix): packets from a NIC's address leave by that NIC (a rule ``from <address>``), not
    all by the one NIC the main table's first route names. One NIC: its entry as before."""
    if len(entries) < 2:
        return entries
    return [{**entry, "table": first_table + k, "network": network} for k, entry in enumerate(entries)]


def data_sysctl(interfaces: list[dict[str, Any]]) -> dict[str, int]:
    """sysctl settings the data interfaces need beyond ``common_sysctl``: the ARP behaviour
    of NICs sharing a prefix (:data:`SOURCE_ROUTED_SYSCTL`) where any entry has a table."""
    return dict(SOURCE_ROUTED_SYSCTL) if any("table" in i for i in interfaces) else {}


def source_route(interface: dict[str, Any]) -> tuple[str, str, int] | None:
    """(prefix, address, table) of a source-routed entry, else None."""
    if "table" not in interface:
        return None
    return interface["network"], interface["address"].split("/")[0], interface["table"]


def bond_member(member: str) -> dict[str, str]:
    """A bond member as the role matches it: ``{"mac": ...}`` or ``{"name": ...}``."""
    return {"mac": member} if is_mac(member) else {"name": member}


# Linux bonding parameters per mode: carrier checked every 100 ms; LACP with fast LACPDUs and
# flows spread by addresses and ports (one TCP stream stays on one member)
BOND_MII_MS = 100


def netplan_bond_parameters(mode: str) -> dict[str, Any]:
    params: dict[str, Any] = {"mode": mode, "mii-monitor-interval": BOND_MII_MS}
    if mode == "802.3ad":
        params |= {"lacp-rate": "fast", "transmit-hash-policy": "layer3+4"}
    return params


def netplan_member_id(bond: str, index: int, member: dict[str, str]) -> str:
    """A member's id in netplan: its name, or ``<bond>-m<i>`` matched by MAC."""
    return member.get("name") or f"{bond}-m{index}"


def netplan_data_config(interfaces: list[dict[str, Any]]) -> dict[str, Any]:
    """Ubuntu: a netplan file for the data interfaces: static, no DHCP, no router
    advertisements or link-local addresses, no gateway (NICs sharing a prefix: each its
    table, :func:`source_tables`); ``optional`` so that a data link without carrier does not
    hold up boot (network-online waits for management only).
    roles/common/templates/netplan-data.yaml.j2 renders the same (tests compare them)."""
    def quiet(mtu: int) -> dict[str, Any]:
        return {"dhcp4": False, "dhcp6": False, "accept-ra": False, "link-local": [], "optional": True,
                "mtu": mtu}

    def routed(i: dict[str, Any]) -> dict[str, Any]:
        route = source_route(i)
        if route is None:
            return {}
        prefix, address, table = route
        return {"routes": [{"to": prefix, "scope": "link", "from": address, "table": table}],
                "routing-policy": [{"from": address, "table": table}]}

    ethernets: dict[str, Any] = {}
    bonds: dict[str, Any] = {}
    for i in interfaces:
        link = quiet(i["mtu"]) | {"addresses": [i["address"]]} | routed(i)
        bond = i.get("bond")
        if bond is None:
            ethernets[i["interface"]] = {**quiet(i["mtu"]), "addresses": [i["address"]], **routed(i)}
            continue
        ids = []
        for n, member in enumerate(bond["members"]):
            ident = netplan_member_id(i["interface"], n, member)
            ids.append(ident)
            ethernets[ident] = ({"match": {"macaddress": member["mac"]}} if "mac" in member else {}) | quiet(i["mtu"])
        bonds[i["interface"]] = {"interfaces": ids, **link, "parameters": netplan_bond_parameters(bond["mode"])}
    network: dict[str, Any] = {"version": 2, "ethernets": ethernets}
    if bonds:
        network["bonds"] = bonds
    return {"network": network}


def networkd_data_unit(interface: dict[str, Any]) -> str:
    """Debian 12: a systemd-networkd .network file for one data interface (the management
    interface stays with ifupdown): address and MTU, no gateway, no link-local or RA, not
    required for network-online, no LLDP; a NIC sharing its network's prefix with others its
    own table and rule (:func:`source_tables`). roles/common/templates/networkd-data.network.j2
    renders the same (tests compare them)."""
    lines = [
        "[Match]", f"Name={interface['interface']}", "",
        "[Link]", f"MTUBytes={interface['mtu']}", "RequiredForOnline=no", "",
        "[Network]", f"Address={interface['address']}", "LinkLocalAddressing=no", "IPv6AcceptRA=no",
        "ConfigureWithoutCarrier=yes", "LLDP=no", "EmitLLDP=no", "",
    ]
    route = source_route(interface)
    if route is not None:  # a NIC sharing its network's prefix: its own table, by source address
        prefix, address, table = route
        lines += ["[Route]", f"Destination={prefix}", "Scope=link", f"PreferredSource={address}", f"Table={table}", "",
                  "[RoutingPolicyRule]", f"From={address}/32", f"Table={table}", ""]
    return "\n".join(lines)


def networkd_bond_netdev(interface: dict[str, Any]) -> str:
    """Debian 12: the bond's .netdev (mode, MII monitoring, LACP rate and hash policy, MTU).
    roles/common/templates/networkd-bond.netdev.j2 renders the same."""
    bond = interface["bond"]
    lines = ["[NetDev]", f"Name={interface['interface']}", "Kind=bond", f"MTUBytes={interface['mtu']}", "",
             "[Bond]", f"Mode={bond['mode']}", f"MIIMonitorSec={BOND_MII_MS}ms"]
    if bond["mode"] == "802.3ad":
        lines += ["LACPTransmitRate=fast", "TransmitHashPolicy=layer3+4"]
    return "\n".join([*lines, ""])


def networkd_bond_member_unit(interface: dict[str, Any], member: dict[str, str]) -> str:
    """Debian 12: a member's .network: enslaved to the bond, matched by name or by its
    permanent MAC (the bond takes a member's MAC, so a plain MACAddress= match would catch
    the bond too). roles/common/templates/networkd-bond-member.network.j2 renders the same."""
    match = f"PermanentMACAddress={member['mac']}" if "mac" in member else f"Name={member['name']}"
    return "\n".join([
        "[Match]", match, "Type=ether", "",
        "[Link]", f"MTUBytes={interface['mtu']}", "RequiredForOnline=no", "",
        "[Network]", f"Bond={interface['interface']}", "LinkLocalAddressing=no", "IPv6AcceptRA=no",
        "LLDP=no", "EmitLLDP=no", "",
    ])


def networkd_data_files(interfaces: list[dict[str, Any]]) -> dict[str, str]:
    """Every file the role writes under /etc/systemd/network for the data network, by name
    (the role removes other 90-provision-data-* files)."""
    files: dict[str, str] = {}
    for i in interfaces:
        name = i["interface"]
        files[f"90-provision-data-{name}.network"] = networkd_data_unit(i)
        if "bond" in i:
            files[f"90-provision-data-{name}.netdev"] = networkd_bond_netdev(i)
            for n, member in enumerate(i["bond"]["members"]):
                files[f"90-provision-data-{name}-m{n}.network"] = networkd_bond_member_unit(i, member)
    return files
