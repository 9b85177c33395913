"""Preflight of the PXE installs: what apply checks from the admin machine before it arms a
node and power cycles it (the step that wipes its disks). A failed check stops the whole
run before anything changes, naming the node and what failed. Pure decisions here; what
they are fed (the image cache, the proof, the ramdisk's file list, the BMC's answer) comes
from the edges (``provisioner.preflight``).

Per node to install:

* **image** (image deploys): the image of the node's OS is in the cache under the name the
  PXE server publishes, and its proof (``provision image build``) covers it: this image,
  the sources the node will use, every package the roles will install there;
* **deploy ramdisk** (image deploys): it is in the cache, and its kernel modules hold the
  drivers of the NIC families servers boot from (:data:`NIC_FAMILIES`): without its NIC's
  driver a node gets no DHCP in the ramdisk and cannot even report its failure;
* **install disk**: named as the deploy plan and the installers find it (``/dev/disk/by-id``
  names that carry the disk's serial), one per node, never the manifest's ZFS or scratch
  disk; where the BMC lists the system's drives (Redfish Storage), each install disk's name
  carries the serial of one of them. Without such a list (IPMI) the deploy agent is the one
  to refuse an absent disk, before it writes anything;
* **BMC**: it answers with the manifest's credentials (power state and boot override read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from provisioner.areas.baremetal.deploy import deploy_refusals, method
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

# The Ethernet drivers of the server NIC families a provisioning NIC comes from, by vendor:
# Intel 10/25/40/100G and 1G (ixgbe, i40e, ice, igb), NVIDIA/Mellanox ConnectX (mlx5_core),
# Broadcom NetXtreme-E and the 1G NetXtreme (bnxt_en, tg3). Module names as the kernel has them.
NIC_FAMILIES: dict[str, tuple[str, ...]] = {
    "Intel": ("ixgbe", "i40e", "ice", "igb"),
    "NVIDIA/Mellanox": ("mlx5_core",),
    "Broadcom": ("bnxt_en", "tg3"),
}
# by-id names that carry a disk's serial (what subiquity and the deploy agent find a disk by)
SERIAL_NAME = re.compile(r"^(nvme|ata|scsi|virtio|usb|mmc)-\S+$")
NOT_SERIAL = re.compile(r"^(wwn-|nvme-eui\.|nvme-nvme\.|scsi-SATA_|scsi-0ATA_)|-part\d+$")
MODULE = re.compile(r"(?:^|/)lib/modules/[^/]+/kernel/.*/([^/]+)\.ko(?:\.(?:xz|zst|gz))?$")


@dataclass(frozen=True)
class Check:
    node: str
    what: str  # image, deploy ramdisk, install disk, BMC
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.node}: {self.what}: {'ok' if self.ok else 'FAILED'}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def module_names(paths: Iterable[str]) -> set[str]:
    """Kernel module names (``ixgbe``) from the paths of a tree or an initramfs."""
    return {m[1].replace("-", "_") for p in paths if (m := MODULE.search(p))}


def missing_nic_drivers(modules: set[str]) -> list[str]:
    """The NIC drivers of :data:`NIC_FAMILIES` not among ``modules``, as ``Vendor module``."""
    return [f"{vendor} {mod}" for vendor, mods in NIC_FAMILIES.items() for mod in mods if mod not in modules]


def _norm(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


def disk_check(m: Manifest, node: Node, serials: tuple[str, ...] | None = None) -> Check:
    """``serials``: the drive serials the node's BMC lists (None: it lists none, as IPMI)."""
    disks = node.install_disks
    if not disks:
        return Check(node.name, "install disk", False, "no install_disks in the manifest")
    problems = [f"{d} does not name a disk by its serial under /dev/disk/by-id" for d in disks
                if not SERIAL_NAME.match(d) or NOT_SERIAL.search(d)]
    problems += [r.removeprefix(f"{node.name}: ") for r in deploy_refusals(m, node, None)]
    shared = sorted(o.name for o in m.nodes if o.name != node.name and set(o.install_disks) & set(disks))
    if shared:
        problems.append(f"{', '.join(disks)} is also the install disk of {', '.join(shared)}")
    if serials is not None:
        listed = ", ".join(serials) or "none"
        problems += [f"{d} carries none of the serials of the drives its BMC lists ({listed})" for d in disks
                     if not any(_norm(s) and _norm(s) in _norm(d) for s in serials)]
    if problems:
        return Check(node.name, "install disk", False, "; ".join(problems))
    layout = "RAID1 over " + " + ".join(disks) if len(disks) == 2 else disks[0]
    where = ("a drive its BMC lists" if serials is not None
             else "the agent refuses it if absent")
    return Check(node.name, "install disk", True, f"/dev/disk/by-id/{layout} ({where})")


