"""GPU software stack: per-OS package and version resolution (pure, no I/O).

Given a node's OS and the manifest's ``software`` / ``docker`` sections, say exactly what the
``nvidia_driver``, ``cuda``, ``nccl``, ``docker`` and ``nvidia_container_toolkit`` roles
install: package names, version pins, holds, repositories and install prefixes. Unsupported
combinations raise :class:`GpuStackError` with a message that says what to change.

The decisions live by concern beside this module, which gathers them for the area's callers
(``decide.X``): ``tables`` (the OS releases and the vendors' tables, data in
``versions.yaml`` with each source and the date it was last checked), ``driver``, ``cuda``,
``nccl``, ``docker``.

The roles compute the same package names from ``roles/<role>/vars/*.yml`` (so each role works
on its own); ``tests/areas/gpu/test_decide.py`` renders those files and checks that they agree
with the functions here for every OS and source.
"""

from __future__ import annotations

from provisioner.areas.gpu.cuda import CudaPlan, cuda_problems, default_cuda_versions, resolve_cuda, resolve_cuda_source
from provisioner.areas.gpu.docker import DockerPlan, resolve_docker
from provisioner.areas.gpu.driver import (
    DEFAULT_KERNEL_FLAVOUR,
    GA_KERNEL,
    KERNEL_ABI_RE,
    OPEN_ONLY_MIN_BRANCH,
    DriverPlan,
    branch_problems,
    default_open_modules,
    driver_problems,
    fabricmanager_pin,
    has_nvswitch,
    kernel_flavour,
    kernel_metas,
    kernel_module_package,
    needs_open_modules,
    resolve_driver,
)
from provisioner.areas.gpu.nccl import (
    NcclPlan,
    nccl_apt_version,
    nccl_base_version,
    nccl_wheel,
    pick_nccl_build,
    resolve_nccl,
)
from provisioner.areas.gpu.tables import (
    AUTO_SOURCES,
    CUDA_DEFAULTS,
    CUDA_MIN_BRANCH,
    CUDA_REPO_BRANCHES,
    CUDA_REPO_DIST,
    CUDA_REPO_RENAMED_FROM,
    CUDA_REPO_URL,
    CUDA_REPO_VERSIONS,
    CUDA_SOURCES,
    DEBIAN_CUDA_VERSION,
    DEBIAN_DRIVER_BRANCH,
    DOCKER_CE_PACKAGES,
    DOCKER_DISTRO_PACKAGES,
    DOCKER_REPO,
    DOCKER_SOURCES,
    DRIVER_SOURCES,
    KNOWN_BRANCHES,
    NCCL_APT_BUILDS,
    NCCL_PREFIX_ROOT,
    NCCL_SOURCES,
    NCCL_WHEEL_RANGE,
    OPEN_MODULES_DEFAULT_FROM,
    OPEN_MODULES_MIN_BRANCH,
    OS_NAMES,
    TABLE_SOURCES,
    UBUNTU_NEWER_RELEASES_ONLY,
    UBUNTU_SERVER_BRANCHES,
    UBUNTU_SERVER_MODULES,
    UBUNTU_TRANSITIONAL,
    VERSIONS_FILE,
    GpuStackError,
    OsName,
    check_os,
    cuda_major,
    load_versions,
    resolve_source,
    version_tuple,
)

__all__ = [
    "AUTO_SOURCES", "CUDA_DEFAULTS", "CUDA_MIN_BRANCH", "CUDA_REPO_BRANCHES", "CUDA_REPO_DIST",
    "CUDA_REPO_RENAMED_FROM", "CUDA_REPO_URL", "CUDA_REPO_VERSIONS", "CUDA_SOURCES", "DEBIAN_CUDA_VERSION",
    "DEBIAN_DRIVER_BRANCH", "DEFAULT_KERNEL_FLAVOUR", "DOCKER_CE_PACKAGES", "DOCKER_DISTRO_PACKAGES",
    "DOCKER_REPO", "DOCKER_SOURCES", "DRIVER_SOURCES", "GA_KERNEL", "KERNEL_ABI_RE", "KNOWN_BRANCHES",
    "NCCL_APT_BUILDS", "NCCL_PREFIX_ROOT", "NCCL_SOURCES", "NCCL_WHEEL_RANGE", "OPEN_MODULES_DEFAULT_FROM",
    "OPEN_MODULES_MIN_BRANCH", "OPEN_ONLY_MIN_BRANCH", "OS_NAMES", "TABLE_SOURCES", "UBUNTU_NEWER_RELEASES_ONLY",
    "UBUNTU_SERVER_BRANCHES", "UBUNTU_SERVER_MODULES", "UBUNTU_TRANSITIONAL", "VERSIONS_FILE", "CudaPlan",
    "DockerPlan", "DriverPlan", "GpuStackError", "NcclPlan", "OsName", "branch_problems", "check_os", "cuda_major",
    "cuda_problems", "default_cuda_versions", "default_open_modules", "driver_problems", "fabricmanager_pin",
    "has_nvswitch", "kernel_flavour", "kernel_metas", "kernel_module_package", "load_versions", "nccl_apt_version",
    "nccl_base_version", "nccl_wheel", "needs_open_modules", "pick_nccl_build", "resolve_cuda",
    "resolve_cuda_source", "resolve_docker", "resolve_driver", "resolve_nccl", "resolve_source", "version_tuple",
]
