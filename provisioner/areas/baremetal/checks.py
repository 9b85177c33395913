"""Whole-manifest checks of the bare-metal area: a node marked ``install: pxe`` must be one
the PXE server can install. Run by ``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.baremetal.decide import not_installable
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


CHECKS: tuple[Check, ...] = (check_pxe_installs,)
