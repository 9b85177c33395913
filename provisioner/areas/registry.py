"""The registry of areas: what inventory, plan, apply and validate ask of every area.

Each area's ``rolevars`` module exposes ``cluster_vars(m)`` (written to
group_vars/all/<area>.yml) and ``node_vars(m, node)`` (merged into host_vars/<node>.yml).
``light_keys`` names the cluster-wide variables that only light cluster-wide plays consume
(/etc/hosts, slurm.conf, exports): a change there re-renders files everywhere but does not
re-run heavy plays. ``checks`` are the area's whole-manifest checks (``checks.py``), run by
``provisioner.validate`` on a structurally clean manifest; ``prepare`` makes control-machine
material before an apply (e.g. the munge key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provisioner.areas.baremetal import checks as baremetal_checks
from provisioner.areas.baremetal import rolevars as baremetal
from provisioner.areas.common import checks as common_checks
from provisioner.areas.common import decide as common_decide
from provisioner.areas.common import rolevars as common
from provisioner.areas.gpu import checks as gpu_checks
from provisioner.areas.gpu import rolevars as gpu
from provisioner.areas.monitoring import checks as monitoring_checks
from provisioner.areas.monitoring import decide as monitoring_decide
from provisioner.areas.monitoring import rolevars as monitoring
from provisioner.areas.slurm import checks as slurm_checks
from provisioner.areas.slurm import decide as slurm_decide
from provisioner.areas.slurm import rolevars as slurm
from provisioner.areas.storage import checks as storage_checks
from provisioner.areas.storage import rolevars as storage
from provisioner.manifest.checks import Check
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest, Node
from provisioner.state import StateDir

PrepareHook = Callable[[Loaded, StateDir], None]


@dataclass(frozen=True)
class Area:
    name: str
    cluster_vars: Callable[[Manifest], dict[str, Any]]
    node_vars: Callable[[Manifest, Node], dict[str, Any]]
    light_keys: frozenset[str] = frozenset()
    checks: tuple[Check, ...] = ()
    prepare: PrepareHook | None = None
    # packages of the OS archive that every node of the manifest gets from this area's roles,
    # which a node image built for it carries (provision image build)
    image_packages: Callable[[Manifest], tuple[str, ...]] | None = None


# This order names the plan's sections (per node: which areas changed).
AREAS: tuple[Area, ...] = (
    Area("common", common.cluster_vars, common.node_vars, frozenset({"common_hosts"}),
         checks=common_checks.CHECKS, image_packages=common_decide.image_packages),
    Area("storage", storage.cluster_vars, storage.node_vars, checks=storage_checks.CHECKS),
    Area("gpu", gpu.cluster_vars, gpu.node_vars, checks=gpu_checks.CHECKS),
    Area("slurm", slurm.cluster_vars, slurm.node_vars, slurm.LIGHT_KEYS, checks=slurm_checks.CHECKS,
         prepare=slurm_decide.prepare_munge_key),
    Area("baremetal", baremetal.cluster_vars, baremetal.node_vars, baremetal.LIGHT_KEYS,
         checks=baremetal_checks.CHECKS),
    Area("monitoring", monitoring.cluster_vars, monitoring.node_vars, monitoring.LIGHT_KEYS,
         checks=monitoring_checks.CHECKS, prepare=monitoring_decide.prepare_secrets,
         image_packages=monitoring_decide.image_packages),
)

# validate reports the areas' findings in this order: the GPU stack first (as before the areas
# had their own packages); areas not named here follow in AREAS order.
CHECK_ORDER: tuple[str, ...] = ("gpu", "storage", "slurm")


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


def checks() -> list[Check]:
    """Every area's whole-manifest checks, in the order validate reports them."""
    rank = {name: i for i, name in enumerate(CHECK_ORDER)}
    ordered = sorted(AREAS, key=lambda area: rank.get(area.name, len(rank)))  # stable: AREAS order after
    return [check for area in ordered for check in area.checks]


def image_packages(m: Manifest) -> tuple[str, ...]:
    """What a node OS image built for ``m`` carries beyond its recipe: every area's packages
    that all of the manifest's nodes get, sorted, each once."""
    return tuple(sorted({p for area in AREAS if area.image_packages is not None for p in area.image_packages(m)}))


def prepare_hooks() -> list[PrepareHook]:
    """The areas' steps before an apply, in AREAS order."""
    return [area.prepare for area in AREAS if area.prepare is not None]
