"""Whole-manifest checks of the Slurm area: warnings about what the nodes' Slurm cannot do
(e.g. no cgroup v2 fencing). Run by ``provisioner.validate`` on a structurally clean
manifest."""

from __future__ import annotations

from provisioner.areas.slurm.decide import problems
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_slurm_problems(m: Manifest, src: Source) -> list[Diagnostic]:
    return [src.diag(("slurm",), message.removeprefix("slurm: "), "warning") for message in problems(m)]


CHECKS: tuple[Check, ...] = (check_slurm_problems,)
