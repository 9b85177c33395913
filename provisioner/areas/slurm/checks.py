"""Whole-manifest checks of the Slurm area: errors for Slurm releases the controller cannot
work with (mixed OS clusters), warnings about what the nodes' Slurm cannot do (e.g. no
cgroup v2 fencing). Run by ``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.slurm import accounts, containers
from provisioner.areas.slurm.decide import problems, version_conflicts
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check, node_path
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_slurm_problems(m: Manifest, src: Source) -> list[Diagnostic]:
    return [src.diag(("slurm",), message.removeprefix("slurm: "), "warning") for message in problems(m)]


def check_slurm_versions(m: Manifest, src: Source) -> list[Diagnostic]:
    """A node whose OS ships a Slurm the controller cannot work with: an error on its ``os``."""
    return [src.diag(node_path(node, "os"), message) for node, message in version_conflicts(m)]


def check_slurm_accounts(m: Manifest, src: Source) -> list[Diagnostic]:
    """Accounts, QOS and users' accounts that do not fit: errors at the value."""
    return [src.diag(path, message) for path, message in accounts.problems(m)]


def check_slurm_containers(m: Manifest, src: Source) -> list[Diagnostic]:
    """enroot + pyxis where they cannot do what the section promises: warnings."""
    return [src.diag(path, message, "warning") for path, message in containers.problems(m)]


CHECKS: tuple[Check, ...] = (check_slurm_problems, check_slurm_versions, check_slurm_accounts,
                             check_slurm_containers)
