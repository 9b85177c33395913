"""Per-node OS installer configuration, rendered purely from the manifest.

* Ubuntu 22.04/24.04: autoinstall ``user-data``/``meta-data``/``vendor-data`` for a NoCloud
  seed at ``http://<head>/nodes/<node>/``.
* Debian 12: a preseed file plus ``late.sh`` (accounts, SSH keys, the install report),
  fetched by the installer's late_command.
* Both: ``install.ipxe``, the per-node iPXE script that boots the installer.

Every install ends with a report to the head node (``POST /api/installed/<node>`` carrying
the new system's SSH host public keys); on that report the PXE server switches the node
to booting from its local disk, so an install cannot loop. The installed system gets the
node's static management address, its hostname, the admin users with their SSH keys, an
SSH server, and an OS disk or a RAID1 mirror of its two ``install_disks``.

Media layout on the head node's web server (kept in sync with roles/pxe_server):
``/media/ubuntu-22.04/{vmlinuz,initrd,live-server.iso}``, ``/media/ubuntu-24.04/...`` and
``/media/debian-12/{linux,initrd.gz}``.
"""

from __future__ import annotations

import glob
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import yaml

from provisioner.areas.common.decide import privileged_keys
from provisioner.manifest.model import AdminUser, Manifest, Node

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
class NetSettings:
    """The node's management interface as the installed system configures it."""

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
    )


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


# --------------------------------------------------------------------------- ubuntu
def curtin_storage(node: Node) -> list[dict[str, Any]]:
    """curtin storage actions: one OS disk, or RAID1 over two; GPT; an ESP (UEFI) or a
    bios_grub partition (legacy) on every disk; ext4 on /. Each disk is found by its serial
    (:func:`disk_match`), the way subiquity matches disks."""
    uefi = boot_mode(node) == "uefi"
    disks = node.install_disks
    config: list[dict[str, Any]] = []
    roots: list[str] = []
    for i, disk_id in enumerate(disks):
        disk = f"disk{i}"
        config.append({
            "type": "disk", "id": disk, "match": disk_match(disk_id, node.os), "ptable": "gpt",
            "wipe": "superblock-recursive", "preserve": False, "grub_device": not uefi, "name": "",
        })
        if uefi:
            config.append({
                "type": "partition", "id": f"{disk}-esp", "device": disk, "number": 1, "size": ESP_SIZE,
                "flag": "boot", "grub_device": True, "wipe": "superblock", "preserve": False,
            })
            config.append({"type": "format", "id": f"{disk}-esp-fs", "volume": f"{disk}-esp", "fstype": "fat32"})
        else:
            config.append({
                "type": "partition", "id": f"{disk}-biosgrub", "device": disk, "number": 1, "size": "1M",
                "flag": "bios_grub", "wipe": "superblock", "preserve": False,
            })
        root = f"{disk}-root"
        config.append({
            "type": "partition", "id": root, "device": disk, "number": 2, "size": -1,
            "flag": "raid" if len(disks) == 2 else "", "wipe": "superblock", "preserve": False,
        })
        roots.append(root)
    if len(disks) == 2:
        config.append({"type": "raid", "id": "md0", "name": "md0", "raidlevel": "raid1", "devices": roots,
                       "spare_devices": [], "preserve": False})
        root_volume = "md0"
    else:
        root_volume = roots[0]
    config.append({"type": "format", "id": "root-fs", "volume": root_volume, "fstype": "ext4"})
    config.append({"type": "mount", "id": "root-mount", "device": "root-fs", "path": "/"})
    if uefi:
        config.append({"type": "mount", "id": "esp-mount", "device": "disk0-esp-fs", "path": "/boot/efi"})
    return config


def netplan(net: NetSettings) -> dict[str, Any]:
    eth: dict[str, Any] = {"match": {"macaddress": net.mac}}
    if net.interface:
        eth["set-name"] = net.interface
    eth["addresses"] = [net.cidr]
    if net.gateway:
        eth["routes"] = [{"to": "default", "via": net.gateway}]
    nameservers: dict[str, Any] = {"search": [net.domain]}
    if net.dns:
        nameservers["addresses"] = list(net.dns)
    eth["nameservers"] = nameservers
    eth["mtu"] = net.mtu
    return {"version": 2, "ethernets": {net.interface or "mgmt0": eth}}


