"""Whole-manifest checks of the fabric area: fabric interfaces the ofed role cannot build,
found by computing its role variables. Run by ``provisioner.validate`` on a structurally
clean manifest."""

from __future__ import annotations

from provisioner.areas.fabric.decide import FabricError
from provisioner.areas.fabric.rolevars import node_vars
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check, node_path
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_fabric_vars(m: Manifest, src: Source) -> list[Diagnostic]:
    """Fabric interfaces a node cannot carry out (an IPoIB interface or RoCE NIC without a name)."""
    out: list[Diagnostic] = []
    for node in m.nodes:
        try:
            node_vars(m, node)
        except FabricError as exc:
            out.append(src.diag(node_path(node), f"{node.name}: {exc}"))
    return out


CHECKS: tuple[Check, ...] = (check_fabric_vars,)
