"""provisioner.areas.slurm.decide: the cluster's shape: NodeName lines, partitions, gres device files."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas.slurm.decide import (
    cluster_name,
    controller,
    default_mem_per_cpu,
    gpu_files,
    node_definitions,
    partitions,
)
from provisioner.areas.slurm.releases import problems
from provisioner.manifest import Manifest
from provisioner.manifest.slurm import Partition


def example(kit: Any, name: str) -> Manifest:
    m: Manifest = kit.load(kit.example(name), name).manifest
    return m


def test_gpu_files() -> None:
    assert gpu_files(1) == "/dev/nvidia0"
    assert gpu_files(8) == "/dev/nvidia[0-7]"
    with pytest.raises(ValueError):
        gpu_files(0)


def test_llm_nodes_and_partitions(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")
    assert node_definitions(m) == [
        {"name": "gpu[01-04]", "sockets": 1, "cores_per_socket": 24, "threads_per_core": 2,
         "real_memory_mb": 256 * 1024 - 13107, "gres": "gpu:rtx_a6000:2"},
    ]
    assert partitions(m) == [
        {"name": "gpu", "nodes": "gpu[01-04]", "default": True, "max_time": "7-00:00:00", "default_time": ""},
    ]
    assert cluster_name(m) == "llm200k"
    assert controller(m).name == "head01"


def test_music_lab_nodes_and_partitions(kit: Any) -> None:
    m = example(kit, "music-lab.yaml")
    assert node_definitions(m) == [
        {"name": "gpu[1-3]", "sockets": 1, "cores_per_socket": 24, "threads_per_core": 2,
         "real_memory_mb": 256 * 1024 - 13107, "gres": "gpu:rtx3090:2"},
    ]
    assert partitions(m) == [
        {"name": "gpu", "nodes": "gpu[1-3]", "default": True, "max_time": "2-00:00:00", "default_time": ""},
        {"name": "debug", "nodes": "gpu1", "default": False, "max_time": "01:00:00", "default_time": ""},
    ]
    assert problems(m) == []


def test_heterogeneous_nodes_get_one_line_per_hardware(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append({
        "name": "big[01-02]",
        "roles": ["compute"],
        "os": "ubuntu-24.04",  # the controller's (its Slurm must be the newest)
        "interfaces": {"management": {"ip": "10.0.0.40"}},
        "hardware": {"cpu": {"sockets": 2, "cores_per_socket": 32}, "memory_gb": 1024,
                     "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 8}},
    })
    m = kit.load(data).manifest
    defs = node_definitions(m)
    assert [d["name"] for d in defs] == ["node[01-02]", "big[01-02]"]
    assert defs[1]["gres"] == "gpu:h100_80gb_hbm3:8"
    assert defs[1]["real_memory_mb"] == 1024 * 1024 - 1024 * 1024 // 20  # 5 %, uncapped (issue 19 item 13)
    # DefMemPerCPU: the smallest memory per thread over all slurmd nodes
    assert default_mem_per_cpu(m) == (128 * 1024 - 6553) // 32


def test_node_without_gpu_has_no_gres(kit: Any) -> None:
    data = kit.base()
    del data["nodes"][1]["hardware"]["gpu"]
    m = kit.load(data).manifest
    assert node_definitions(m)[0]["gres"] == ""


def test_head_that_computes_is_a_slurmd_node(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["roles"] = ["head", "compute"]
    m = kit.load(data).manifest
    assert node_definitions(m)[0]["name"] == "head01"
    assert partitions(m)[0]["nodes"] == "head01,node[01-02]"


def test_default_partition_when_manifest_has_none(kit: Any) -> None:
    data = kit.base()
    del data["slurm"]
    m = kit.load(data).manifest
    assert partitions(m) == [
        {"name": "compute", "nodes": "node[01-02]", "default": True, "max_time": "INFINITE", "default_time": ""}
    ]


def test_partition_members_limited_to_compute_nodes(kit: Any) -> None:
    # The manifest checks reject these partitions; partitions() still keeps slurm.conf valid.
    m = kit.load(kit.base()).manifest
    m.slurm.partitions = [
        Partition(name="all", nodes=["head01", "node01"], max_time="1:00:00", default_time="30"),
        Partition(name="heads", nodes=["@head"]),
        Partition(name="ghost", nodes=["nosuchnode"]),
        Partition(name="x", nodes=["node02"], default=True),
        Partition(name="y", nodes=["node01"], default=True),
    ]
    assert partitions(m) == [
        {"name": "all", "nodes": "node01", "default": False, "max_time": "1:00:00", "default_time": "30"},
        {"name": "x", "nodes": "node02", "default": True, "max_time": "INFINITE", "default_time": ""},
        {"name": "y", "nodes": "node01", "default": False, "max_time": "INFINITE", "default_time": ""},
    ]


def test_partitions_checked_by_the_manifest_checks(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"] = [{"name": "heads", "nodes": ["head01"]}]
    kit.error(data, "head01 does not have role 'compute'")


def test_no_compute_node_reported(kit: Any) -> None:
    data = kit.base()
    data["nodes"] = data["nodes"][:1]
    del data["slurm"]
    data["docker"] = {"enabled": False}
    m = kit.load(data).manifest
    assert partitions(m) == []
    assert any("no node has role 'compute'" in p for p in problems(m))


def test_first_partition_is_default_when_none_is(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"] = [{"name": "a", "nodes": ["node01"]}, {"name": "b", "nodes": ["node02"]}]
    parts = partitions(kit.load(data).manifest)
    assert [p["default"] for p in parts] == [True, False]
