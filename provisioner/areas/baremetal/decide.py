"""Bare-metal installs, pure: which nodes an apply installs and how (installer or image),
the install server on the head node, each node's network settings and logins, and its install
disks as the installers name them. What the installers read is rendered in ``seeds``
(autoinstall, preseed, iPXE), where their media come from in ``media``.

Every install ends with a report to the head node (``POST /api/installed/<node>`` carrying
the new system's SSH host public keys); on that report the PXE server switches the node
to booting from its local disk, so an install cannot loop. The installed system gets the
node's static management address, its hostname, the admin users with their SSH keys, an
SSH server, and an OS disk or a RAID1 mirror of its two ``install_disks``.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from provisioner.areas.common.decide import (
    bond_member,
    netplan_bond_parameters,
    netplan_member_id,
    privileged_keys,
)
from provisioner.manifest.cluster import AdminUser
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

# libyaml's emitter where PyYAML has it: for 2,003 nodes, the seeds of every node took 0.5 s
# (image deploys) and 1.1 s (installer) through it, against 1.9 s and 6.2 s through PyYAML's
# own emitter (and 0.7 s and 0.8 s through a hand-built event stream, removed as not worth
# its code; 2026-11-27, AMD EPYC).
_YAML_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(data: Mapping[str, Any], *, width: int | None = None) -> str:
    """``data`` (plain data) as block-style YAML text, keys in their given order."""
    return yaml.dump(data, Dumper=_YAML_DUMPER, sort_keys=False, default_flow_style=False, width=width)

# The pxe_server role's default web server port (roles/pxe_server/defaults/main.yml:
# pxe_server_http_port); rolevars pass the same value to the role.
PXE_HTTP_PORT = 80
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
ESP_SIZE = "512M"
UBUNTU_ISO = "live-server.iso"


class InstallConfigError(ValueError):
    """A node cannot be installed from this manifest (the message says why)."""


@dataclass(frozen=True)
class InstallServer:
    """Where installers find the head node's PXE web server."""

    address: str
    port: int = PXE_HTTP_PORT

    @property
    def base_url(self) -> str:
        return f"http://{self.address}" + ("" if self.port == 80 else f":{self.port}")

    def node_url(self, node: str, file: str = "") -> str:
        return f"{self.base_url}/nodes/{node}/{file}"

    def media_url(self, os_name: str, file: str) -> str:
        return f"{self.base_url}/media/{os_name}/{file}"

    def report_url(self, node: str) -> str:
        return f"{self.base_url}/api/installed/{node}"

    def status_url(self, node: str) -> str:
        return f"{self.base_url}/api/status/{node}"

    def boot_url(self, node: str) -> str:
        return f"{self.base_url}/boot/{node}.ipxe"


@dataclass(frozen=True)
class MgmtBond:
    """A bonded management link: its mode and members (``{"mac": ...}`` or ``{"name": ...}``).
    The installed system comes up bonded; the node installs over the member it PXE-boots from
    (the management ``mac``), so an LACP LAG needs its switch's LACP fallback (a port without
    LACPDUs forwards on its own) for the PXE boot and the installer."""

    name: str
    mode: str
    members: tuple[dict[str, str], ...]


@dataclass(frozen=True)
class NetSettings:
    """The node's management interface as the installed system configures it (``bond``: its
    management link is that bond, named ``interface``)."""

    hostname: str
    fqdn: str
    domain: str
    mac: str
    interface: str | None
    address: str
    prefix: int
    netmask: str
    gateway: str | None
    dns: tuple[str, ...]
    mtu: int
    bond: MgmtBond | None = None

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefix}"


@dataclass(frozen=True)
class Login:
    """An account the installer creates with SSH keys (root gets keys only)."""

    name: str
    keys: tuple[str, ...]
    sudo: bool
    shell: str
    uid: int | None


# --------------------------------------------------------------------------- selection
def install_server(m: Manifest, port: int = PXE_HTTP_PORT) -> InstallServer:
    return InstallServer(str(m.head.ip), port)


def not_installable(m: Manifest, node: Node) -> str | None:
    """Why ``node`` cannot be installed over PXE from this manifest, or None."""
    heads = m.with_role("head")
    if heads and heads[0].name == node.name:
        return f"{node.name} is the head node: it serves PXE, so it is installed by hand"
    if node.interfaces["management"].mac is None:
        return (f"{node.name} has no MAC address on its management interface: the PXE server "
                "cannot recognise it")
    if not node.install_disks:
        return f"{node.name} lists no install_disks: the installer would have to guess which disk to erase"
    return None


@dataclass(frozen=True)
class InstallResult:
    node: str
    ok: bool
    stage: str  # skipped, config, pxe, bmc, install, ssh, done
    reason: str
    host_keys: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0


