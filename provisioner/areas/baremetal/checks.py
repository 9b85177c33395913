"""Whole-manifest checks of the bare-metal area: a node marked ``install: pxe`` must be one
the PXE server can install, and what the OS installers cannot do with a node's settings
(e.g. an install disk the Ubuntu installer cannot find). Run by ``provisioner.validate`` on a
structurally clean manifest."""

from __future__ import annotations

import re

from provisioner.areas.baremetal.decide import (
    NVME_NSID_SERIAL_OS,
    InstallConfigError,
    boot_mode,
    installer_disk_serial,
    not_installable,
)
from provisioner.areas.baremetal.deploy import deployed_from_image, guarded_disk, needs_ramdisk
from provisioner.areas.common.decide import ansible_account_problem
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check, node_path
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_pxe_installs(m: Manifest, src: Source) -> list[Diagnostic]:
    """``install: pxe`` needs a BMC, a management MAC and install disks, and not the head
    node (it serves PXE); reported once per manifest entry (a range is one entry)."""
    out: list[Diagnostic] = []
    seen: set[int] = set()
    for node in m.nodes:
        if node.install != "pxe" or node.source_index in seen:
            continue
        problem = not_installable(m, node)
        if problem is None and node.bmc is None:
            problem = f"{node.name} has no bmc section: apply powers a node on for its install through its BMC"
        if problem is not None:
            seen.add(node.source_index)
            out.append(src.diag(node_path(node, "install"), f"install: pxe: {problem}"))
    return out


def check_install_disks(m: Manifest, src: Source) -> list[Diagnostic]:
    """Install disks of PXE-installed Ubuntu nodes must be names the installer can match
    by serial; an NVMe name with a namespace suffix does not exist before systemd 254."""
    out: list[Diagnostic] = []
    seen: set[tuple[int, int]] = set()
    for node in m.nodes:
        if not_installable(m, node) is not None:
            continue
        for i, disk in enumerate(node.install_disks):
            where = node_path(node, "install_disks", i)
            key = (node.source_index, i)  # a ranged entry is reported once
            if node.os.startswith("ubuntu-"):
                try:
                    installer_disk_serial(disk, node.os)
                except InstallConfigError as exc:
                    if key not in seen:
                        out.append(src.diag(where, f"{node.name}: {exc}"))
                    seen.add(key)
                    continue
            if (disk.startswith("nvme-") and node.os not in NVME_NSID_SERIAL_OS
                    and re.search(r"_\d+$", disk) and key not in seen):
                seen.add(key)
                out.append(src.diag(where, (
                    f"{node.name}: install disk {disk!r} ends like a namespace-suffixed NVMe link "
                    f"(_<namespace id>), which udev on {node.os} (systemd before 254) does not create; "
                    "give the name without it (nvme-<model>_<serial>)"), "warning"))
    return out


def check_deploy_disks(m: Manifest, src: Source) -> list[Diagnostic]:
    """An image deploy never takes a disk the manifest's hardware list gives to ZFS or
    scratch as its install disk (it would erase it)."""
    out: list[Diagnostic] = []
    seen: set[tuple[int, int]] = set()
    for node in m.nodes:
        if not deployed_from_image(m, node):
            continue
        for i, disk in enumerate(node.install_disks):
            problem = guarded_disk(node, disk)
            if problem and (node.source_index, i) not in seen:
                seen.add((node.source_index, i))
                out.append(src.diag(node_path(node, "install_disks", i), problem))
    return out


def check_ansible_account(m: Manifest, src: Source) -> list[Diagnostic]:
    """On nodes the installers set up, the account Ansible connects as must get a key it can
    log in with and root through sudo."""
    if not any(not_installable(m, node) is None for node in m.nodes):
        return []
    problem = ansible_account_problem(m)
    return [src.diag(("cluster", "ssh"), problem)] if problem else []


def check_secure_boot(m: Manifest, src: Source) -> list[Diagnostic]:
    """UEFI nodes installed over PXE boot the head's iPXE, which is not signed for Secure Boot
    (issue 19 item 12): ``bmc.secure_boot: true`` is refused, unset is a warning that it must
    be off (once per manifest entry), ``false`` is the operator saying it is."""
    out: list[Diagnostic] = []
    seen: set[int] = set()
    for node in m.nodes:
        if (node.source_index in seen or node.install != "pxe" or node.bmc is None or boot_mode(node) != "uefi"
                or node.bmc.secure_boot is False):
            continue
        seen.add(node.source_index)
        why = ("the PXE chain's iPXE (snponly.efi/ipxe.efi) is not signed, so a Secure Boot firmware refuses to "
               "run it (docs/baremetal.md, Secure Boot)")
        if node.bmc.secure_boot:
            out.append(src.diag(node_path(node, "bmc", "secure_boot"), (
                f"{node.name} installs over PXE in UEFI mode with Secure Boot on: {why}; turn Secure Boot off "
                "in its firmware and set secure_boot: false")))
        else:
            out.append(src.diag(node_path(node, "install"), (
                f"{node.name} installs over PXE in UEFI mode: its firmware must have Secure Boot off, since {why}; "
                "set bmc.secure_boot: false once it is"), "warning"))
    return out


def check_ramdisk_source(m: Manifest, src: Source) -> list[Diagnostic]:
    """The deploy ramdisk is always a Debian 12 system: from ``cluster.mirrors.apt`` when a
    node runs Debian 12 (the mirror serves Debian then), else from Debian's own archive. A site
    with an apt mirror and image deploys but no Debian node (an air-gapped Ubuntu site) needs
    Debian's archive or a Debian mirror as well: a warning says so once."""
    if not needs_ramdisk(m) or m.cluster.mirrors.apt is None or any(n.os == "debian-12" for n in m.nodes):
        return []
    return [src.diag(("cluster", "mirrors", "apt"), (
        "image deploys boot a deploy ramdisk built from Debian 12, and no node here runs Debian, so "
        "`provision image build` fetches it from Debian's own archive (deb.debian.org"
        f"{', through ' + m.cluster.mirrors.apt_proxy if m.cluster.mirrors.apt_proxy else ''}), not from "
        f"{m.cluster.mirrors.apt}: an air-gapped site needs that archive or a Debian 12 mirror reachable "
        "(docs/baremetal.md, the deploy ramdisk)"), "warning")]


CHECKS: tuple[Check, ...] = (check_pxe_installs, check_install_disks, check_deploy_disks, check_ansible_account,
                             check_secure_boot, check_ramdisk_source)
