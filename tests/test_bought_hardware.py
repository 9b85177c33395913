"""Issue 28's "Verify with": the manifest nobody here wrote, described as it was bought.

A startup's cluster: three workstation-class 2x RTX 3090 nodes and the two storage servers of
examples/music-lab.yaml, plus two 8x L40S nodes whose two 100 GbE ports each are RoCE v2 NICs
on a RoCE fabric (one address and RDMA device per port), the storage servers' two 25 GbE
ports as one LACP bond on the data network, and local NVMe scratch on every GPU node (striped
with LVM on the 3090s, mdadm RAID 0 on the L40S nodes). validate accepts it; the inventory
is written; every node's data-network files, as the common role renders them, go through
netplan's own generator (Ubuntu) and the real systemd-networkd (the units netplan wrote,
and the ones the role writes on Debian) without a word; docker's data_root lies on each
Docker node's scratch mount.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from provisioner import inventory
from provisioner.areas.common import decide
from provisioner.areas.fabric import decide as fabric
from provisioner.validate import load_text

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "common"

L40S = {
    "name": "l40s[1-2]",
    "roles": ["compute"],
    "os": "ubuntu-24.04",
    "install_disks": ["nvme-SAMSUNG_MZ1L2960HCJR_S6F[1-2]"],
    "interfaces": {
        "management": {"ip": "192.168.50.31", "mac": "a8:a1:59:00:00:31", "interface": "eno1"},
        "data": {"ip": "192.168.60.31", "interface": "enp65s0f0"},  # the NFS servers' network
        # each 100 GbE port its own address and RDMA device (RoCE v2; PFC/ECN live in the switch)
        "roce": [{"ip": "10.60.0.31", "interface": "ens2f0np0", "rdma_device": "mlx5_0"},
                 {"ip": "10.60.0.131", "interface": "ens2f1np1", "rdma_device": "mlx5_1"}],
    },
    "bmc": {"type": "redfish", "address": "192.168.51.31", "user": "admin",
            "password_file": "/etc/provision/bmc.pass"},
    "hardware": {
        "cpu": {"model": "AMD EPYC 9354", "cores_per_socket": 32, "threads_per_core": 2, "sockets": 2},
        "memory_gb": 1024,
        "gpu": {"model": "L40S", "count": 8, "memory_gb": 48, "type": "l40s"},
        "disks": [{"id": "nvme-SAMSUNG_MZQL27T6HBLA_S6C[1-4]", "size_gb": 7680, "kind": "nvme", "use": "scratch"}],
    },
    "scratch": {"path": "/scratch", "fs": "xfs", "raid": "mdadm"},
}


def bought() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "music-lab.yaml").read_text())
    data["networks"]["roce"] = {"cidr": "10.60.0.0/24", "mtu": 9000, "gid_index": 3}
    for node in data["nodes"]:
        if node["name"] == "store[1-2]":  # two 25 GbE ports as one LACP bond, by name
            node["interfaces"]["data"]["interface"] = "bond0"
            node["bonds"] = {"bond0": {"mode": "802.3ad", "members": ["enp65s0f0", "enp65s0f1"]}}
    data["nodes"].append(L40S)
    return data


def render(template: str, **variables: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    return env.get_template(template).render(ansible_managed="Ansible managed", **variables)


@pytest.fixture(scope="module")
def written() -> dict[str, Any]:
    """The manifest validated, and the inventory built from it: its files, the host vars."""
    loaded = load_text(yaml.safe_dump(bought(), sort_keys=False), "startup.yaml")
    files = inventory.build(loaded.manifest, source="startup.yaml")
    host_vars = {name.split("/")[1].removesuffix(".json"): json.loads(text)
                 for name, text in files.items() if name.startswith("host_vars/")}
    return {"loaded": loaded, "m": loaded.manifest, "files": files, "host_vars": host_vars}


def test_validate_and_inventory_take_it(written: dict[str, Any]) -> None:
    m, files, loaded = written["m"], written["files"], written["loaded"]
    assert [n.name for n in m.nodes] == ["labhead", "store1", "store2", "gpu1", "gpu2", "gpu3", "l40s1", "l40s2"]
    hosts = json.loads(files["hosts.json"])["all"]["children"]
    # the RoCE NICs are a fabric (the RDMA stack, NCCL's HCAs and GID index), never IPoIB
    assert set(hosts["roce"]["hosts"]) == {"l40s1", "l40s2"} and "infiniband" not in hosts
    l40s2 = m.node("l40s2")
    assert fabric.nccl_env(m, l40s2)["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert fabric.nccl_env(m, l40s2)["NCCL_IB_GID_INDEX"] == "3"
    assert set(hosts["scratch"]["hosts"]) == {"gpu1", "gpu2", "gpu3", "l40s1", "l40s2"}
    assert not [w.message for w in loaded.warnings if "scratch" in w.message], loaded.warnings


@pytest.mark.parametrize("node", ["store1", "l40s2"])
def test_netplan_and_networkd_accept_every_data_file(written: dict[str, Any], netplan: Any, networkd: Any,
                                                     node: str) -> None:
    """The bond on the storage servers, the two RoCE ports on the L40S nodes: the common role's
    netplan file (these nodes run Ubuntu) through netplan's generator, its units and the
    role's networkd files (what Debian would get) through systemd-networkd."""
    ifaces = written["host_vars"][node]["common_data_interfaces"]
    config = yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=ifaces))
    assert config == decide.netplan_data_config(ifaces)
    units = netplan(config)
    assert networkd(units) == []
    assert networkd(decide.networkd_data_files(ifaces)) == []
    if node == "store1":
        assert "Mode=802.3ad" in units["10-netplan-bond0.netdev"]
        assert "Bond=bond0" in units["10-netplan-enp65s0f1.network"]
        assert "Address=192.168.60.11/24" in units["10-netplan-bond0.network"]
    else:
        for port, address in (("ens2f0np0", "10.60.0.32/24"), ("ens2f1np1", "10.60.0.132/24")):
            unit = units[f"10-netplan-{port}.network"]
            assert f"Address={address}" in unit and "MTUBytes=9000" in unit, unit


def test_docker_data_root_sits_on_the_scratch_mount(written: dict[str, Any]) -> None:
    """docker's data_root (/scratch/docker) lies under each Docker node's scratch volume, which
    the storage play (before the GPU play's docker role) formats and mounts there."""
    m, host_vars = written["m"], written["host_vars"]
    docker_nodes = json.loads(written["files"]["hosts.json"])["all"]["children"]["docker"]["hosts"]
    root = json.loads(written["files"]["group_vars/all/gpu.json"])["docker_data_root"]
    assert root == m.docker.data_root == "/scratch/docker"
    for name in docker_nodes:
        volume = host_vars[name]["scratch_volume"]
        assert root.startswith(volume["path"].rstrip("/") + "/"), (name, volume["path"])
    assert host_vars["l40s1"]["scratch_volume"]["layout"] == "mdadm"
    assert len(host_vars["l40s1"]["scratch_volume"]["disks"]) == 4
    assert host_vars["gpu1"]["scratch_volume"]["layout"] == "lvm"


def test_a_docker_node_without_scratch_is_refused(kit: Any) -> None:
    data = bought()
    del data["nodes"][-1]["scratch"]
    data["nodes"][-1]["hardware"]["disks"] = []
    diag = kit.error(data, "docker.data_root")
    assert diag.path == "docker.data_root"