def plan_installs(
    m: Manifest, states: Mapping[str, str], reinstall: Iterable[str] = ()
) -> tuple[list[str], list[InstallResult]]:
    """Split the manifest's nodes into those to install over PXE and those left alone.

    Installing wipes a node's install disks, so it takes explicit intent per node, never an
    inference: a node marked ``install: pxe`` whose recorded state (``states``; absent means
    ``new``) is ``new``, or a node named in ``reinstall``. Every other node is left alone
    with a ``skipped`` result saying why. A node named in ``reinstall`` that cannot be
    installed over PXE (the head node, no management MAC, no install disks, no BMC) is a
    failure (stage ``config``).
    """
    again = set(reinstall)
    unknown = again - set(m.node_names())
    if unknown:
        raise KeyError(f"--reinstall names unknown node(s): {', '.join(sorted(unknown))}")
    targets: list[str] = []
    left: list[InstallResult] = []
    for node in m.nodes:
        state = states.get(node.name, "new")
        if node.name in again:
            problem = not_installable(m, node) or (
                None if node.bmc is not None else f"{node.name} has no bmc section in the manifest")
            if problem is None:
                targets.append(node.name)
            else:
                left.append(InstallResult(node.name, False, "config", problem))
        elif node.install == "pxe" and state == "new":
            targets.append(node.name)  # validate made sure it can be installed
        elif node.install == "manual":
            left.append(InstallResult(node.name, True, "skipped",
                                      f"{node.name} is installed by hand (install: manual); apply configures it"))
        else:
            left.append(InstallResult(node.name, True, "skipped",
                                      f"{node.name} is {state}; name it with --reinstall to install it again"))
    return targets, left


def install_targets(m: Manifest, states: Mapping[str, str], reinstall: Iterable[str] = ()) -> list[str]:
    """The nodes to install over PXE (:func:`plan_installs`), for the plan."""
    return plan_installs(m, states, reinstall)[0]


def wiped_disks(node: Node) -> str:
    """What a PXE install of ``node`` erases, in words."""
    return ", ".join(node.install_disks) if node.install_disks else "its install disks"


def require_installable(m: Manifest, node: Node) -> None:
    reason = not_installable(m, node)
    if reason:
        raise InstallConfigError(reason)


def net_settings(m: Manifest, node: Node) -> NetSettings:
    net = m.networks.management
    iface = node.interfaces["management"]
    if iface.mac is None:
        raise InstallConfigError(f"{node.name} has no MAC address on its management interface")
    domain = m.cluster.domain
    return NetSettings(
        hostname=node.name,
        fqdn=f"{node.name}.{domain}",
        domain=domain,
        mac=iface.mac,
        interface=iface.interface,
        address=str(iface.ip),
        prefix=net.cidr.prefixlen,
        netmask=str(net.cidr.netmask),
        gateway=str(net.gateway) if net.gateway is not None else None,
        dns=tuple(str(d) for d in net.dns),
        mtu=net.mtu,
        bond=mgmt_bond(node),
    )


def mgmt_bond(node: Node) -> MgmtBond | None:
    """The bond the node's management interface names, if any."""
    name = node.interfaces["management"].interface
    bond = node.bonds.get(name or "")
    if name is None or bond is None:
        return None
    return MgmtBond(name, bond.mode, tuple(bond_member(x) for x in bond.members))


def install_only(m: Manifest, node: Node) -> str:
    """The plan's words for what only an install builds on ``node``, which an apply that does
    not install it leaves as it is: its management bond ("" without one). Apply runs over the
    live management link and never rebuilds it (docs/baremetal.md, "A bonded management
    link"); a node installed before its bond was added runs without it until reinstalled.
    No node names: the plan groups nodes by these words."""
    bond = mgmt_bond(node)
    if bond is None:
        return ""
    reinstall = "provision apply --reinstall NODE"
    if node.install == "manual":  # installed by hand; a reinstall only where one could install it
        installable = not_installable(m, node) is None and node.bmc is not None
        way = "bond it by hand as its install did" + (f", or {reinstall}" if installable else "")
    else:
        way = reinstall
    return (f"management bond {bond.name} ({bond.mode}): built only by an install, never by apply on "
            f"the live link; where the node runs without it (verify's bond:{bond.name} fails): {way}")


def logins(m: Manifest) -> list[Login]:
    """Accounts with SSH access after the install: every admin user with their own keys,
    plus the account Ansible connects as (``cluster.ssh.user``: root, or an account with
    password-less sudo) with only the keys allowed root (:func:`privileged_keys`: admins with
    sudo and ``cluster.ssh.public_key``), so an admin with ``sudo: false`` gets no root."""
    admins: list[AdminUser] = list(m.cluster.admin_users)
    out = [Login(u.name, tuple(u.ssh_keys), u.sudo, u.shell, u.uid) for u in admins]
    keys = tuple(privileged_keys(m))
    ssh_user = m.cluster.ssh.user
    if ssh_user == "root":
        out.insert(0, Login("root", keys, True, "/bin/bash", None))
    elif ssh_user not in {u.name for u in admins}:
        out.append(Login(ssh_user, keys, True, "/bin/bash", None))
    return out


def boot_mode(node: Node) -> str:
    return node.bmc.boot_mode if node.bmc is not None else "uefi"


def disk_path(disk_id: str) -> str:
    return f"/dev/disk/by-id/{disk_id}"