def cloud_users(m: Manifest) -> list[dict[str, Any]]:
    users: list[dict[str, Any]] = []
    for login in logins(m):
        if login.name == "root":
            users.append({"name": "root", "ssh_authorized_keys": list(login.keys)})
            continue
        user: dict[str, Any] = {"name": login.name, "shell": login.shell, "lock_passwd": True,
                                "ssh_authorized_keys": list(login.keys)}
        if login.sudo:
            user["groups"] = ["sudo"]
            user["sudo"] = "ALL=(ALL) NOPASSWD:ALL"
        if login.uid is not None:
            user["uid"] = login.uid
        users.append(user)
    return users


def report_command(server: InstallServer, node: str, keys_glob: str) -> str:
    """POST the new system's SSH host public keys to the head node; retries, and fails
    (stopping the installer before its reboot) if the head never answers."""
    return (f"cat {keys_glob} | curl -fsS --retry 10 --retry-delay 6 --retry-connrefused "
            f"-X POST --data-binary @- {server.report_url(node)}")


def ubuntu_user_data(m: Manifest, node: Node, server: InstallServer) -> str:
    require_installable(m, node)
    net = net_settings(m, node)
    mirrors = m.cluster.mirrors
    autoinstall: dict[str, Any] = {
        "version": 1,
        "interactive-sections": [],
        "locale": "en_US.UTF-8",
        "keyboard": {"layout": "us"},
        "timezone": m.cluster.timezone,
        "refresh-installer": {"update": False},
        "network": netplan(net),
    }
    if mirrors.apt or mirrors.apt_proxy:
        apt: dict[str, Any] = {}
        if mirrors.apt:
            # subiquity fills in security.ubuntu.com for a missing security section, which an
            # air-gapped site cannot reach: the -security pocket comes from the mirror too
            apt["primary"] = [{"arches": ["default"], "uri": mirrors.apt}]
            apt["security"] = [{"arches": ["default"], "uri": mirrors.apt}]
            apt["geoip"] = False
        if mirrors.apt_proxy:
            apt["proxy"] = mirrors.apt_proxy
        autoinstall["apt"] = apt
    autoinstall["storage"] = {"swap": {"size": 0}, "config": curtin_storage(node)}
    autoinstall["ssh"] = {"install-server": True, "allow-pw": False}
    autoinstall["packages"] = ["openssh-server", "python3", "curl"] + (
        ["mdadm"] if len(node.install_disks) == 2 else [])
    autoinstall["user-data"] = {
        "hostname": net.hostname,
        "fqdn": net.fqdn,
        "prefer_fqdn_over_hostname": False,
        "timezone": m.cluster.timezone,
        "disable_root": m.cluster.ssh.user != "root",
        "ssh_pwauth": False,
        "ssh_deletekeys": False,  # keep the host keys the install report carried
        "users": cloud_users(m),
    }
    autoinstall["late-commands"] = [
        "curtin in-target --target=/target -- ssh-keygen -A",
        report_command(server, node.name, "/target/etc/ssh/ssh_host_*_key.pub"),
    ]
    autoinstall["shutdown"] = "reboot"
    header = (f"#cloud-config\n# {node.name}: Ubuntu {node.os.split('-', 1)[1]} autoinstall, rendered by "
              "provisioner from the cluster manifest. Do not edit.\n")
    body = yaml_text({"autoinstall": autoinstall}, width=1000)
    return header + body


def ubuntu_meta_data(m: Manifest, node: Node) -> str:
    return yaml_text({"instance-id": f"provision-{m.cluster.name}-{node.name}", "local-hostname": node.name})


