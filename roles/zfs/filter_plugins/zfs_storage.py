"""Filters of the zfs role: thin wrappers over provisioner.areas.storage.decide (the tested logic).

They run on the controller, where the provisioner package is installed (the venv that
runs ansible-playbook); from a plain checkout the repository root is put on sys.path.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from provisioner.areas.storage import decide as storage
except ImportError:  # pragma: no cover - running from a checkout without the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from provisioner.areas.storage import decide as storage


def zfs_importable_pools(text: str) -> list[str]:
    """Pool names from `zpool import` output."""
    return storage.importable_pools(str(text))


def zfs_layout_drift(status_text: str, expected: Mapping[str, Any]) -> list[str]:
    """Drift sentences between `zpool status -P` output and the expected layout."""
    return storage.status_drift(str(status_text), expected)


def zfs_disk_safety(
    lsblk_results: Sequence[Mapping[str, Any]],
    wipefs_results: Sequence[Mapping[str, Any]],
    force: bool,
) -> dict[str, Any]:
    """{ok, refused, overridden} from the registered lsblk and wipefs loops."""
    probes = storage.probes_from_ansible(lsblk_results, wipefs_results)
    return storage.disk_safety(probes, bool(force)).to_dict()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "zfs_importable_pools": zfs_importable_pools,
            "zfs_layout_drift": zfs_layout_drift,
            "zfs_disk_safety": zfs_disk_safety,
        }
