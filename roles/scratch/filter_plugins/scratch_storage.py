"""Filters of the scratch role: thin wrappers over provisioner.areas.storage.scratch (the tested logic).

They run on the controller, where the provisioner package is installed (the venv that
runs ansible-playbook); from a plain checkout the repository root is put on sys.path.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from provisioner.areas.storage import decide, scratch
except ImportError:  # pragma: no cover - running from a checkout without the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from provisioner.areas.storage import decide, scratch


def scratch_volume_ready(blkid_text: str, fs: str) -> bool:
    """Does `blkid -p -o export DEVICE` show our file system (type and label)?"""
    return scratch.volume_ready(str(blkid_text or ""), str(fs))


def scratch_disk_safety(
    lsblk_results: Sequence[Mapping[str, Any]],
    wipefs_results: Sequence[Mapping[str, Any]],
    force: bool,
) -> dict[str, Any]:
    """{ok, refused, overridden, wipe} from the registered lsblk and wipefs loops."""
    probes = decide.probes_from_ansible(lsblk_results, wipefs_results)
    verdict = scratch.scratch_safety(probes, bool(force)).to_dict()
    verdict["wipe"] = scratch.wipe_targets(probes) if verdict["ok"] and force else []
    return verdict


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "scratch_volume_ready": scratch_volume_ready,
            "scratch_disk_safety": scratch_disk_safety,
        }
