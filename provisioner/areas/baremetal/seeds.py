"""Per-node OS installer configuration, rendered purely from the manifest.

* Ubuntu 22.04/24.04: autoinstall ``user-data``/``meta-data``/``vendor-data`` for a NoCloud
  seed at ``http://<head>/nodes/<node>/``.
* Debian 12: a preseed file plus ``late.sh`` (accounts, SSH keys, the install report),
  fetched by the installer's late_command.
* Both: ``install.ipxe``, the per-node iPXE script that boots the installer.

Media layout on the head node's web server (kept in sync with roles/pxe_server):
``/media/ubuntu-22.04/{vmlinuz,initrd,live-server.iso}``, ``/media/ubuntu-24.04/...`` and
``/media/debian-12/{linux,initrd.gz}``.
"""

from __future__ import annotations

import shlex
from typing import Any
from urllib.parse import urlsplit

from provisioner.areas.baremetal.decide import (
    DEFAULT_DEBIAN_MIRROR,
    ESP_SIZE,
    UBUNTU_ISO,
    InstallServer,
    boot_mode,
    disk_match,
    disk_path,
    logins,
    net_settings,
    netplan,
    require_installable,
    yaml_text,
)
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


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