# --------------------------------------------------------------------------- debian
def _mirror_parts(url: str | None) -> tuple[str, str, str]:
    parts = urlsplit(url or DEFAULT_DEBIAN_MIRROR)
    return parts.scheme or "http", parts.netloc, parts.path or "/"


def partman_early_command(node: Node) -> str:
    """Resolve /dev/disk/by-id names to kernel devices inside the installer and set the
    partman / RAID / grub answers from them (partman wants kernel names)."""
    ids = node.install_disks
    lines = ["set -e"]
    devs: list[str] = []
    for i, disk_id in enumerate(ids, start=1):
        path = shlex.quote(disk_path(disk_id))
        lines.append(f"d{i}=$(readlink -f {path})")
        lines.append(f'[ -b "$d{i}" ] || {{ echo "provision: install disk {disk_id} not found" >&2; exit 1; }}')
        devs.append(f"$d{i}")
    lines.append(f'debconf-set partman-auto/disk "{" ".join(devs)}"')
    lines.append(f'debconf-set grub-installer/bootdev "{" ".join(devs)}"')
    if len(ids) == 2:
        lines.append('part() { case "$1" in *[0-9]) echo "${1}p$2" ;; *) echo "$1$2" ;; esac; }')
        lines.append('debconf-set partman-auto-raid/recipe "1 2 0 ext4 / $(part $d1 2)#$(part $d2 2) ."')
    return "; \\\n  ".join(lines)


