"""The fabric area's decisions, pure. The RDMA fabrics: InfiniBand (IPoIB, a subnet manager)
and RoCE v2 (RDMA over the Ethernet NICs of ``networks.roce``: no IPoIB, no subnet manager;
its address and MTU are the common role's, like the data network's); which fabric two nodes share, the opensm node, a
node's IPoIB interface and RoCE devices, GPUDirect RDMA (nvidia-peermem)."""

from __future__ import annotations

from typing import Any

from provisioner.manifest.fields import NetworkName
from provisioner.manifest.model import Manifest
from provisioner.manifest.networks import RoceNetwork
from provisioner.manifest.nodes import Node


class FabricError(ValueError):
    """The manifest asks for a fabric interface the ofed role cannot build (one without a name)."""


def rdma_fabric(m: Manifest) -> bool:
    """Some fabric (InfiniBand or RoCE) has rdma: true."""
    return bool(m.networks.rdma())


def node_rdma_networks(m: Manifest, node: Node) -> list[NetworkName]:
    """The RDMA fabrics ``node`` has an interface on, InfiniBand first."""
    return [net for net in m.networks.rdma() if net in node.interfaces]


def shared_rdma_network(m: Manifest, a: Node, b: Node) -> NetworkName | None:
    """The RDMA fabric two nodes both sit on (InfiniBand before RoCE), None without one."""
    return next((net for net in node_rdma_networks(m, a) if net in b.interfaces), None)


def on_fabric(node: Node) -> bool:
    """The node has an interface on InfiniBand or RoCE (the fabric play's hosts)."""
    return "infiniband" in node.interfaces or "roce" in node.interfaces


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
        raise FabricError(f"{node.name}: the infiniband interface needs a name (interface: ib0)")
    return {
        "interface": iface.interface,
        "address": f"{iface.ip}/{ib.cidr.prefixlen}",
        "mtu": ib.mtu,
        "mode": ib.mode,
    }


def roce_config(m: Manifest, node: Node) -> list[dict[str, Any]]:
    """The node's RoCE NICs as the ofed role checks them ([] when it has none): each netdev,
    its RDMA device ('' = whichever the netdev has), the GID index RoCE v2 uses and the
    traffic class. The NICs' addresses and MTU are the common role's (common_data_interfaces)."""
    roce = m.networks.roce
    iface = node.interfaces.get("roce")
    if roce is None or iface is None:
        return []
    out = []
    for nic in iface.nics():
        if not nic.interface:
            raise FabricError(f"{node.name}: a roce NIC needs a name (interface: enp65s0f0np0); {nic.ip} has none")
        out.append({
            "interface": nic.interface,
            "rdma_device": nic.rdma_device or "",
            "gid_index": roce.gid_index,
            "traffic_class": roce.traffic_class if roce.traffic_class is not None else -1,
            "mtu": roce.mtu,
        })
    return out


def nccl_env(m: Manifest, node: Node) -> dict[str, str]:
    """What NCCL needs to find the node's RDMA fabric (``/etc/nccl.conf``): the devices
    (NCCL_IB_HCA, exact names, where the manifest names them) and, on RoCE, the GID index of
    RoCE v2 over IPv4 and the traffic class the switches treat as lossless. InfiniBand alone
    needs nothing ({}): NCCL finds its HCAs and addresses them by LID."""
    nets = node_rdma_networks(m, node)
    env: dict[str, str] = {}
    devices = [d for net in nets for nic in node.interfaces[net].nics() if (d := nic.rdma_device)]
    if devices:
        env["NCCL_IB_HCA"] = "=" + ",".join(devices)
    roce = m.networks.roce
    if "roce" in nets and isinstance(roce, RoceNetwork):
        env["NCCL_IB_GID_INDEX"] = str(roce.gid_index)
        if roce.traffic_class is not None:
            env["NCCL_IB_TC"] = str(roce.traffic_class)
    return env


def wants_peermem(m: Manifest, node: Node) -> bool:
    """GPUDirect RDMA: a GPU node on an RDMA fabric loads nvidia-peermem."""
    return node.gpu_count > 0 and bool(node_rdma_networks(m, node))
