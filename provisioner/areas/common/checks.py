"""Whole-manifest checks of the common area: what the common role cannot enforce with the
manifest's settings. Run by ``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.common.decide import unmanaged_root_keys_problem
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_root_keys(m: Manifest, src: Source) -> list[Diagnostic]:
    """Warn when root's authorized_keys cannot be enforced (no key is allowed root)."""
    problem = unmanaged_root_keys_problem(m)
    return [src.diag(("cluster", "admin_users"), problem, "warning")] if problem else []


CHECKS: tuple[Check, ...] = (check_root_keys,)