def debian_preseed(m: Manifest, node: Node, server: InstallServer) -> str:
    require_installable(m, node)
    net = net_settings(m, node)
    uefi = boot_mode(node) == "uefi"
    raid = len(node.install_disks) == 2
    scheme, host, directory = _mirror_parts(m.cluster.mirrors.apt)
    lines = [
        f"# {node.name}: Debian 12 preseed, rendered by provisioner from the cluster manifest. Do not edit.",
        "d-i debian-installer/locale string en_US.UTF-8",
        "d-i keyboard-configuration/xkb-keymap select us",
        "# network: the management interface, static (also on the kernel command line)",
        "d-i netcfg/choose_interface select auto",
        "d-i netcfg/disable_autoconfig boolean true",
        f"d-i netcfg/get_ipaddress string {net.address}",
        f"d-i netcfg/get_netmask string {net.netmask}",
    ]
    if net.gateway:
        lines.append(f"d-i netcfg/get_gateway string {net.gateway}")
    else:
        lines += ["d-i netcfg/get_gateway string", "d-i netcfg/no_default_route boolean true"]
    lines += [
        f"d-i netcfg/get_nameservers string {' '.join(net.dns)}".rstrip(),  # debconf keeps a trailing blank
        "d-i netcfg/confirm_static boolean true",
        f"d-i netcfg/get_hostname string {net.hostname}",
        f"d-i netcfg/get_domain string {net.domain}",
        f"d-i netcfg/hostname string {net.hostname}",
        "d-i hw-detect/load_firmware boolean true",
        "# mirror",
        "d-i mirror/country string manual",
        f"d-i mirror/protocol string {scheme}",
        f"d-i mirror/{scheme}/hostname string {host}",
        f"d-i mirror/{scheme}/directory string {directory}",
        f"d-i mirror/{scheme}/proxy string {m.cluster.mirrors.apt_proxy or ''}".rstrip(),
        "d-i apt-setup/non-free-firmware boolean true",
        "d-i apt-setup/services-select multiselect security, updates",
        "# accounts: root and the admin users log in with SSH keys only (late.sh)",
        "d-i passwd/root-login boolean true",
        "d-i passwd/root-password-crypted password !",
        "d-i passwd/make-user boolean false",
        "# clock",
        "d-i clock-setup/utc boolean true",
        f"d-i time/zone string {m.cluster.timezone}",
        "d-i clock-setup/ntp boolean true",
        "# disks: " + (f"RAID1 over {node.install_disks[0]} and {node.install_disks[1]}" if raid
                       else f"the whole of {node.install_disks[0]}")
        + (", UEFI" if uefi else ", legacy BIOS"),
        "d-i partman/early_command string \\\n  " + partman_early_command(node),
        "d-i partman-partitioning/choose_label select gpt",
        "d-i partman-partitioning/default_label string gpt",
        "d-i partman-partitioning/confirm_write_new_label boolean true",
        "d-i partman-lvm/device_remove_lvm boolean true",
        "d-i partman-md/device_remove_md boolean true",
        "d-i partman-lvm/confirm boolean true",
        "d-i partman-lvm/confirm_nooverwrite boolean true",
        "d-i partman-efi/non_efi_system boolean true",
    ]
    boot_part = ("538 538 1075 free $iflabel{ gpt } $reusemethod{ } method{ efi } format{ } ." if uefi
                 else "1 1 1 free $iflabel{ gpt } $reusemethod{ } method{ biosgrub } .")
    if raid:
        lines += [
            "d-i partman-auto/method string raid",
            "d-i partman-auto/expert_recipe string \\\n  provision-raid1 :: \\\n    "
            + boot_part + " \\\n    10000 10000 -1 raid $primary{ } method{ raid } .",
            "# partman-auto-raid/recipe is set by the early command (kernel device names)",
            "d-i partman-md/confirm boolean true",
            "d-i partman-md/confirm_nooverwrite boolean true",
            "d-i mdadm/boot_degraded boolean true",
        ]
    else:
        lines += [
            "d-i partman-auto/method string regular",
            "d-i partman-auto/expert_recipe string \\\n  provision-single :: \\\n    "
            + boot_part + " \\\n    10000 10000 -1 ext4 $primary{ } $bootable{ } method{ format } "
            "format{ } use_filesystem{ } filesystem{ ext4 } mountpoint{ / } .",
        ]
    lines += [
        "d-i partman-auto/choose_recipe select " + ("provision-raid1" if raid else "provision-single"),
        "d-i partman/choose_partition select finish",
        "d-i partman/confirm boolean true",
        "d-i partman/confirm_nooverwrite boolean true",
        "d-i partman-basicfilesystems/no_swap boolean false",
        "# packages: an SSH server, Python for Ansible, curl for the install report",
        "d-i base-installer/kernel/image string linux-image-amd64",
        "tasksel tasksel/first multiselect standard, ssh-server",
        "d-i pkgsel/include string openssh-server python3 sudo curl" + (" mdadm" if raid else ""),
        "d-i pkgsel/upgrade select none",
        "popularity-contest popularity-contest/participate boolean false",
        "d-i grub-installer/only_debian boolean true",
        "d-i grub-installer/with_other_os boolean false",
        "# grub-installer/bootdev is set by the early command",
        "# after the install: accounts and the install report (late.sh; a failure stops the",
        "# installer before its reboot, so a node without a report cannot reinstall in a loop)",
        "d-i preseed/late_command string \\\n  "
        f"wget -q -O /target/root/provision-late.sh {server.node_url(node.name, 'late.sh')} && \\\n  "
        "in-target sh /root/provision-late.sh",
        "d-i finish-install/reboot_in_progress note",
        "",
    ]
    return "\n".join(lines)


