"""Which checks apply to which node: every area's verify checks, through the area registry.

Pure: from the manifest only (docs/verify.md lists every check). Each area lists its own
checks (``provisioner/areas/<area>/verify.py``, with :mod:`provisioner.nodecheck.check`), only
where the manifest says they apply (GPU checks on GPU nodes, a mount's checks on the nodes
that mount it, ...). Whether one can run there is decided per node from the context probe
(:func:`provisioner.nodecheck.check.skip_reason`): kernel-bound checks in a container and GPU
checks without a GPU device say SKIP and why; they never say PASS.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.areas import registry
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import Check, NodeChecks


@dataclass(frozen=True)
class ClusterFacts:
    """What every node's checks share, decided once per manifest: each area's node checks
    (in registry order), made from the whole manifest."""

    areas: tuple[NodeChecks, ...]


def cluster_facts(m: Manifest) -> ClusterFacts:
    return ClusterFacts(tuple(registry.verify_checks(m)))


def checks_for(m: Manifest, node: Node, drained_by: str = "", facts: ClusterFacts | None = None) -> list[Check]:
    """Every check that applies to ``node``, area by area in registry order (``drained_by``:
    a Slurm drain with a reason starting so is expected; ``facts``: :func:`cluster_facts` of
    ``m``, made here when not given)."""
    shared = facts if facts is not None else cluster_facts(m)
    return [check for area_checks in shared.areas for check in area_checks(node, drained_by)]


def plan(m: Manifest, names: list[str] | None = None, drained_by: str = "") -> list[Check]:
    """The checks of ``names`` (every node when None), node by node in manifest order;
    ``drained_by``: a Slurm drain with a reason starting so is expected (slurm.node)."""
    facts = cluster_facts(m)
    return [c for node in m.nodes if names is None or node.name in names
            for c in checks_for(m, node, drained_by, facts)]