def image_check(node: Node, file: str, digest: str | None, proof_problem: str | None) -> Check:
    """``digest``: the SHA-256 of the cache's ``file`` (None: not there); ``proof_problem``:
    why its proof does not cover it (None: it does)."""
    if digest is None:
        return Check(node.name, "image", False, f"no {file} in the image cache: run provision image build MANIFEST "
                                                f"--os {node.os}")
    if proof_problem is not None:
        return Check(node.name, "image", False, f"{file}: {proof_problem}")
    return Check(node.name, "image", True, f"{file} sha256 {digest[:12]}..., proven")


def ramdisk_check(node: Node, modules: set[str] | None) -> Check:
    """``modules``: the deploy ramdisk's kernel modules (None: no ramdisk in the cache)."""
    if modules is None:
        return Check(node.name, "deploy ramdisk", False, "no deploy ramdisk in the image cache: run provision image "
                                                         "build MANIFEST")
    missing = missing_nic_drivers(modules)
    if missing:
        return Check(node.name, "deploy ramdisk", False, f"lacks the NIC drivers {', '.join(missing)}: a node "
                                                         "booting from such a NIC gets no address")
    names = ", ".join(f"{v} {'/'.join(mods)}" for v, mods in NIC_FAMILIES.items())
    return Check(node.name, "deploy ramdisk", True, f"NIC drivers {names}")


def bmc_check(node: Node, answered: bool, message: str) -> Check:
    bmc = node.bmc
    where = f"{bmc.type} {bmc.address}{f':{bmc.port}' if bmc.port else ''}" if bmc else "no bmc section"
    if answered:
        return Check(node.name, "BMC", True, f"{where} answers ({message})")
    return Check(node.name, "BMC", False, message or f"{where} does not answer")


@dataclass(frozen=True)
class Inputs:
    """What the edges found: per OS the image's digest in the cache and why its proof does
    not cover it; the ramdisk's modules; per node whether its BMC answered, what it said and
    the serials of the drives it lists (None: not asked, e.g. in ``plan``)."""

    images: Mapping[str, tuple[str, str | None, str | None]]  # os -> (file, digest, proof problem)
    ramdisk_modules: set[str] | None
    # node -> (answered, what it said, the drive serials it lists or None)
    bmc: Mapping[str, tuple[bool, str, tuple[str, ...] | None]] | None


def checks(m: Manifest, nodes: Sequence[str], inputs: Inputs) -> list[Check]:
    """Every check of every node in ``nodes``, in order."""
    out: list[Check] = []
    for name in nodes:
        node = m.node(name)
        if method(m, node) == "image":
            file, digest, problem = inputs.images[node.os]
            out.append(image_check(node, file, digest, problem))
            out.append(ramdisk_check(node, inputs.ramdisk_modules))
        answer = inputs.bmc.get(name, (False, "not asked", None)) if inputs.bmc is not None else None
        out.append(disk_check(m, node, answer[2] if answer else None))
        if answer is not None:
            out.append(bmc_check(node, answer[0], answer[1]))
    return out


def failed(found: Sequence[Check]) -> list[Check]:
    return [c for c in found if not c.ok]


def refusal(found: Sequence[Check]) -> str:
    """The error apply stops with: every failed check, per node."""
    bad = failed(found)
    return "\n".join(["preflight of the PXE installs failed; nothing was changed, no node was armed or powered:",
                      *(f"  {c.line()}" for c in bad)])