def debian_late_script(m: Manifest, node: Node, server: InstallServer) -> str:
    """Runs inside /target at the end of a Debian install: accounts with SSH keys, then
    the install report carrying the host keys."""
    require_installable(m, node)
    out = [
        "#!/bin/sh",
        f"# {node.name}: end of the Debian install (run in /target by the preseed late_command).",
        "# Rendered by provisioner from the cluster manifest. Do not edit.",
        "set -eu",
        "ssh-keygen -A",
        "passwd -l root",
    ]
    for login in logins(m):
        keys = "\n".join(login.keys)
        if login.name == "root":
            home = "/root"
            out += ["install -d -m 0700 /root/.ssh"]
        else:
            name = shlex.quote(login.name)
            uid = f" --uid {login.uid}" if login.uid is not None else ""
            out += [
                f"id -u {name} >/dev/null 2>&1 || useradd --create-home --shell {shlex.quote(login.shell)}{uid} {name}",
                f"passwd -l {name} >/dev/null",
            ]
            if login.sudo:
                out += [
                    f"usermod -aG sudo {name}",
                    f"echo '{login.name} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-provision-{login.name}",
                    f"chmod 0440 /etc/sudoers.d/90-provision-{login.name}",
                ]
            home = f"$(getent passwd {name} | cut -d: -f6)"
            out += [f'home="{home}"', f'install -d -m 0700 -o {name} -g "$(id -gn {name})" "$home/.ssh"']
            home = "$home"
        out += [
            f'cat > "{home}/.ssh/authorized_keys" <<\'PROVISION_KEYS\'',
            keys,
            "PROVISION_KEYS",
            f'chmod 0600 "{home}/.ssh/authorized_keys"',
        ]
        if login.name != "root":
            name = shlex.quote(login.name)
            out.append(f'chown {name}:"$(id -gn {name})" "$home/.ssh/authorized_keys"')
    out += [
        "# report: the PXE server now boots this node from its disk",
        report_command(server, node.name, "/etc/ssh/ssh_host_*_key.pub"),
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- ipxe
def ipxe_install_script(m: Manifest, node: Node, server: InstallServer) -> str:
    require_installable(m, node)
    net = net_settings(m, node)
    bootif = "01-" + net.mac.replace(":", "-")
    head = [
        "#!ipxe",
        f"# {node.name}: {node.os} installation, rendered by provisioner from the cluster manifest.",
        "# Served only while the node is armed; after its install report the PXE server",
        "# answers with a boot-from-disk script instead.",
        f"echo provision: installing {node.os} on {node.name}",
    ]
    if node.os.startswith("ubuntu-"):
        media = node.os
        args = [
            "initrd=initrd", "ip=dhcp", f"BOOTIF={bootif}",
            f"url={server.media_url(media, UBUNTU_ISO)}",
            "autoinstall", f"ds=nocloud-net;s={server.node_url(node.name)}", "cloud-config-url=/dev/null",
            "---",
        ]
        body = [
            f"kernel {server.media_url(media, 'vmlinuz')} {' '.join(args)}",
            f"initrd {server.media_url(media, 'initrd')}",
            "boot",
        ]
    else:
        media = "debian-12"
        args = [
            "initrd=initrd.gz", "auto=true", "priority=critical", f"url={server.node_url(node.name, 'preseed.cfg')}",
            f"BOOTIF={bootif}", "netcfg/disable_autoconfig=true", f"netcfg/get_ipaddress={net.address}",
            f"netcfg/get_netmask={net.netmask}",
        ]
        if net.gateway:
            args.append(f"netcfg/get_gateway={net.gateway}")
        else:
            args += ["netcfg/get_gateway=", "netcfg/no_default_route=true"]
        # one server: no spaces on a kernel command line; none: an empty answer, else netcfg
        # stops at its name server question (seen in the VM lab)
        args.append(f"netcfg/get_nameservers={net.dns[0] if net.dns else ''}")
        args += ["netcfg/confirm_static=true", f"hostname={net.hostname}", f"domain={net.domain}",
                 "locale=en_US.UTF-8", "keymap=us", "---"]
        body = [
            f"kernel {server.media_url(media, 'linux')} {' '.join(args)}",
            f"initrd {server.media_url(media, 'initrd.gz')}",
            "boot",
        ]
    return "\n".join(head + body) + "\n"


def install_files(m: Manifest, node: Node, server: InstallServer) -> dict[str, str]:
    """Every file the PXE server publishes under ``/nodes/<node>/`` for this node."""
    require_installable(m, node)
    files = {"install.ipxe": ipxe_install_script(m, node, server)}
    if node.os.startswith("ubuntu-"):
        files["user-data"] = ubuntu_user_data(m, node, server)
        files["meta-data"] = ubuntu_meta_data(m, node)
        files["vendor-data"] = "#cloud-config\n{}\n"
    else:
        files["preseed.cfg"] = debian_preseed(m, node, server)
        files["late.sh"] = debian_late_script(m, node, server)
    return files


# --------------------------------------------------------------------------- installer media
MEDIA_FILE = "media.yaml"
UBUNTU_RELEASES: tuple[str, ...] = ("ubuntu-22.04", "ubuntu-24.04")


@dataclass(frozen=True)
class UbuntuMediaSource:
    """Where a release's live-server ISO comes from by default: a directory that always holds
    the current point release, its checksum file, and the newest ISO name known here."""

    directory: str
    sha256sums: str
    iso: str


def load_media(text: str | None = None) -> tuple[dict[str, UbuntuMediaSource], tuple[str, str]]:
    """(release -> default source, (source, last checked)) from media.yaml (or ``text``)."""
    if text is None:
        text = resources.files(__package__ or "provisioner.areas.baremetal").joinpath(MEDIA_FILE).read_text("utf-8")
    data = yaml.safe_load(text)
    table = data.get("ubuntu_live_server") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not isinstance(table.get("releases"), dict):
        raise RuntimeError(f"{MEDIA_FILE}: ubuntu_live_server.releases is missing")
    out: dict[str, UbuntuMediaSource] = {}
    for release in UBUNTU_RELEASES:
        entry = table["releases"].get(release)
        if not isinstance(entry, dict) or not str(entry.get("directory", "")).endswith("/"):
            raise RuntimeError(f"{MEDIA_FILE}: {release} needs a directory ending in /")
        out[release] = UbuntuMediaSource(str(entry["directory"]), str(table["sha256sums"]), str(entry["iso"]))
    return out, (str(table["source"]), str(table["checked"]))


UBUNTU_MEDIA, UBUNTU_MEDIA_SOURCE = load_media()


def live_server_iso(sha256sums: str, release: str) -> tuple[str, str]:
    """(ISO name, SHA-256) of the newest live-server ISO of ``release`` (ubuntu-24.04) listed
    in a SHA256SUMS file (``<hex> *<name>`` lines). For the pxe_server role, which resolves
    the current point release from the stable directory instead of a name that moves away."""
    version = release.removeprefix("ubuntu-")
    pattern = re.compile(rf"^([0-9a-f]{{64}}) [ *]?(ubuntu-{re.escape(version)}(?:\.(\d+))?-live-server-amd64\.iso)$")
    found: list[tuple[int, str, str]] = []
    for line in sha256sums.splitlines():
        match = pattern.match(line.strip())
        if match:
            found.append((int(match.group(3) or 0), match.group(2), match.group(1)))
    if not found:
        raise InstallConfigError(f"the checksum list names no {release} live-server ISO for amd64")
    _point, name, digest = max(found)
    return name, digest


def ubuntu_media(m: Manifest) -> dict[str, dict[str, str]]:
    """The pxe_server role's ``pxe_server_ubuntu_media``: per Ubuntu release ``url``, ``path``
    and ``checksum``, from the manifest's pinned ``cluster.install_media`` or else the release's
    stable directory (the newest ISO name known here, verified against the directory's
    SHA256SUMS, so a superseded name fails at once naming the checksum list), plus
    ``directory`` and ``sha256sums`` for resolving the current point release
    (:func:`live_server_iso`)."""
    out: dict[str, dict[str, str]] = {}
    for release in UBUNTU_RELEASES:
        default = UBUNTU_MEDIA[release]
        sums = default.directory + default.sha256sums
        entry = {"directory": default.directory, "sha256sums": sums}
        pinned = next((media for name, media in m.cluster.install_media.items() if name == release), None)
        if pinned is None:
            entry |= {"url": default.directory + default.iso, "path": "", "checksum": f"sha256:{sums}"}
        else:
            entry |= {"url": pinned.url or "", "path": pinned.path or "",
                      "checksum": f"sha256:{pinned.sha256}" if pinned.sha256 else ""}
        out[release] = entry
    return out


def media_for(nodes: list[Node]) -> list[str]:
    """The installer media (OS names) the PXE server needs for ``nodes``."""
    return sorted({n.os for n in nodes})
