"""Whole-manifest checks of the people area: clashing names and ids, undeclared groups, a
homes export that does not exist. Run by ``provisioner.validate`` on a structurally clean
manifest; each finding sits at the offending value (file:line:col)."""

from __future__ import annotations

from provisioner.areas.people.decide import problems
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_people(m: Manifest, src: Source) -> list[Diagnostic]:
    return [src.diag(p.path, p.message, p.severity) for p in problems(m)]


CHECKS: tuple[Check, ...] = (check_people,)
