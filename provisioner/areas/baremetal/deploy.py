"""Image deploy plans, rendered purely from the manifest.

A node installed with ``install_method: image`` (the default) boots the deploy ramdisk over
PXE; the ramdisk's agent fetches the node's plan (``/nodes/<node>/deploy.json``, the
:func:`deploy_plan` below as JSON) and does exactly what it says: which disks (by-id; two
make a RAID1), the boot mode, the image URL and its SHA-256, the node's identity (hostname,
network configuration for its OS, admin users and their keys) and where to report.

Refusals are decided twice: here, from the manifest (an install disk that the manifest's
hardware list gives to ZFS or scratch; a node with no image for its OS), so ``plan`` and
``validate`` show them; and on the node by the agent (a disk that is not present under its
by-id name, a disk that carries data while the plan does not allow erasing it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from provisioner.areas.baremetal.decide import (
    InstallServer,
    Login,
    NetSettings,
    boot_mode,
    disk_path,
    logins,
    net_settings,
    netplan,
    not_installable,
    wiped_disks,
    yaml_text,
)
from provisioner.areas.common.decide import networkd_bond_member_unit, networkd_bond_netdev
from provisioner.manifest.cluster import BUILT_IMAGE_EXT
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

# Partition layout every deploy writes on each install disk (GPT): a BIOS boot partition
# for GRUB's core image on legacy machines, an ESP, and the root (or its RAID1 member).
LAYOUT: tuple[tuple[int, str, str, str], ...] = (
    (1, "bios", "1MiB", "ef02"),
    (2, "esp", "512MiB", "ef00"),
    (3, "root", "rest", "8300"),
)
PLAN_FILE = "deploy.json"
RAMDISK_DIR = "images/deploy-ramdisk"  # under the PXE web server's root, like images/<os><ext>


class DeployRefused(ValueError):
    """The manifest does not allow an image deploy of this node (the message says why)."""


@dataclass(frozen=True)
class ImageRef:
    """A node OS image: a root file system tarball at ``url`` with its SHA-256."""

    url: str
    sha256: str


@dataclass(frozen=True)
class DeployFile:
    path: str
    mode: str
    content: str



@dataclass(frozen=True)
class DeployPlan:
    node: str
    os: str
    mac: str
    disks: tuple[str, ...]  # /dev/disk/by-id paths, in the manifest's order
    raid1: bool
    boot_mode: str  # uefi or legacy; the boot loader is installed for both either way
    image: ImageRef
    hostname: str
    fqdn: str
    files: tuple[DeployFile, ...]  # identity files written into the new root
    users: tuple[Login, ...]  # the installer configs' accounts: root only with keys allowed root
    report_url: str
    erase_allowed: bool  # may the agent wipe a disk that carries data (new or --reinstall)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def method(m: Manifest, node: Node) -> str:
    """``image`` or ``installer``: the node's own setting, else the cluster's."""
    return node.install_method or m.cluster.install_method


def guarded_disk(node: Node, disk_id: str) -> str | None:
    """Why ``disk_id`` must not be the node's install disk: the manifest's hardware list gives
    it (or the model it names) to ZFS or scratch. None when it may be."""
    for disk in node.hardware.disks:
        if disk.use in ("zfs", "scratch") and (disk_id == disk.id or disk_id.startswith(disk.id)):
            return (f"{node.name}: install disk {disk_id} is the manifest's {disk.use} disk {disk.id}: "
                    "a deploy would erase it")
    return None


def deploy_refusals(m: Manifest, node: Node, images: Mapping[str, ImageRef] | None) -> list[str]:
    """Everything that stops an image deploy of ``node``, in words (empty: it may go).
    ``images``: the images at hand per OS; None leaves their presence unchecked."""
    out: list[str] = []
    problem = not_installable(m, node)
    if problem:
        out.append(problem)
    out += [r for r in (guarded_disk(node, d) for d in node.install_disks) if r]
    if len(set(node.install_disks)) != len(node.install_disks):
        out.append(f"{node.name}: install_disks names the same disk twice; a RAID1 needs two disks")
    if images is not None and node.os not in images:
        out.append(f"{node.name}: no {node.os} image: run `provision image build MANIFEST --os {node.os}` "
                   f"or name one in cluster.images.{node.os}")
    return out


def networkd(net: NetSettings) -> list[DeployFile]:
    """systemd-networkd files (Debian) for the management interface: matched by MAC,
    renamed when the manifest names the interface (a bond: the bond, over its members),
    static address. A renamed interface is
    configured by its new name only: the initramfs already gave the NIC its predictable
    name and left its udev record behind, so networkd could bring it up under that name
    before udev renames it, and udev never renames an interface that is up."""
    files: list[DeployFile] = []
    match = ["[Match]", f"MACAddress={net.mac}"]
    if net.bond is not None:
        files += bond_networkd(net)
        match = ["[Match]", f"Name={net.bond.name}"]
    elif net.interface:
        files.append(DeployFile("/etc/systemd/network/10-provision-mgmt.link", "0644",
                                f"[Match]\nMACAddress={net.mac}\n\n[Link]\nName={net.interface}\n"))
        match.append(f"Name={net.interface}")
    lines = [*match, "", "[Link]", f"MTUBytes={net.mtu}", "", "[Network]", f"Address={net.cidr}"]
    if net.gateway:
        lines.append(f"Gateway={net.gateway}")
    lines += [f"DNS={d}" for d in net.dns]
    lines.append(f"Domains={net.domain}")
    files.append(DeployFile("/etc/systemd/network/10-provision-mgmt.network", "0644", "\n".join(lines) + "\n"))
    return files


def bond_networkd(net: NetSettings) -> list[DeployFile]:
    """A bonded management link on Debian: the bond's .netdev and one .network per member
    (matched by name or permanent MAC), the same units the common role writes for a data
    bond; the bond's own .network carries the address (:func:`networkd`)."""
    assert net.bond is not None
    bond = {"interface": net.bond.name, "mtu": net.mtu,
            "bond": {"mode": net.bond.mode, "members": list(net.bond.members)}}
    out = [DeployFile(f"/etc/systemd/network/10-provision-mgmt-{net.bond.name}.netdev", "0644",
                      networkd_bond_netdev(bond))]
    out += [DeployFile(f"/etc/systemd/network/10-provision-mgmt-m{n}.network", "0644",
                       networkd_bond_member_unit(bond, member))
            for n, member in enumerate(net.bond.members)]
    return out


