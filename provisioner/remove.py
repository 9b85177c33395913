"""`provision remove`: which nodes may be removed (the drain is provisioner/drain.py).

The manifest stays the one truth: a node is removed by deleting it from the manifest and
then running ``provision remove MANIFEST NODE``, which drains it in Slurm (waiting for its
jobs, bounded), runs apply so that /etc/hosts, slurm.conf, exports and mounts render
without it on the remaining nodes, and records it ``removed``. The node itself is never
contacted, so nothing on its disks changes. The decisions and the drain loop are here
(provisioner/drain.py, commands through an injected ``Execute``);
provisioner/commands/remove.py is the edge.
"""

from __future__ import annotations

from provisioner.manifest.model import Manifest
from provisioner.state import State

DRAIN_REASON = "provision remove"


def removal_problems(m: Manifest, state: State, nodes: list[str]) -> list[str]:
    """Why ``nodes`` cannot be removed (empty: they can)."""
    problems = []
    in_manifest = set(m.node_names())
    for name in nodes:
        ns = state.nodes.get(name)
        if name in in_manifest:
            problems.append(f"{name} is still in the manifest: delete it there first (the cluster's files render "
                            "from the manifest; remove then renders them without it)")
        elif ns is None:
            known = sorted(n for n, s in state.nodes.items() if n not in in_manifest and s.lifecycle != "removed")
            problems.append(f"{name} is not in the state: nothing to remove"
                            + (f" (nodes the manifest no longer lists: {', '.join(known)})" if known else ""))
        elif ns.lifecycle == "removed":
            problems.append(f"{name} was removed already ({ns.removed_at})")
    return problems
