"""The GPU stack's facts and their shared helpers: the OS releases, the vendors' tables
(driver branches, CUDA versions and NCCL builds per repository, defaults) read from
``versions.yaml`` next to this module, each with its source and the date it was last checked
(listed in docs/roles/gpu.md), and the sources each component may come from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from provisioner.platforms import OS_NAMES, PLATFORMS, Family, OsName

__all__ = ["OS_NAMES", "OsName"]  # the GPU stack's modules import them from here


class GpuStackError(ValueError):
    """An unknown version or an unsupported OS/source/version combination."""


# --------------------------------------------------------------------------- tables
# What the vendors' repositories hold is data: versions.yaml next to this module, each table
# with its source and the date it was last checked (listed in docs/roles/gpu.md).
VERSIONS_FILE = "versions.yaml"


def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise RuntimeError(f"{VERSIONS_FILE}: {key} is not a mapping")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RuntimeError(f"{VERSIONS_FILE}: {where} is not a list of strings")
    return tuple(value)


def _by_os(table: Mapping[str, Any], where: str) -> dict[OsName, Any]:
    missing = [os_ for os_ in OS_NAMES if os_ not in table]
    if missing:
        raise RuntimeError(f"{VERSIONS_FILE}: {where} lacks {', '.join(missing)}")
    return {os_: table[os_] for os_ in OS_NAMES}


def load_versions(text: str | None = None) -> dict[str, Any]:
    """The parsed tables (``text``: another versions.yaml, for tests)."""
    if text is None:
        text = resources.files(__package__ or "provisioner.areas.gpu").joinpath(VERSIONS_FILE).read_text("utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise RuntimeError(f"{VERSIONS_FILE} is not a mapping")
    return data


_DATA = load_versions()
_DRIVER = _table(_DATA, "driver_branches")
_CUDA_REPO_DRIVER = _table(_DATA, "cuda_repo_driver_branches")
_DEBIAN = _table(_DATA, "debian")

#: Table name -> (source, last checked), for the docs.
TABLE_SOURCES: dict[str, tuple[str, str]] = {
    name: (str(_table(_DATA, name)["source"]), str(_table(_DATA, name)["checked"]))
    for name in _DATA
    if isinstance(_DATA[name], Mapping) and "source" in _DATA[name]
}

#: Canonical's signed precompiled "-server" modules on Ubuntu 22.04/24.04: branch -> the
#: module flavours published (False: proprietary, True: open).
UBUNTU_SERVER_MODULES: dict[str, frozenset[bool]] = {
    str(b): frozenset(bool(x) for x in spec["open"]) for b, spec in _table(_DRIVER, "ubuntu_server").items()
}
UBUNTU_SERVER_BRANCHES: frozenset[str] = frozenset(UBUNTU_SERVER_MODULES)
#: Ubuntu branches whose packages are transitional: branch -> the branch they install.
UBUNTU_TRANSITIONAL: dict[str, str] = {str(k): str(v) for k, v in _table(_DRIVER, "ubuntu_transitional").items()}
UBUNTU_NEWER_RELEASES_ONLY: frozenset[str] = frozenset(
    _strings(_DRIVER["ubuntu_newer_releases_only"], "ubuntu_newer_releases_only"))
#: Branches NVIDIA's CUDA repository offers under the names the nvidia_driver role installs.
CUDA_REPO_BRANCHES: tuple[str, ...] = _strings(_CUDA_REPO_DRIVER["branches"], "cuda_repo_driver_branches")
CUDA_REPO_RENAMED_FROM = int(str(_CUDA_REPO_DRIVER["renamed_from"]))
#: Debian 12 (bookworm, non-free) ships one driver branch and one CUDA toolkit.
DEBIAN_DRIVER_BRANCH = str(_DEBIAN["driver_branch"])
DEBIAN_CUDA_VERSION = str(_DEBIAN["cuda_version"])
#: Every branch the tables say something about.
KNOWN_BRANCHES: tuple[str, ...] = tuple(sorted(
    {*UBUNTU_SERVER_BRANCHES, *UBUNTU_TRANSITIONAL, *UBUNTU_NEWER_RELEASES_ONLY, *CUDA_REPO_BRANCHES,
     DEBIAN_DRIVER_BRANCH}, key=int))
#: Open GPU kernel modules exist from branch 515 and are NVIDIA's default from 560.
OPEN_MODULES_MIN_BRANCH = 515
OPEN_MODULES_DEFAULT_FROM = 560

DRIVER_SOURCES = ("ubuntu-signed", "cuda-repo", "debian")
CUDA_SOURCES = ("cuda-repo", "debian")
NCCL_SOURCES = ("apt", "pypi")
DOCKER_SOURCES = ("docker-ce", "distro")

#: What "auto" means per family, per component (CUDA's "auto" also follows a cuda-repo driver).
_AUTO_BY_FAMILY: dict[Family, dict[str, str]] = {
    "ubuntu": {"driver": "ubuntu-signed", "cuda": "cuda-repo", "nccl": "apt", "docker": "docker-ce"},
    "debian": {"driver": "debian", "cuda": "debian", "nccl": "pypi", "docker": "distro"},
}
AUTO_SOURCES: dict[OsName, dict[str, str]] = {name: _AUTO_BY_FAMILY[p.family] for name, p in PLATFORMS.items()}

#: Directory of NVIDIA's CUDA network repository per OS (developer.download.nvidia.com): the
#: family and the version without its dot, ``ubuntu2204``, ``debian12``.
CUDA_REPO_DIST: dict[OsName, str] = {name: f"{p.family}{p.version.replace('.', '')}" for name, p in PLATFORMS.items()}
CUDA_REPO_URL = "https://developer.download.nvidia.com/compute/cuda/repos/{dist}/x86_64/"

#: CUDA toolkit versions (cuda-toolkit-X-Y) in NVIDIA's repository per OS.
CUDA_REPO_VERSIONS: dict[OsName, tuple[str, ...]] = {
    os_: _strings(v, f"cuda_repo_versions.{os_}")
    for os_, v in _by_os(_table(_DATA, "cuda_repo_versions"), "cuda_repo_versions").items()
}
#: The toolkit a manifest without cuda.versions gets, per OS and CUDA source.
CUDA_DEFAULTS: dict[OsName, dict[str, str]] = {
    os_: {str(k): str(v) for k, v in dict(v).items()}
    for os_, v in _by_os(_table(_DATA, "cuda_defaults"), "cuda_defaults").items()
}

#: Oldest driver branch that runs a CUDA major (minor-version compatibility).
CUDA_MIN_BRANCH: dict[int, int] = {11: 450, 12: 525, 13: 580}

#: NCCL builds in NVIDIA's apt repository, per OS (repository): NCCL version -> the CUDA X.Y
#: builds of it (libnccl2=<ver>-1+cuda<X.Y>).
NCCL_APT_BUILDS: dict[OsName, dict[str, tuple[str, ...]]] = {
    os_: {str(ver): _strings(builds, f"nccl_apt_builds.{os_}.{ver}") for ver, builds in dict(v).items()}
    for os_, v in _by_os(_table(_DATA, "nccl_apt_builds"), "nccl_apt_builds").items()
}


def _dotted(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


#: PyPI wheels nvidia-nccl-cu<major>: (oldest, newest or None for "still published").
NCCL_WHEEL_RANGE: dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]] = {
    int(major): (_dotted(str(span[0])), _dotted(str(span[1])) if span[1] else None)
    for major, span in _table(_DATA, "nccl_wheels").items()
    if major not in ("source", "checked")
}
NCCL_PREFIX_ROOT = "/opt/nccl"

DOCKER_CE_PACKAGES = ("docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-compose-plugin")
DOCKER_DISTRO_PACKAGES = ("docker.io",)
#: Docker's repository per OS (URL, suite): one per family, the release's own suite.
DOCKER_REPO: dict[OsName, tuple[str, str]] = {
    name: (f"https://download.docker.com/linux/{p.family}", p.codename) for name, p in PLATFORMS.items()}

#: GPUs that only run with the open kernel modules (Blackwell) and their first branch.


# --------------------------------------------------------------------------- helpers
def check_os(os_name: str) -> OsName:
    for known in OS_NAMES:
        if os_name == known:
            return known
    raise GpuStackError(f"unsupported OS {os_name!r}; supported: {', '.join(OS_NAMES)}")


def resolve_source(os_name: str, component: str, source: str) -> str:
    """``auto`` -> the per-OS default for ``component`` (driver, cuda, nccl, docker)."""
    os_ = check_os(os_name)
    if source != "auto":
        return source
    return AUTO_SOURCES[os_][component]


def version_tuple(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise GpuStackError(f"{version!r} is not a dotted version number")
    return tuple(int(x) for x in version.split("."))


def cuda_major(version: str) -> int:
    return version_tuple(version)[0]
