"""Variables for the GPU stack roles: nvidia_driver, cuda, nccl, docker, nvidia_container_toolkit.

Cluster-wide choices (versions, daemon.json settings) go to group_vars/all; what depends on
the node (its OS picks the sources, its hardware the GPU count and NVSwitch, docker.nodes
the Docker settings) goes to host_vars. Every GPU node's combination is resolved through
:mod:`provisioner.areas.gpu.decide`, so an unsupported one fails here with a GpuStackError,
before Ansible runs.
"""

from __future__ import annotations

import functools
from typing import Any

from provisioner.areas.fabric import decide as fabric
from provisioner.areas.gpu import decide as gpu
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import SelectorError, select_nodes, selects

DEFAULT_PIP_INDEX = "https://pypi.org/simple"


def docker_nodes(m: Manifest) -> list[str]:
    """Names of the nodes docker.nodes selects (empty when Docker is disabled)."""
    return select_nodes(m, m.docker.nodes) if m.docker.enabled else []


def groups(m: Manifest) -> dict[str, set[str]]:
    """The GPU area's inventory groups -> members: GPU nodes, and the nodes Docker runs on."""
    return {"gpu": {n.name for n in m.nodes if n.hardware.gpu is not None}, "docker": set(docker_nodes(m))}


def cluster_vars(m: Manifest) -> dict[str, Any]:
    sw = m.software
    drv = sw.nvidia_driver
    open_modules = gpu.default_open_modules(drv.branch) if drv.open_kernel_modules is None else drv.open_kernel_modules
    docker = m.docker
    nets = [n.cidr for _, n in m.networks.defined()]
    for pool in docker.address_pools:
        for net in nets:
            if pool.base.overlaps(net):
                raise gpu.GpuStackError(f"docker address pool {pool.base} collides with network {net}")
    return {
        "nvidia_driver_branch": drv.branch,
        "nvidia_driver_open_kernel_modules": open_modules,
        "nvidia_driver_allow_reboot": m.cluster.allow_reboot,
        "cuda_cudnn": sw.cuda.cudnn,
        "nccl_version": sw.nccl.version,
        "nccl_pip_index_url": m.cluster.mirrors.pip or DEFAULT_PIP_INDEX,
        "docker_data_root": docker.data_root,
        "docker_log_max_size": docker.log_max_size,
        "docker_log_max_file": docker.log_max_file,
        "docker_live_restore": docker.live_restore,
        "docker_address_pools": [{"base": str(p.base), "size": p.size} for p in docker.address_pools],
        "docker_users": list(docker.users),
    }


@functools.lru_cache(maxsize=256)
def _gpu_stack(
    os_name: str, model: str, count: int, nvswitch_flag: bool, branch: str, driver_source: str,
    open_modules: bool | None, cuda_versions: tuple[str, ...] | None, cuda_default: str | None, cuda_source: str,
    cudnn: bool, nccl_version: str, nccl_source: str,
) -> tuple[tuple[str, Any], ...]:
    """The GPU stack of one combination of OS, GPU and software (pure, so resolved once per
    combination: the nodes of a large cluster share a few)."""
    nvswitch = gpu.has_nvswitch(model, count, nvswitch_flag)
    driver = gpu.resolve_driver(os_name, branch, driver_source, open_modules, nvswitch=nvswitch, gpu_model=model)
    cuda = gpu.resolve_cuda(os_name, cuda_versions, cuda_default, cuda_source, cudnn,
                            driver_branch=driver.branch, driver_source=driver.source)
    nccl = gpu.resolve_nccl(os_name, nccl_version, nccl_source, cuda_version=cuda.default)
    return (
        ("nvidia_driver_source", driver.source),
        ("nvidia_driver_nvswitch", nvswitch),
        ("nvidia_driver_gpu_count", count),
        ("cuda_versions", list(cuda.versions)),
        ("cuda_default", cuda.default),
        ("cuda_source", cuda.source),
        ("nccl_source", nccl.source),
        ("nccl_cuda_version", nccl.cuda_version),
    )


def _gpu_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    hw = node.hardware.gpu
    if hw is None:
        return {}
    sw = m.software
    drv = sw.nvidia_driver
    return dict(_gpu_stack(
        node.os, hw.model, hw.count, hw.nvswitch, drv.branch, drv.source, drv.open_kernel_modules,
        None if sw.cuda.versions is None else tuple(sw.cuda.versions), sw.cuda.default, sw.cuda.source,
        sw.cuda.cudnn, sw.nccl.version, sw.nccl.source,
    ))


def _docker_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    if not (m.docker.enabled and selects(m, m.docker.nodes, node.name)):
        return {}
    plan = gpu.resolve_docker(node.os, m.docker.source)
    runtime = m.docker.nvidia_runtime and node.hardware.gpu is not None
    return {
        "docker_source": plan.source,
        "docker_nvidia_runtime": runtime,
        "docker_nvidia_runtime_default": runtime and m.docker.nvidia_runtime_default,
    }


def stack_problems(m: Manifest, node: Node, docker_node: bool) -> list[str]:
    """Every reason the node's GPU stack (driver, CUDA, NCCL) or Docker cannot be installed,
    one sentence each: the driver, toolkit and NCCL are checked on their own, so one
    validate run names all of them."""
    sw = m.software
    drv = sw.nvidia_driver
    out: list[str] = []
    hw = node.hardware.gpu
    if hw is not None:
        nvswitch = gpu.has_nvswitch(hw.model, hw.count, hw.nvswitch)
        out += gpu.driver_problems(node.os, drv.branch, drv.source, drv.open_kernel_modules,
                                   nvswitch=nvswitch, gpu_model=hw.model)
        driver_source = gpu.resolve_source(node.os, "driver", drv.source)
        cuda_problems = gpu.cuda_problems(node.os, sw.cuda.versions, sw.cuda.default, sw.cuda.source,
                                          sw.cuda.cudnn, driver_branch=drv.branch, driver_source=driver_source)
        out += cuda_problems
        try:
            versions = sw.cuda.versions or gpu.default_cuda_versions(node.os, sw.cuda.source, driver_source)
            gpu.resolve_nccl(node.os, sw.nccl.version, sw.nccl.source, cuda_version=sw.cuda.default or versions[-1])
        except gpu.GpuStackError as exc:
            if str(exc) not in cuda_problems:
                out.append(str(exc))
    if docker_node:
        try:
            gpu.resolve_docker(node.os, m.docker.source)
        except gpu.GpuStackError as exc:
            out.append(str(exc))
    return out


def stack_errors(m: Manifest) -> list[tuple[str, str]]:
    """(node, message) for every problem of every node's GPU stack or Docker combination.

    For `provision validate` (a manifest check can position these at ``software``); the
    inventory generator raises them as a GpuStackError through :func:`node_vars`.
    """
    try:
        selected = set(docker_nodes(m))
    except SelectorError:
        selected = set()  # a bad docker.nodes selector is check_docker's to report
    return [(node.name, problem) for node in m.nodes for problem in stack_problems(m, node, node.name in selected)]


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    out = _gpu_node_vars(m, node) | _docker_node_vars(m, node)
    env = fabric.nccl_env(m, node) if node.hardware.gpu is not None else {}
    if env:  # only then: a node without it keeps the fingerprint it had before nccl_env existed
        out["nccl_env"] = env
    return out
