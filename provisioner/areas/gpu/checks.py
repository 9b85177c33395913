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


def check_gate(m: Manifest, src: Source) -> list[Diagnostic]:
    """The acceptance gate holds compute nodes in Slurm, and gpu.burn needs its seconds."""
    out: list[Diagnostic] = []
    gate = m.verify.gate
    for i, name in enumerate(gate):
        if name in gate[:i]:
            out.append(src.diag(("verify", "gate", i), f"{name} is named twice"))
    if gate and not m.slurm.enabled:
        out.append(src.diag(("verify", "gate"), "the gate holds compute nodes drained in Slurm, and "
                            "slurm.enabled is false"))
    if "gpu.burn" in gate and not m.verify.burn_in_s:
        out.append(src.diag(("verify", "gate"), "gpu.burn runs only with verify.burn_in_s > 0 (its seconds)"))
    return out


CHECKS: tuple[Check, ...] = (check_software, check_gate)
