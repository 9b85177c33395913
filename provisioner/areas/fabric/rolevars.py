"""Variables for the fabric's role (ofed) and the fabric's inventory groups (``infiniband``,
``roce``). The software source is cluster-wide (group_vars/all); a node's IPoIB interface,
RoCE NICs, opensm and nvidia-peermem go to its host_vars, and only to nodes on a fabric.
Every value is computed from the manifest alone (``decide``)."""

from __future__ import annotations

from typing import Any

from provisioner.areas.fabric import decide
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


def groups(m: Manifest) -> dict[str, set[str]]:
    """The fabric's inventory groups -> members: the nodes with an interface on each fabric."""
    return {
        "infiniband": {n.name for n in m.nodes if "infiniband" in n.interfaces},
        "roce": {n.name for n in m.nodes if "roce" in n.interfaces},
    }


def cluster_vars(m: Manifest) -> dict[str, Any]:
    out: dict[str, Any] = {"ofed_source": m.software.ofed.source}
    if m.software.ofed.doca_version:
        out["ofed_doca_version"] = m.software.ofed.doca_version
    return out


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """The ofed role's variables of a node on a fabric ({} elsewhere)."""
    if not decide.on_fabric(node):
        return {}
    out = {
        "ofed_ipoib": decide.ipoib_config(m, node),
        "ofed_opensm": decide.opensm_node(m) == node.name,
        "ofed_peermem": decide.wants_peermem(m, node),
    }
    roce = decide.roce_config(m, node)
    if roce:  # only then: an InfiniBand node keeps the fingerprint it had before RoCE existed
        out["ofed_roce"] = roce
    return out