def identity_files(m: Manifest, node: Node) -> list[DeployFile]:
    """Files that make the image this node: hostname, hosts entry, network configuration
    for its OS (netplan on Ubuntu, systemd-networkd on Debian)."""
    net = net_settings(m, node)
    files = [
        DeployFile("/etc/hostname", "0644", f"{net.hostname}\n"),
        DeployFile("/etc/hosts", "0644",
                   f"127.0.0.1\tlocalhost\n{net.address}\t{net.fqdn}\t{net.hostname}\n"
                   "::1\tlocalhost ip6-localhost ip6-loopback\n"),
    ]
    if node.os.startswith("ubuntu-"):
        text = yaml_text({"network": netplan(net)}, width=1000)
        files.append(DeployFile("/etc/netplan/50-provision.yaml", "0600",
                                f"# {node.name}: rendered by provisioner from the cluster manifest\n{text}"))
    else:
        files += networkd(net)
    return files


def deploy_plan(m: Manifest, node: Node, images: Mapping[str, ImageRef], server: InstallServer,
                *, erase_allowed: bool) -> DeployPlan:
    """The node's deploy plan; raises :class:`DeployRefused` with every refusal."""
    refusals = deploy_refusals(m, node, images)
    if refusals:
        raise DeployRefused("; ".join(refusals))
    net = net_settings(m, node)
    users = tuple(logins(m))
    return DeployPlan(
        node=node.name,
        os=node.os,
        mac=net.mac,
        disks=tuple(disk_path(d) for d in node.install_disks),
        raid1=len(node.install_disks) == 2,
        boot_mode=boot_mode(node),
        image=images[node.os],
        hostname=net.hostname,
        fqdn=net.fqdn,
        files=tuple(identity_files(m, node)),
        users=users,
        report_url=server.report_url(node.name),
        erase_allowed=erase_allowed,
    )


