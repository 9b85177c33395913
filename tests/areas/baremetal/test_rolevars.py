"""provisioner.areas.baremetal.rolevars: the pxe_server variables (cluster-wide, light keys)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.baremetal import rolevars as baremetal
from provisioner.areas.baremetal.decide import PXE_HTTP_PORT
from provisioner.validate import load_manifest, load_text

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
SPECS = yaml.safe_load((ROOT / "roles/pxe_server/meta/argument_specs.yml").read_text())["argument_specs"]
OPTIONS: dict[str, Any] = SPECS["main"]["options"]
TYPES = {"str": str, "int": int, "bool": bool, "list": list, "dict": dict, "path": str}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_cluster_wide_light_keys_only(path: Path) -> None:
    m = load_manifest(path).manifest
    assert set(baremetal.cluster_vars(m)) == baremetal.LIGHT_KEYS
    assert all(baremetal.node_vars(m, node) == {} for node in m.nodes)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_emitted_variables_match_the_argument_specs(path: Path) -> None:
    m = load_manifest(path).manifest
    head_vars = baremetal.cluster_vars(m)
    for name, value in head_vars.items():
        assert name in OPTIONS, f"{name} is not declared in roles/pxe_server/meta/argument_specs.yml"
        assert isinstance(value, TYPES[OPTIONS[name]["type"]]), name
        if "choices" in OPTIONS[name]:
            assert value in OPTIONS[name]["choices"]
    required = {k for k, v in OPTIONS.items() if v.get("required")}
    assert required <= set(head_vars)
    node_spec = OPTIONS["pxe_server_nodes"]["options"]
    for entry in head_vars["pxe_server_nodes"]:
        assert set(entry) <= set(node_spec)
        assert {k for k, v in node_spec.items() if v.get("required")} <= set(entry)
        assert entry["os"] in node_spec["os"]["choices"]
        assert entry["boot_mode"] in node_spec["boot_mode"]["choices"]
        names = [f["name"] for f in entry["files"]]
        assert len(names) == len(set(names)) and "install.ipxe" in names
        assert all(isinstance(f["content"], str) and f["content"] for f in entry["files"])


def test_llm200k_head_vars() -> None:
    m = load_manifest(ROOT / "examples" / "llm-200k.yaml").manifest
    got = baremetal.cluster_vars(m)
    assert {k: v for k, v in got.items() if k not in ("pxe_server_nodes", "pxe_server_ubuntu_media")} == {
        "pxe_server_address": "10.10.0.10",
        "pxe_server_network": "10.10.0.0/24",
        "pxe_server_network_address": "10.10.0.0",
        "pxe_server_netmask": "255.255.255.0",
        "pxe_server_gateway": "10.10.0.1",
        "pxe_server_dns": ["10.10.0.1"],
        "pxe_server_domain": "llm.internal",
        "pxe_server_interface": "eno1",
        "pxe_server_http_port": PXE_HTTP_PORT,
    }
    nodes = got["pxe_server_nodes"]
    assert [(n["name"], n["mac"], n["address"], n["os"]) for n in nodes] == [
        (f"gpu0{i}", f"3c:ec:ef:10:00:2{i}", f"10.10.0.2{i}", "ubuntu-22.04") for i in range(1, 5)
    ]
    files = {f["name"]: f["content"] for f in nodes[0]["files"]}
    # image deploys by default: the deploy ramdisk's iPXE script and the node's deploy plan
    assert nodes[0]["method"] == "image" and set(files) == {"install.ipxe", "deploy.json"}
    assert "kernel http://10.10.0.10/images/deploy-ramdisk/vmlinuz " in files["install.ipxe"]
    assert "provision.plan=http://10.10.0.10/nodes/gpu01/deploy.json" in files["install.ipxe"]
    plan = json.loads(files["deploy.json"])
    assert plan["image"] == {"url": "http://10.10.0.10/images/ubuntu-22.04.tar.zst", "sha256": ""}  # the role fills it
    assert plan["erase_allowed"] is False and plan["mac"] == "3c:ec:ef:10:00:21"
    # the installer method keeps the autoinstall seed
    data = yaml.safe_load((ROOT / "examples" / "llm-200k.yaml").read_text())
    data["cluster"]["install_method"] = "installer"
    m = load_text(yaml.safe_dump(data), "llm.yaml").manifest
    entry = baremetal.cluster_vars(m)["pxe_server_nodes"][0]
    files = {f["name"]: f["content"] for f in entry["files"]}
    assert entry["method"] == "installer"
    assert set(files) == {"install.ipxe", "user-data", "meta-data", "vendor-data"}
    assert "http://10.10.0.10/nodes/gpu01/" in files["install.ipxe"]


def test_music_lab_serves_every_node_but_the_head() -> None:
    m = load_manifest(ROOT / "examples" / "music-lab.yaml").manifest
    got = baremetal.cluster_vars(m)
    assert [n["name"] for n in got["pxe_server_nodes"]] == ["store1", "store2", "gpu1", "gpu2", "gpu3"]
    assert {n["os"] for n in got["pxe_server_nodes"]} == {"ubuntu-24.04"}
    assert got["pxe_server_interface"] == "enp5s0"


def test_nodes_without_a_mac_or_install_disks_are_left_out(kit: Any) -> None:
    data = kit.base()
    m = kit.load(data).manifest
    assert baremetal.cluster_vars(m)["pxe_server_nodes"] == []  # no install_disks
    data["nodes"][1]["install_disks"] = ["ata-OS_DISK"]
    m = kit.load(data).manifest
    assert [n["name"] for n in baremetal.cluster_vars(m)["pxe_server_nodes"]] == ["node01", "node02"]
    data["nodes"][1]["interfaces"]["management"].pop("mac")
    m = kit.load(data).manifest
    assert baremetal.cluster_vars(m)["pxe_server_nodes"] == []