# --------------------------------------------------------------------------- install disks
# Subiquity (the Ubuntu installer) finds an autoinstall ``disk`` action's device by its
# ``serial`` (equal to the udev ID_SERIAL it probed), by ``path`` (equal to the kernel name it
# probed, /dev/nvme0n1: a /dev/disk/by-id link never matches) or by a ``match`` directive
# whose ``serial`` is a shell pattern over ID_SERIAL. We use ``match: {serial: <escaped>}``.
# The ID_SERIAL behind a /dev/disk/by-id name comes from udev's 60-persistent-storage.rules:
# ``<bus>-<ID_SERIAL>`` for ata/scsi/usb disks, ``virtio-<serial>``, and ``nvme-<model>_<serial>``
# for NVMe namespaces; from systemd 254 on (Ubuntu 24.04 ships 255, 22.04 ships 249) an NVMe
# namespace's ID_SERIAL ends in ``_<namespace id>`` and udev adds that link too.
NVME_NSID_SERIAL_OS = frozenset({"ubuntu-24.04"})
_SERIAL_PREFIXES = ("nvme-", "ata-", "scsi-", "virtio-", "usb-")
_NOT_SERIAL = (
    ("nvme-eui.", "an NVMe EUI-64/NGUID name (udev ID_WWN)"),
    ("nvme-nvme.", "an NVMe NGUID name (udev ID_WWN)"),
    ("wwn-", "a World Wide Name (udev ID_WWN)"),
    ("scsi-SATA_", "the SCSI compatibility name of an ATA disk"),
    ("scsi-0ATA_", "the SCSI compatibility name of an ATA disk"),
    ("scsi-1ATA_", "the SCSI compatibility name of an ATA disk"),
)


def installer_disk_serial(disk_id: str, os_name: str) -> str:
    """The udev ID_SERIAL of the disk that ``/dev/disk/by-id/<disk_id>`` names, as the
    installer of ``os_name`` sees it. Raises InstallConfigError for names that carry no
    serial (WWN, EUI, partitions, device-mapper)."""
    use = ("name it by the link that carries its serial: nvme-<model>_<serial>, ata-<model>_<serial>, "
           "scsi-<id>, virtio-<serial> (ls -l /dev/disk/by-id)")
    if re.search(r"-part\d+$", disk_id):
        raise InstallConfigError(f"install disk {disk_id!r} is a partition; give the whole disk")
    for prefix, what in _NOT_SERIAL:
        if disk_id.startswith(prefix):
            raise InstallConfigError(
                f"install disk {disk_id!r} is {what}; the Ubuntu installer finds disks by serial, so {use}")
    bus = next((p for p in _SERIAL_PREFIXES if disk_id.startswith(p)), None)
    if bus is None or len(disk_id) == len(bus):
        raise InstallConfigError(
            f"install disk {disk_id!r} carries no disk serial the Ubuntu installer can match; {use}")
    serial = disk_id[len(bus):]
    if bus == "nvme-" and os_name in NVME_NSID_SERIAL_OS and not re.search(r"_\d+$", serial):
        serial += "_1"  # the namespace id: 1 on a disk with one namespace
    return serial


def disk_match(disk_id: str, os_name: str) -> dict[str, str]:
    """The autoinstall ``match`` directive for one install disk: its ID_SERIAL, with the
    shell-pattern characters subiquity's fnmatch would interpret escaped."""
    return {"serial": glob.escape(installer_disk_serial(disk_id, os_name))}


def netplan(net: NetSettings) -> dict[str, Any]:
    """The management link in netplan: the NIC matched by its MAC (renamed when the manifest
    names it), or the bond over its members (by name, or matched by MAC) with the address,
    route and name servers on the bond."""
    if net.bond is not None:
        ethernets: dict[str, Any] = {}
        ids = []
        for n, member in enumerate(net.bond.members):
            ident = netplan_member_id(net.bond.name, n, member)
            ids.append(ident)
            ethernets[ident] = ({"match": {"macaddress": member["mac"]}} if "mac" in member else {}) | {
                "dhcp4": False, "dhcp6": False, "accept-ra": False, "link-local": [], "mtu": net.mtu}
        bond = {"interfaces": ids, **_mgmt_addressing(net), "parameters": netplan_bond_parameters(net.bond.mode)}
        return {"version": 2, "ethernets": ethernets, "bonds": {net.bond.name: bond}}
    eth: dict[str, Any] = {"match": {"macaddress": net.mac}}
    if net.interface:
        eth["set-name"] = net.interface
    return {"version": 2, "ethernets": {net.interface or "mgmt0": eth | _mgmt_addressing(net)}}


def _mgmt_addressing(net: NetSettings) -> dict[str, Any]:
    eth: dict[str, Any] = {"addresses": [net.cidr]}
    if net.gateway:
        eth["routes"] = [{"to": "default", "via": net.gateway}]
    nameservers: dict[str, Any] = {"search": [net.domain]}
    if net.dns:
        nameservers["addresses"] = list(net.dns)
    eth["nameservers"] = nameservers
    eth["mtu"] = net.mtu
    return eth
