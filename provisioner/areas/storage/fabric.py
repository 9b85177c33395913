"""The InfiniBand fabric, pure: RDMA, the opensm node, a node's IPoIB interface, GPUDirect
RDMA (nvidia-peermem)."""

from __future__ import annotations

from typing import Any

from provisioner.areas.storage.base import StorageError
from provisioner.manifest.model import Manifest, Node


def rdma_fabric(m: Manifest) -> bool:
    ib = m.networks.infiniband
    return ib is not None and ib.rdma


def opensm_node(m: Manifest) -> str | None:
    """Where opensm runs when the fabric has no managed switch: the head node if it is on
    the fabric, else the first node with an InfiniBand interface."""
    ib = m.networks.infiniband
    if ib is None or ib.subnet_manager != "opensm":
        return None
    heads = [n for n in m.with_role("head") if "infiniband" in n.interfaces]
    chosen = heads[0] if heads else next((n for n in m.nodes if "infiniband" in n.interfaces), None)
    return chosen.name if chosen is not None else None


def ipoib_config(m: Manifest, node: Node) -> dict[str, Any]:
    """The IPoIB interface of a node ({} when it has none)."""
    ib = m.networks.infiniband
    iface = node.interfaces.get("infiniband")
    if ib is None or iface is None:
        return {}
    if not iface.interface:
        raise StorageError(f"{node.name}: the infiniband interface needs a name (interface: ib0)")
    return {
        "interface": iface.interface,
        "address": f"{iface.ip}/{ib.cidr.prefixlen}",
        "mtu": ib.mtu,
        "mode": ib.mode,
    }


def wants_peermem(m: Manifest, node: Node) -> bool:
    """GPUDirect RDMA: a GPU node on an RDMA fabric loads nvidia-peermem."""
    return node.gpu_count > 0 and "infiniband" in node.interfaces and rdma_fabric(m)
