"""Manifest -> role variables, one module per area (see docs/design.md).

Each area module exposes ``cluster_vars(m)`` (written to group_vars/all/<area>.yml) and
``node_vars(m, node)`` (merged into host_vars/<node>.yml). ``LIGHT_KEYS`` names the
cluster-wide variables that only light cluster-wide plays consume (/etc/hosts, slurm.conf,
exports): a change there re-renders files everywhere but does not re-run heavy plays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provisioner.manifest.model import Manifest, Node
from provisioner.rolevars import baremetal, common, gpu, slurm, storage


@dataclass(frozen=True)
class Area:
    name: str
    cluster_vars: Callable[[Manifest], dict[str, Any]]
    node_vars: Callable[[Manifest, Node], dict[str, Any]]
    light_keys: frozenset[str] = frozenset()


AREAS: tuple[Area, ...] = (
    Area("common", common.cluster_vars, common.node_vars, frozenset({"common_hosts"})),
    Area("storage", storage.cluster_vars, storage.node_vars),
    Area("gpu", gpu.cluster_vars, gpu.node_vars),
    Area("slurm", slurm.cluster_vars, slurm.node_vars, slurm.LIGHT_KEYS),
    Area("baremetal", baremetal.cluster_vars, baremetal.node_vars, baremetal.LIGHT_KEYS),
)


def cluster_vars(m: Manifest) -> dict[str, dict[str, Any]]:
    """Cluster-wide variables per area."""
    return {area.name: area.cluster_vars(m) for area in AREAS}


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """All node-specific variables, merged (role prefixes keep the keys apart)."""
    merged: dict[str, Any] = {}
    for area in AREAS:
        for key, value in area.node_vars(m, node).items():
            if key in merged:
                raise ValueError(f"variable {key!r} is produced by two areas")
            merged[key] = value
    return merged
