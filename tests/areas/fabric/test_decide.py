"""provisioner.areas.fabric.decide: the opensm node, IPoIB, RoCE, nvidia-peermem, NCCL's environment."""

from __future__ import annotations

from typing import Any

from provisioner.areas.fabric import decide as fabric
from provisioner.manifest import Manifest


# =========================================================================== fabric
def test_opensm_node(llm: Manifest, kit: Any) -> None:
    assert fabric.opensm_node(llm) is None  # subnet_manager: switch
    data = kit.example("llm-200k.yaml")
    data["networks"]["infiniband"]["subnet_manager"] = "opensm"
    assert fabric.opensm_node(kit.load(data).manifest) == "head01"
    del data["nodes"][0]["interfaces"]["infiniband"]
    data["nfs"] = {}  # its exports serve the fabric, which head01 is no longer on
    assert fabric.opensm_node(kit.load(data).manifest) == "gpu01"


def test_ipoib_and_peermem(llm: Manifest, lab: Manifest) -> None:
    assert fabric.ipoib_config(llm, llm.node("gpu03")) == {
        "interface": "ibp65s0", "address": "10.10.2.23/24", "mtu": 2044, "mode": "datagram"
    }
    assert fabric.wants_peermem(llm, llm.node("gpu03"))
    assert not fabric.wants_peermem(llm, llm.node("head01"))  # no GPU
    assert fabric.ipoib_config(lab, lab.node("gpu1")) == {}
    assert not fabric.wants_peermem(lab, lab.node("gpu1"))  # no fabric


# =========================================================================== RoCE
def roce_data(kit: Any, **net: Any) -> dict[str, Any]:
    """The minimal manifest with storage, head01 and node[01-02] on a RoCE fabric (mlx5_0)."""
    data = kit.base(storage=True)
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000, **net}
    data["nodes"][0]["interfaces"]["roce"] = {"ip": "10.0.4.10", "interface": "ens2f0np0", "rdma_device": "mlx5_0"}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0", "rdma_device": "mlx5_0"}
    return data


def test_roce_config_and_peermem(kit: Any) -> None:
    m = kit.load(roce_data(kit, gid_index=5, traffic_class=106)).manifest
    assert fabric.roce_config(m, m.node("node02")) == [
        {"interface": "ens2f0np0", "rdma_device": "mlx5_0", "gid_index": 5, "traffic_class": 106, "mtu": 9000}]
    assert fabric.ipoib_config(m, m.node("node02")) == {}  # no IPoIB on Ethernet
    assert fabric.opensm_node(m) is None  # no subnet manager
    assert fabric.wants_peermem(m, m.node("node01"))  # GPUDirect RDMA over RoCE too
    assert not fabric.wants_peermem(m, m.node("head01"))  # no GPU
    data = roce_data(kit)
    data["networks"]["roce"]["rdma"] = False
    m = kit.load(data).manifest
    assert not fabric.wants_peermem(m, m.node("node01")) and not fabric.rdma_fabric(m)
    assert fabric.roce_config(kit.load(kit.base()).manifest, m.node("node01")) == []


def test_nccl_env_per_fabric(kit: Any, llm: Manifest) -> None:
    assert fabric.nccl_env(llm, llm.node("gpu01")) == {}  # InfiniBand without named devices: NCCL finds them
    data = roce_data(kit, traffic_class=106)
    m = kit.load(data).manifest
    assert fabric.nccl_env(m, m.node("node01")) == {
        "NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "106"}
    del data["nodes"][1]["interfaces"]["roce"]["rdma_device"]
    data["networks"]["roce"].pop("traffic_class")
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0", "rdma_device": "mlx5_2"}
    m = kit.load(data).manifest
    assert fabric.nccl_env(m, m.node("node01")) == {"NCCL_IB_HCA": "=mlx5_2", "NCCL_IB_GID_INDEX": "3"}
    assert fabric.node_rdma_networks(m, m.node("node01")) == ["infiniband", "roce"]
    assert fabric.shared_rdma_network(m, m.node("node01"), m.node("node02")) == "infiniband"
    assert fabric.shared_rdma_network(m, m.node("node01"), m.node("head01")) == "roce"
    data["networks"]["roce"]["rdma"] = False  # RoCE NICs used as plain Ethernet: nothing for NCCL there
    m = kit.load(data).manifest
    assert fabric.nccl_env(m, m.node("node01")) == {"NCCL_IB_HCA": "=mlx5_2"}
    assert fabric.shared_rdma_network(m, m.node("node01"), m.node("head01")) is None


def test_roce_interface_needs_a_name(kit: Any) -> None:
    data = roce_data(kit)
    del data["nodes"][1]["interfaces"]["roce"]["interface"]
    errors = kit.errors(data)
    assert any("a roce NIC needs a name" in d.message for d in errors), [d.message for d in errors]


def test_two_roce_nics_per_node(kit: Any) -> None:
    """Issue 28 item 2: the L40S nodes' 2 x 100 GbE RoCE ports, each with its address and RDMA
    device: both are checked by the ofed role, both are NCCL's, the first carries NFS/verify."""
    data = roce_data(kit)
    data["nodes"][1]["interfaces"]["roce"] = [
        {"ip": "10.0.4.21", "interface": "ens2f0np0", "rdma_device": "mlx5_0"},
        {"ip": "10.0.4.121", "interface": "ens2f1np1", "rdma_device": "mlx5_1"},
    ]
    m = kit.load(data).manifest
    node02 = m.node("node02")
    assert [nic.ip.exploded for nic in node02.interfaces["roce"].nics()] == ["10.0.4.22", "10.0.4.122"]
    assert [c["interface"] + "/" + c["rdma_device"] for c in fabric.roce_config(m, node02)] == [
        "ens2f0np0/mlx5_0", "ens2f1np1/mlx5_1"]
    assert fabric.nccl_env(m, node02)["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
