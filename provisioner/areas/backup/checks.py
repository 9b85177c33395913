"""Whole-manifest checks of the backup area: a dataset destination that no storage node
holds, a local destination inside what a backup copies, a Prometheus snapshot where there is
no Prometheus on the head. Each finding sits at the offending value (file:line:col)."""

from __future__ import annotations

from provisioner.areas.backup.decide import problems
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_backup(m: Manifest, src: Source) -> list[Diagnostic]:
    return [src.diag(path, message) for path, message in problems(m)]


CHECKS: tuple[Check, ...] = (check_backup,)
