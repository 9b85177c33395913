"""Whole-manifest checks of the GPU area: driver/CUDA/NCCL/Docker combinations a node's OS
cannot install. Run by ``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.gpu.rolevars import stack_errors
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_software(m: Manifest, src: Source) -> list[Diagnostic]:
    """Driver/CUDA/NCCL/Docker combinations the node's OS cannot install."""
    seen: set[str] = set()
    out: list[Diagnostic] = []
    for node_name, message in stack_errors(m):
        if message in seen:
            continue
        seen.add(message)
        node = m.node(node_name)
        out.append(src.diag(("software",), f"{node_name} ({node.os}): {message}"))
    return out


CHECKS: tuple[Check, ...] = (check_software,)