def destructive_summary(m: Manifest, node: Node, images: Mapping[str, ImageRef] | None = None) -> str:
    """What an image deploy of ``node`` erases and writes, in words (for ``plan``)."""
    disks = " + ".join(node.install_disks) if node.install_disks else "its install disks"
    layout = "RAID1 over " + disks if len(node.install_disks) == 2 else disks
    refusals = deploy_refusals(m, node, images)
    if refusals:
        return f"image deploy REFUSED: {'; '.join(refusals)}"
    return f"wipes {layout}, writes the {node.os} image (GPT: ESP + root)"


def install_summary(m: Manifest, node: Node, again: bool) -> str:
    """The plan's words for installing ``node`` (``again``: a ``--reinstall``)."""
    verb = "reinstall" if again else "install"
    if method(m, node) == "image":
        return f"PXE {verb}: {destructive_summary(m, node)}"
    return f"PXE {verb}: wipes {wiped_disks(node)} (the {node.os} installer)"


def deployed_from_image(m: Manifest, node: Node) -> bool:
    """Installed over PXE with the image method (whenever it is installed: new, or
    ``--reinstall``): the deploy ramdisk writes its OS's image onto it."""
    return node.install == "pxe" and method(m, node) == "image"


def needs_ramdisk(m: Manifest) -> bool:
    """Any node installed over PXE with the image method (the ramdisk deploys it)."""
    return any(deployed_from_image(m, n) for n in m.nodes)


def image_nodes(m: Manifest, os_name: str) -> tuple[str, ...]:
    """The nodes the ``os_name`` image is deployed onto."""
    return tuple(n.name for n in m.nodes if n.os == os_name and deployed_from_image(m, n))


def named_images(m: Manifest) -> dict[str, ImageRef]:
    """The images the manifest names (``cluster.images``), per OS."""
    return {os_name: ImageRef(img.url, img.sha256) for os_name, img in m.cluster.images.items()}


def image_file(m: Manifest, os_name: str) -> str:
    """The name the ``os_name`` image is published under, ``<os><ext>``: the compression of
    the image the manifest names (``.tar.xz`` for an Ubuntu cloud ``*-root.tar.xz``), else
    the built image's ``.tar.zst``. The deploy agent picks its tar flag from it."""
    named = next((img for name, img in m.cluster.images.items() if name == os_name), None)
    return f"{os_name}{named.ext if named is not None else BUILT_IMAGE_EXT}"


def image_url(server: InstallServer, file: str) -> str:
    """Where the PXE server publishes an image (``file``: :func:`image_file`)."""
    return f"{server.base_url}/images/{file}"


def ipxe_deploy_script(m: Manifest, node: Node, server: InstallServer) -> str:
    """The iPXE script of an armed image-deploy node: the deploy ramdisk with its plan's URL."""
    net = net_settings(m, node)
    bootif = "01-" + net.mac.replace(":", "-")
    ramdisk = f"{server.base_url}/{RAMDISK_DIR}"
    args = ["initrd=initrd.img", f"provision.plan={server.node_url(node.name, PLAN_FILE)}", f"BOOTIF={bootif}",
            "console=tty0", "console=ttyS0,115200n8"]
    return "\n".join([
        "#!ipxe",
        f"# {node.name}: {node.os} image deploy, rendered by provisioner from the cluster manifest.",
        "# Served only while the node is armed; after its report the PXE server boots it from disk.",
        f"echo provision: deploying the {node.os} image on {node.name}",
        f"kernel {ramdisk}/vmlinuz {' '.join(args)}",
        f"initrd {ramdisk}/initrd.img",
        "boot",
    ]) + "\n"


def deploy_files(m: Manifest, node: Node, server: InstallServer) -> dict[str, str]:
    """What the PXE server publishes under ``/nodes/<node>/`` for an image deploy: the iPXE
    script and the deploy plan. The plan's image checksum is left empty here: the built
    image's checksum is known only where it was built, so the pxe_server role fills it in
    (``pxe_server_image_sha256``), and the agent refuses a plan without one."""
    images: dict[str, ImageRef] = {node.os: ImageRef(image_url(server, image_file(m, node.os)), "")}
    plan = deploy_plan(m, node, images, server, erase_allowed=False)
    return {"install.ipxe": ipxe_deploy_script(m, node, server), PLAN_FILE: json.dumps(plan.to_json(), indent=2)}
