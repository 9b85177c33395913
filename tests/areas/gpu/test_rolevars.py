"""provisioner.areas.gpu.rolevars: manifest -> variables of the GPU stack roles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.gpu import rolevars as rv
from provisioner.areas.gpu.decide import GpuStackError
from provisioner.manifest.load import expand_nodes
from provisioner.manifest.model import Manifest

ROOT = Path(__file__).resolve().parents[3]
ROLES = ("nvidia_driver", "cuda", "nccl", "docker", "nvidia_container_toolkit")


def _declared(role: str) -> dict[str, Any]:
    """Options of every entry point of a role."""
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, Any] = {}
    for entry in spec["argument_specs"].values():
        options.update(entry["options"])
    return options


def _all_declared() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role in ROLES:
        out.update(_declared(role))
    return out


def _load(kit: Any, data: dict[str, Any]) -> Manifest:
    manifest: Manifest = kit.load(data).manifest
    return manifest


def _unchecked(data: dict[str, Any]) -> Manifest:
    """A manifest that skipped the whole-manifest checks (which run stack_errors too)."""
    m = Manifest.model_validate(data)
    return m.model_copy(update={"nodes": expand_nodes(m.nodes)})


# --------------------------------------------------------------------------- examples
def test_llm_200k(kit: Any) -> None:
    m = _load(kit, kit.example("llm-200k.yaml"))
    cluster = rv.cluster_vars(m)
    assert cluster["nvidia_driver_branch"] == "580"
    assert cluster["nvidia_driver_open_kernel_modules"] is True  # 560+ default
    assert cluster["nvidia_driver_allow_reboot"] is False
    assert "cuda_versions" not in cluster  # per node: the default toolkit depends on the OS
    assert cluster["nccl_version"] == "2.21.5"
    assert cluster["nccl_pip_index_url"] == "https://pypi.org/simple"
    assert cluster["docker_data_root"] == "/scratch/docker"
    assert cluster["docker_users"] == ["ops"]
    assert cluster["docker_address_pools"] == [{"base": "172.31.0.0/16", "size": 24}]
    assert cluster["docker_log_max_file"] == 5

    gpu01 = rv.node_vars(m, m.node("gpu01"))
    assert gpu01 == {
        "nvidia_driver_source": "ubuntu-signed",
        "nvidia_driver_nvswitch": False,
        "nvidia_driver_gpu_count": 2,
        "cuda_versions": ["12.4"],
        "cuda_default": "12.4",
        "cuda_source": "cuda-repo",
        "nccl_source": "apt",
        "nccl_cuda_version": "12.4",
        "docker_source": "docker-ce",
        "docker_nvidia_runtime": True,
        "docker_nvidia_runtime_default": False,
    }
    # the head has no GPU and is not a docker node (docker.nodes defaults to @compute)
    assert rv.node_vars(m, m.node("head01")) == {}


def test_nccl_env_on_a_roce_gpu_node_only(kit: Any) -> None:
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "gid_index": 1, "traffic_class": 106}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "eth2", "rdma_device": "rxe0"}
    data["nodes"][0]["interfaces"]["roce"] = {"ip": "10.0.4.10", "interface": "eth2"}
    m = kit.load(data).manifest
    assert rv.node_vars(m, m.node("node01"))["nccl_env"] == {
        "NCCL_IB_HCA": "=rxe0", "NCCL_IB_GID_INDEX": "1", "NCCL_IB_TC": "106"}
    assert "nccl_env" not in rv.node_vars(m, m.node("head01"))  # no GPU, no NCCL
    assert "nccl_env" not in rv.node_vars(kit.load(kit.base()).manifest, m.node("node01"))  # no fabric


def test_music_lab(kit: Any) -> None:
    m = _load(kit, kit.example("music-lab.yaml"))
    cluster = rv.cluster_vars(m)
    assert cluster["nvidia_driver_branch"] == "580"
    assert cluster["nvidia_driver_open_kernel_modules"] is True  # 560+ default
    assert cluster["nccl_pip_index_url"] == "http://mirror.lab.example.org/pypi/simple"
    assert cluster["docker_users"] == ["alice"]
    node = rv.node_vars(m, m.node("gpu2"))
    assert node["cuda_versions"] == ["12.8"] and node["cuda_default"] == "12.8"
    assert node["nvidia_driver_source"] == "ubuntu-signed"
    assert node["nccl_cuda_version"] == "12.8"
    assert node["docker_source"] == "docker-ce"
    assert rv.node_vars(m, m.node("store1")) == {}
    assert rv.docker_nodes(m) == ["gpu1", "gpu2", "gpu3"]


@pytest.mark.parametrize("example", ["llm-200k.yaml", "music-lab.yaml"])
def test_emits_exactly_declared_variables(kit: Any, example: str) -> None:
    m = _load(kit, kit.example(example))
    declared = _all_declared()
    emitted = set(rv.cluster_vars(m))
    for node in m.nodes:
        emitted |= set(rv.node_vars(m, node))
    assert emitted <= set(declared), emitted - set(declared)
    for key in emitted:
        role = next(r for r in ROLES if key.startswith(r + "_"))
        assert key in _declared(role), f"{key} is not declared by role {role}"


@pytest.mark.parametrize("role", ROLES)
def test_every_declared_variable_has_a_default(role: str) -> None:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    assert set(_declared(role)) == set(defaults)


# --------------------------------------------------------------------------- Debian nodes
def _debian(kit: Any, software: dict[str, Any] | None = None, gpu: dict[str, Any] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    for node in data["nodes"]:
        node["os"] = "debian-12"
    if gpu is not None:
        data["nodes"][1]["hardware"]["gpu"] = gpu
    if software is not None:
        data["software"] = software
    return data


DEBIAN_OK = {"nvidia_driver": {"branch": "535"}, "cuda": {"versions": ["11.8"]}, "nccl": {"version": "2.21.5"}}


def test_debian_gpu_node(kit: Any) -> None:
    m = _load(kit, _debian(kit, DEBIAN_OK))
    node = rv.node_vars(m, m.node("node01"))
    assert node["nvidia_driver_source"] == "debian"
    assert node["cuda_source"] == "debian"
    assert node["nccl_source"] == "pypi"
    assert node["nccl_cuda_version"] == "11.8"  # -> nvidia-nccl-cu11
    assert node["docker_source"] == "distro"
    assert node["nvidia_driver_gpu_count"] == 2


@pytest.mark.parametrize(
    ("software", "message"),
    [
        ({}, "Debian 12 ships driver branch 535 only"),  # the default branch (580) is Ubuntu's and NVIDIA's
        ({"nvidia_driver": {"branch": "535"}, "cuda": {"versions": ["12.4"]}},
         "CUDA 12.4 from Debian: Debian 12 ships CUDA 11.8 only"),
        ({"nvidia_driver": {"branch": "535"}, "cuda": {"versions": ["12.8"]}}, "Debian 12 ships CUDA 11.8"),
        ({"nvidia_driver": {"branch": "535", "source": "ubuntu-signed"}}, "exists only on Ubuntu"),
        ({"nvidia_driver": {"branch": "550"}, "cuda": {"versions": ["11.8"]}}, "ships driver branch 535 only"),
        ({**DEBIAN_OK, "nccl": {"version": "2.26.2"}}, "NCCL 2.26.2 has no PyPI wheel for CUDA 11"),
        ({**DEBIAN_OK, "nvidia_driver": {"branch": "999"}}, "unknown NVIDIA driver branch"),
    ],
)
def test_debian_unsupported_combinations(kit: Any, software: dict[str, Any], message: str) -> None:
    data = _debian(kit, software)
    m = _unchecked(data)
    with pytest.raises(GpuStackError, match=message):
        rv.node_vars(m, m.node("node01"))
    # `provision validate` reports it at software (check_software -> stack_errors)
    diag = kit.error(data, message.split(":")[0])
    assert "node01 (debian-12)" in diag.message


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04", "debian-12"])
def test_defaults_are_valid_on_every_os(kit: Any, os_name: str) -> None:
    """A manifest that names only what its OS forces (Debian: branch 535) gets a toolkit and
    NCCL that exist there: the ubuntu2404 repository has no CUDA 12.4, Debian only 11.8."""
    data = kit.base()
    for node in data["nodes"]:
        node["os"] = os_name
    data["software"] = {"nvidia_driver": {"branch": "535"}} if os_name == "debian-12" else {}
    m = _load(kit, data)
    node = rv.node_vars(m, m.node("node01"))
    assert node["cuda_versions"] == ["11.8" if os_name == "debian-12" else "12.8"]
    assert node["nccl_cuda_version"] in ("11.8", "12.5")


def test_cuda_auto_follows_a_cuda_repo_driver_on_debian(kit: Any) -> None:
    software = {"nvidia_driver": {"branch": "580", "source": "cuda-repo"}, "cuda": {"versions": ["12.8"]}}
    m = _load(kit, _debian(kit, software))
    node = rv.node_vars(m, m.node("node01"))
    assert node["cuda_source"] == "cuda-repo" and node["cuda_versions"] == ["12.8"]
    assert rv.node_vars(_load(kit, _debian(kit, {"nvidia_driver": {"source": "cuda-repo"}})),
                        m.node("node01"))["cuda_versions"] == ["12.8"]


def test_every_gpu_stack_problem_of_a_node_is_reported(kit: Any) -> None:
    software = {"nvidia_driver": {"branch": "550"}, "cuda": {"versions": ["12.4"]}, "nccl": {"version": "2.12.12"}}
    data = _debian(kit, software)
    problems = [msg for name, msg in rv.stack_errors(_unchecked(data)) if name == "node01"]
    assert len(problems) == 3, problems
    assert "ships driver branch 535 only" in problems[0]
    assert "Debian 12 ships CUDA 11.8 only" in problems[1]
    assert "NCCL 2.12.12 has no PyPI wheel" in problems[2]
    with pytest.raises(Exception) as err:
        kit.load(data)
    messages = [d.message for d in err.value.diagnostics]  # type: ignore[attr-defined]
    assert sum("node01 (debian-12)" in msg for msg in messages) == 3


def test_debian_with_nvidia_repositories(kit: Any) -> None:
    software = {"nvidia_driver": {"branch": "570", "source": "cuda-repo"},
                "cuda": {"versions": ["12.8"], "source": "cuda-repo"}, "nccl": {"version": "2.26.2", "source": "apt"}}
    m = _load(kit, _debian(kit, software))
    node = rv.node_vars(m, m.node("node01"))
    assert node["nvidia_driver_source"] == "cuda-repo"
    assert node["nccl_source"] == "apt" and node["nccl_cuda_version"] == "12.8"


def test_nvswitch_from_an_8_gpu_sxm_board(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["gpu"] = {"model": "H100 SXM5 80GB", "count": 8}
    data["software"] = {"nvidia_driver": {"branch": "580"}, "cuda": {"versions": ["12.8"]},
                        "nccl": {"version": "2.26.2"}}
    m = _load(kit, data)
    node = rv.node_vars(m, m.node("node02"))
    assert node["nvidia_driver_nvswitch"] is True
    assert node["nvidia_driver_gpu_count"] == 8


def test_blackwell_needs_open_modules(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["gpu"] = {"model": "NVIDIA B200", "count": 8, "nvswitch": True}
    data["software"] = {"nvidia_driver": {"branch": "580", "open_kernel_modules": False},
                        "cuda": {"versions": ["12.8"]}, "nccl": {"version": "2.26.2"}}
    m = _unchecked(data)
    with pytest.raises(GpuStackError, match="only with the open kernel modules"):
        rv.node_vars(m, m.node("node01"))
    assert "only with the open kernel modules" in kit.error(data, "open kernel modules").message


def test_docker_settings(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"nodes": ["node02"], "source": "distro", "nvidia_runtime_default": True,
                      "address_pools": [{"base": "172.30.0.0/16", "size": 26}], "log_max_size": "10m"}
    m = _load(kit, data)
    assert rv.node_vars(m, m.node("node01")).get("docker_source") is None
    node = rv.node_vars(m, m.node("node02"))
    assert node["docker_source"] == "distro"
    assert node["docker_nvidia_runtime"] is True
    assert node["docker_nvidia_runtime_default"] is True
    cluster = rv.cluster_vars(m)
    assert cluster["docker_address_pools"] == [{"base": "172.30.0.0/16", "size": 26}]
    assert cluster["docker_log_max_size"] == "10m"


def test_docker_node_without_gpu_gets_no_nvidia_runtime(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"nodes": ["head01"]}
    m = _load(kit, data)
    node = rv.node_vars(m, m.node("head01"))
    assert node == {"docker_source": "docker-ce", "docker_nvidia_runtime": False,
                    "docker_nvidia_runtime_default": False}


def test_docker_disabled(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"enabled": False}
    m = _load(kit, data)
    assert rv.docker_nodes(m) == []
    assert "docker_source" not in rv.node_vars(m, m.node("node01"))


def test_stack_errors_lists_every_bad_node(kit: Any) -> None:
    m = _unchecked(_debian(kit, {"nvidia_driver": {"branch": "535"}, "cuda": {"versions": ["12.4"]}}))
    problems = rv.stack_errors(m)
    assert [name for name, _ in problems] == ["node01", "node02"]
    assert all("Debian 12 ships CUDA 11.8 only" in msg for _, msg in problems)
    assert rv.stack_errors(_load(kit, kit.example("llm-200k.yaml"))) == []


def test_stack_errors_leaves_bad_selectors_to_check_docker(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"nodes": ["ghost"]}
    assert rv.stack_errors(_unchecked(data)) == []
    assert "unknown node 'ghost'" in kit.error(data, "ghost").message
