"""GPU software stack: per-OS package and version resolution (pure, no I/O).

Given a node's OS and the manifest's ``software`` / ``docker`` sections, say exactly what the
``nvidia_driver``, ``cuda``, ``nccl``, ``docker`` and ``nvidia_container_toolkit`` roles
install: package names, version pins, holds, repositories and install prefixes. Unsupported
combinations raise :class:`GpuStackError` with a message that says what to change.

The roles compute the same package names from ``roles/<role>/vars/*.yml`` (so each role works
on its own); ``tests/areas/gpu/test_decide.py`` renders those files and checks that they agree
with the functions here for every OS and source.

The tables (driver branches, CUDA versions and NCCL builds per repository, defaults) are data
in ``versions.yaml``, each with its source and the date it was last checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

OsName = Literal["ubuntu-22.04", "ubuntu-24.04", "debian-12"]
OS_NAMES: tuple[OsName, ...] = ("ubuntu-22.04", "ubuntu-24.04", "debian-12")


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

#: What "auto" means per OS, per component (CUDA's "auto" also follows a cuda-repo driver).
AUTO_SOURCES: dict[OsName, dict[str, str]] = {
    "ubuntu-22.04": {"driver": "ubuntu-signed", "cuda": "cuda-repo", "nccl": "apt", "docker": "docker-ce"},
    "ubuntu-24.04": {"driver": "ubuntu-signed", "cuda": "cuda-repo", "nccl": "apt", "docker": "docker-ce"},
    "debian-12": {"driver": "debian", "cuda": "debian", "nccl": "pypi", "docker": "distro"},
}

#: Directory of NVIDIA's CUDA network repository per OS (developer.download.nvidia.com).
CUDA_REPO_DIST: dict[OsName, str] = {
    "ubuntu-22.04": "ubuntu2204",
    "ubuntu-24.04": "ubuntu2404",
    "debian-12": "debian12",
}
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
DOCKER_REPO: dict[OsName, tuple[str, str]] = {  # (URL, suite)
    "ubuntu-22.04": ("https://download.docker.com/linux/ubuntu", "jammy"),
    "ubuntu-24.04": ("https://download.docker.com/linux/ubuntu", "noble"),
    "debian-12": ("https://download.docker.com/linux/debian", "bookworm"),
}

#: GPUs that only run with the open kernel modules (Blackwell) and their first branch.
_OPEN_ONLY_GPU = re.compile(r"\b(B100|B200|B300|GB200|GB300|RTX\s*50\d0|RTX\s+PRO\s+\d+\s+Blackwell|Blackwell)\b", re.I)
OPEN_ONLY_MIN_BRANCH = 570
#: 8-GPU SXM/HGX baseboards carry NVSwitches (4-GPU boards use direct NVLink).
_SXM_BOARD = re.compile(r"\b(SXM\d?|HGX|DGX)\b", re.I)


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class DriverPlan:
    os: OsName
    branch: str
    source: str
    open_kernel_modules: bool
    packages: tuple[str, ...]
    """Full install (kernel modules + userspace) on a machine with a kernel and GPUs."""
    userspace_packages: tuple[str, ...]
    """Userspace only (containers, no GPU): nvidia-smi, libcuda, NVML, persistenced."""
    fabricmanager_packages: tuple[str, ...]
    """Installed on NVSwitch systems; empty otherwise."""
    pin_packages: tuple[str, ...]
    """Packages whose names carry no branch: apt-pinned to ``<branch>.*``."""
    unheld_packages: tuple[str, ...]
    """Installed with the driver but never held (kernel headers, firmware)."""
    uses_cuda_repo: bool
    kernel_packages: tuple[str, ...] = ()
    """Kernel meta packages that must be held together with the driver's (Canonical's
    precompiled modules exist per kernel ABI: a new kernel without the matching module
    package leaves the GPUs without a driver at the next boot). Empty for DKMS sources."""
    open_suffix: str = ""
    fabricmanager_pin: str = ""
    """apt preferences ``Pin:`` that takes the fabric manager from the driver's repository
    (with the CUDA repository configured too, its newer fabric manager would win)."""

    def install(self, kernel: bool) -> tuple[str, ...]:
        """What the role installs: full + userspace with a kernel and GPUs, else userspace;
        plus the fabric manager on NVSwitch systems."""
        wanted = (*self.packages, *self.userspace_packages) if kernel else self.userspace_packages
        return tuple(dict.fromkeys((*wanted, *self.fabricmanager_packages)))

    def holds(self, kernel: bool) -> tuple[str, ...]:
        """What the role holds: everything it installs except kernel headers and firmware,
        and with the kernel modules the kernel metas that must move with them (where they
        are installed)."""
        held = tuple(p for p in self.install(kernel) if p not in self.unheld_packages)
        return held + (self.kernel_packages if kernel else ())

    def for_kernel(self, release: str) -> str:
        """What the kernel ``release`` (the newest installed one: it boots next) needs for
        the NVIDIA module: Canonical's module package of its ABI, or its headers for DKMS."""
        return kernel_module_package(self.source, self.branch, self.open_suffix == "-open", release)


@dataclass(frozen=True)
class CudaPlan:
    os: OsName
    source: str
    versions: tuple[str, ...]
    default: str
    packages: tuple[str, ...]
    cudnn_packages: tuple[str, ...]
    prefixes: dict[str, str] = field(default_factory=dict)
    uses_cuda_repo: bool = False


@dataclass(frozen=True)
class NcclPlan:
    os: OsName
    source: str
    version: str
    cuda_version: str
    """The CUDA X.Y the NCCL build targets (apt) or whose major picks the wheel (pypi)."""
    packages: tuple[str, ...]
    """apt: ``libnccl2=<ver>-1+cuda<X.Y>`` and ``libnccl-dev=...``; pypi: empty."""
    wheel: str | None
    """pypi: ``nvidia-nccl-cu<major>==<ver>``; apt: None."""
    prefix: str
    uses_cuda_repo: bool


@dataclass(frozen=True)
class DockerPlan:
    os: OsName
    source: str
    packages: tuple[str, ...]
    repo_url: str | None
    repo_suite: str | None


# --------------------------------------------------------------------------- helpers
def _check_os(os_name: str) -> OsName:
    for known in OS_NAMES:
        if os_name == known:
            return known
    raise GpuStackError(f"unsupported OS {os_name!r}; supported: {', '.join(OS_NAMES)}")


def resolve_source(os_name: str, component: str, source: str) -> str:
    """``auto`` -> the per-OS default for ``component`` (driver, cuda, nccl, docker)."""
    os_ = _check_os(os_name)
    if source != "auto":
        return source
    return AUTO_SOURCES[os_][component]


def version_tuple(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(\.\d+)*", version):
        raise GpuStackError(f"{version!r} is not a dotted version number")
    return tuple(int(x) for x in version.split("."))


def cuda_major(version: str) -> int:
    return version_tuple(version)[0]


def nccl_base_version(version: str) -> str:
    """``2.21.5-1`` -> ``2.21.5`` (the wheel version; apt adds the package revision)."""
    return re.sub(r"-\d+$", "", version)


def nccl_apt_version(version: str, cuda_build: str) -> str:
    """``2.21.5`` + ``12.4`` -> ``2.21.5-1+cuda12.4`` (a given revision is kept)."""
    revision = version if re.search(r"-\d+$", version) else f"{version}-1"
    return f"{revision}+cuda{cuda_build}"


def default_open_modules(branch: str) -> bool:
    return int(branch) >= OPEN_MODULES_DEFAULT_FROM


def needs_open_modules(gpu_model: str | None) -> bool:
    """Blackwell-generation GPUs only work with the open kernel modules."""
    return bool(gpu_model and _OPEN_ONLY_GPU.search(gpu_model))


def has_nvswitch(gpu_model: str | None, gpu_count: int, nvswitch_flag: bool) -> bool:
    """NVSwitch systems: the manifest says so, or an 8-GPU SXM/HGX board."""
    if nvswitch_flag:
        return True
    return gpu_count == 8 and bool(gpu_model and _SXM_BOARD.search(gpu_model))


# --------------------------------------------------------------------------- driver
def branch_problems(os_name: OsName, branch: str, source: str, use_open: bool) -> list[str]:
    """Why ``source`` cannot install ``branch`` (the tables), one sentence each."""
    if branch not in KNOWN_BRANCHES:
        current = sorted(UBUNTU_SERVER_BRANCHES | set(CUDA_REPO_BRANCHES), key=int)
        return [f"unknown NVIDIA driver branch {branch!r}; known branches: {', '.join(current)}"]
    out: list[str] = []
    if source == "ubuntu-signed":
        servers = ", ".join(sorted(UBUNTU_SERVER_BRANCHES, key=int))
        if branch in UBUNTU_TRANSITIONAL:
            target = UBUNTU_TRANSITIONAL[branch]
            out.append(
                f"Ubuntu's {branch}-server driver packages are transitional: they install branch {target}, "
                f"so branch {branch} cannot be kept; set nvidia_driver.branch: \"{target}\" "
                f"(current -server branches: {servers})")
        elif branch in UBUNTU_NEWER_RELEASES_ONLY:
            out.append(f"Ubuntu publishes the {branch}-server driver for newer releases only, not for {os_name}; "
                       f"use one of {servers}")
        elif branch not in UBUNTU_SERVER_BRANCHES:
            out.append(f"Ubuntu has no signed '-server' modules for branch {branch}; use one of {servers} "
                       "or source 'cuda-repo'")
        elif use_open not in UBUNTU_SERVER_MODULES[branch] and not (use_open and int(branch) < OPEN_MODULES_MIN_BRANCH):
            kind = "open" if use_open else "proprietary"
            other = "true" if not use_open else "false"
            out.append(f"Ubuntu publishes no {kind} kernel modules for the {branch}-server driver; "
                       f"set open_kernel_modules: {other}")
    elif source == "cuda-repo":
        if int(branch) >= CUDA_REPO_RENAMED_FROM:
            newest = max(CUDA_REPO_BRANCHES, key=int)
            out.append(
                f"from branch {CUDA_REPO_RENAMED_FROM} on NVIDIA's repository names its driver packages without "
                f"the branch (pinned with nvidia-driver-pinning-<branch>), which the nvidia_driver role does not "
                f"install yet; use branch {newest} from 'cuda-repo' or source 'ubuntu-signed'")
        elif branch not in CUDA_REPO_BRANCHES:
            out.append(f"NVIDIA's repository has no driver branch {branch}; use one of {', '.join(CUDA_REPO_BRANCHES)}")
    elif source == "debian" and branch != DEBIAN_DRIVER_BRANCH:
        out.append(f"Debian 12 ships driver branch {DEBIAN_DRIVER_BRANCH} only (asked for {branch}); "
                   "use source 'cuda-repo' for other branches")
    return out


def driver_problems(
    os_name: str,
    branch: str,
    source: str = "auto",
    open_kernel_modules: bool | None = None,
    *,
    nvswitch: bool = False,
    gpu_model: str | None = None,
) -> list[str]:
    """Every reason this driver cannot be installed, one sentence each (empty: it can)."""
    try:
        os_ = _check_os(os_name)
    except GpuStackError as exc:
        return [str(exc)]
    if not re.fullmatch(r"\d{3}", branch):
        return [f"{branch!r} is not a driver branch like 580"]
    src = resolve_source(os_, "driver", source)
    out: list[str] = []
    if src not in DRIVER_SOURCES:
        return [f"unknown driver source {src!r}; use auto, {', '.join(DRIVER_SOURCES)}"]
    source_fits = True
    if src == "ubuntu-signed" and not os_.startswith("ubuntu"):
        source_fits = False
        out.append(f"driver source 'ubuntu-signed' (Canonical's signed modules) exists only on Ubuntu, "
                   f"not on {os_}; use 'debian' or 'cuda-repo'")
    elif src == "debian" and os_ != "debian-12":
        source_fits = False
        out.append(f"driver source 'debian' is for Debian nodes, not {os_}; use 'ubuntu-signed' or 'cuda-repo'")
    use_open = default_open_modules(branch) if open_kernel_modules is None else open_kernel_modules
    if use_open and int(branch) < OPEN_MODULES_MIN_BRANCH:
        out.append(f"open kernel modules need branch {OPEN_MODULES_MIN_BRANCH} or newer "
                   f"(branch {branch} is proprietary only)")
    if needs_open_modules(gpu_model):
        if int(branch) < OPEN_ONLY_MIN_BRANCH:
            out.append(f"{gpu_model} needs driver branch {OPEN_ONLY_MIN_BRANCH} or newer (got {branch})")
        if not use_open:
            out.append(f"{gpu_model} runs only with the open kernel modules; set open_kernel_modules: true")
    if source_fits:  # the branch tables of a source that cannot serve this OS say nothing
        out += branch_problems(os_, branch, src, use_open)
    if src == "debian" and nvswitch:
        out.append("Debian does not package nvidia-fabricmanager (needed on NVSwitch systems); use source 'cuda-repo'")
    return list(dict.fromkeys(out))


def resolve_driver(
    os_name: str,
    branch: str,
    source: str = "auto",
    open_kernel_modules: bool | None = None,
    *,
    nvswitch: bool = False,
    gpu_model: str | None = None,
    kernel_flavour: str | None = None,
) -> DriverPlan:
    """What the nvidia_driver role installs and holds. ``kernel_flavour``: the flavour of the
    kernel meta packages (None: the OS's usual one, ``generic`` or ``amd64``)."""
    problems = driver_problems(os_name, branch, source, open_kernel_modules, nvswitch=nvswitch, gpu_model=gpu_model)
    if problems:
        raise GpuStackError("; ".join(problems))
    os_ = _check_os(os_name)
    src = resolve_source(os_, "driver", source)
    use_open = default_open_modules(branch) if open_kernel_modules is None else open_kernel_modules

    o = "-open" if use_open else ""
    b = branch
    flavour = kernel_flavour or DEFAULT_KERNEL_FLAVOUR[os_]
    packages: tuple[str, ...]
    userspace: tuple[str, ...]
    fabric: tuple[str, ...]
    pin: tuple[str, ...] = ()
    unheld: tuple[str, ...] = ()
    if src == "ubuntu-signed":
        packages = (
            f"linux-modules-nvidia-{b}-server{o}-{flavour}",
            f"nvidia-headless-no-dkms-{b}-server{o}",
            f"nvidia-utils-{b}-server",
        )
        userspace = (f"nvidia-utils-{b}-server", f"libnvidia-compute-{b}-server", f"nvidia-compute-utils-{b}-server")
        fabric = (f"nvidia-fabricmanager-{b}", f"libnvidia-nscq-{b}")
    elif src == "cuda-repo" and os_.startswith("ubuntu"):
        # DKMS: the headers meta of the kernel's flavour brings each new kernel's headers
        packages = (*((f"nvidia-kernel-open-{b}",) if use_open else ()), f"cuda-drivers-{b}",
                    f"linux-headers-{flavour}")
        userspace = (f"nvidia-utils-{b}", f"libnvidia-compute-{b}", f"nvidia-compute-utils-{b}")
        fabric = (f"nvidia-fabricmanager-{b}", f"libnvidia-nscq-{b}")
        unheld = (f"linux-headers-{flavour}",)
    elif src == "cuda-repo":  # Debian 12, NVIDIA's debian12 repository (Debian package names)
        kernel = "nvidia-kernel-open-dkms" if use_open else "nvidia-kernel-dkms"
        packages = (kernel, f"cuda-drivers-{b}", f"linux-headers-{flavour}")
        userspace = ("nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
        fabric = (f"nvidia-fabricmanager-{b}", f"libnvidia-nscq-{b}")
        pin = (kernel, *userspace)
        unheld = (f"linux-headers-{flavour}",)
    else:  # debian
        kernel = "nvidia-open-kernel-dkms" if use_open else "nvidia-kernel-dkms"
        packages = ("nvidia-driver", kernel, "firmware-misc-nonfree", f"linux-headers-{flavour}",
                    "nvidia-smi", "nvidia-persistenced")
        userspace = ("nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
        fabric = ()
        pin = ("nvidia-driver", kernel, "nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
        unheld = ("firmware-misc-nonfree", f"linux-headers-{flavour}")
    return DriverPlan(
        os=os_,
        branch=b,
        source=src,
        open_kernel_modules=use_open,
        packages=packages,
        userspace_packages=userspace,
        fabricmanager_packages=fabric if nvswitch else (),
        pin_packages=pin,
        unheld_packages=unheld,
        uses_cuda_repo=src == "cuda-repo",
        kernel_packages=kernel_metas(src, flavour),
        open_suffix=o,
        fabricmanager_pin=fabricmanager_pin(src, CUDA_REPO_URL.format(dist=CUDA_REPO_DIST[os_])) if fabric else "",
    )


def fabricmanager_pin(source: str, cuda_repo_url: str) -> str:
    """Where the fabric manager must come from: the driver's repository (Ubuntu's archive for
    ``ubuntu-signed``, NVIDIA's CUDA repository, or its mirror, for ``cuda-repo``)."""
    if source == "ubuntu-signed":
        return "release o=Ubuntu"
    return f"origin {urlsplit(cuda_repo_url).hostname}"


def kernel_metas(source: str, kernel_flavour: str = "generic") -> tuple[str, ...]:
    """What keeps the kernel and the NVIDIA module moving together (issue 19 item 3).

    ``ubuntu-signed``: ``linux-modules-nvidia-<B>-server[-open]-<flavour>`` depends on the
    module build for one kernel ABI; holding it while ``linux-<flavour>`` moves lets
    unattended-upgrades install a kernel with no NVIDIA module. So the kernel metas of the
    same flavour are held with it (or neither is held, and both move together).
    DKMS sources build the module for each new kernel from its headers: nothing to hold."""
    if source != "ubuntu-signed":
        return ()
    return (f"linux-{kernel_flavour}", f"linux-image-{kernel_flavour}", f"linux-headers-{kernel_flavour}")


def kernel_module_package(source: str, branch: str, use_open: bool, release: str) -> str:
    """The package that gives kernel ``release`` (``6.8.0-50-generic``) the NVIDIA module:
    Canonical's signed module build for that ABI, or (DKMS) the kernel's headers, whose
    installation makes DKMS build the module for it."""
    if source == "ubuntu-signed":
        return f"linux-modules-nvidia-{branch}-server{'-open' if use_open else ''}-{release}"
    return f"linux-headers-{release}"


#: Kernel release -> (ABI flavour, kernel metas' flavour) per OS: the release without its
#: version and ABI (``5.15.0-91-generic``, ``6.1.0-18-cloud-amd64``, ``6.12.12+bpo-amd64``).
KERNEL_ABI_RE: dict[OsName, str] = {
    "ubuntu-22.04": r"^[0-9.]+-[0-9]+-",
    "ubuntu-24.04": r"^[0-9.]+-[0-9]+-",
    "debian-12": r"^[0-9.]+(-[0-9]+|[+]bpo)-",
}
#: The release's GA kernel series; Ubuntu's metas of a newer (HWE) kernel are <flavour>-hwe-<release>.
GA_KERNEL: dict[OsName, str] = {"ubuntu-22.04": "5.15", "ubuntu-24.04": "6.8", "debian-12": "6.1"}
DEFAULT_KERNEL_FLAVOUR: dict[OsName, str] = {"ubuntu-22.04": "generic", "ubuntu-24.04": "generic", "debian-12": "amd64"}


def kernel_flavour(os_name: str, kernel_release: str) -> str:
    """The kernel metas' flavour of a running kernel: ``generic``, ``generic-hwe-22.04`` (an
    Ubuntu kernel series newer than the release's GA one), ``cloud-amd64``."""
    os_ = _check_os(os_name)
    abi = re.sub(KERNEL_ABI_RE[os_], "", kernel_release)
    series = re.match(r"[0-9]+\.[0-9]+", kernel_release)
    if os_.startswith("ubuntu") and series and version_tuple(series.group()) > version_tuple(GA_KERNEL[os_]):
        return f"{abi}-hwe-{os_.split('-')[1]}"
    return abi


# --------------------------------------------------------------------------- CUDA
def resolve_cuda_source(os_name: str, source: str = "auto", driver_source: str | None = None) -> str:
    """``auto``: NVIDIA's repository when the driver comes from it (``cuda-repo``), else the
    per-OS default (Debian 12: Debian's own toolkit)."""
    os_ = _check_os(os_name)
    if source != "auto":
        return source
    if driver_source == "cuda-repo":
        return "cuda-repo"
    return AUTO_SOURCES[os_]["cuda"]


def default_cuda_versions(os_name: str, source: str = "auto", driver_source: str | None = None) -> tuple[str, ...]:
    """The toolkit a manifest without ``cuda.versions`` gets on this OS from this source."""
    os_ = _check_os(os_name)
    src = resolve_cuda_source(os_, source, driver_source)
    default = CUDA_DEFAULTS[os_].get(src)
    if default is None:
        raise GpuStackError(f"no default CUDA version for source {src!r} on {os_}; give cuda.versions")
    return (default,)


def cuda_problems(
    os_name: str,
    versions: list[str] | tuple[str, ...] | None,
    default: str | None = None,
    source: str = "auto",
    cudnn: bool = False,
    *,
    driver_branch: str | None = None,
    driver_source: str | None = None,
) -> list[str]:
    """Every reason these toolkits cannot be installed, one sentence each (empty: they can)."""
    try:
        os_ = _check_os(os_name)
    except GpuStackError as exc:
        return [str(exc)]
    src = resolve_cuda_source(os_, source, driver_source)
    if src not in CUDA_SOURCES:
        return [f"unknown CUDA source {src!r}; use auto, {', '.join(CUDA_SOURCES)}"]
    if versions is None:
        try:
            versions = default_cuda_versions(os_, src)
        except GpuStackError as exc:
            return [str(exc)]
    if not versions:
        return ["cuda.versions is empty"]
    bad = [v for v in versions if not re.fullmatch(r"\d+\.\d+", v)]
    if bad:
        return [f"{v!r} is not a CUDA version like 12.8" for v in bad]
    out: list[str] = []
    if len(set(versions)) != len(versions):
        out.append(f"a CUDA version is listed twice in {list(versions)}")
    chosen = default if default is not None else versions[-1]
    if chosen not in versions:
        out.append(f"default CUDA {chosen} is not one of {list(versions)}")
    if src == "debian":
        if os_ != "debian-12":
            out.append(f"CUDA source 'debian' is for Debian nodes, not {os_}; use 'cuda-repo'")
        else:
            wrong = [v for v in versions if v != DEBIAN_CUDA_VERSION]
            if wrong:
                via = " (cuda.source auto follows nvidia_driver.source: cuda-repo only)" if source == "auto" else ""
                out.append(
                    f"CUDA {', '.join(wrong)} from Debian: Debian 12 ships CUDA {DEBIAN_CUDA_VERSION} only{via}; "
                    f"use versions: [\"{DEBIAN_CUDA_VERSION}\"] or cuda.source: cuda-repo"
                )
        if cudnn:
            out.append(
                "cuDNN with CUDA source 'debian': Debian's nvidia-cudnn only downloads cuDNN from NVIDIA "
                "at install time; use source 'cuda-repo' for cuDNN"
            )
    else:
        available = CUDA_REPO_VERSIONS[os_]
        missing = [v for v in versions if v not in available]
        if missing:
            out.append(
                f"CUDA {', '.join(missing)} is not in NVIDIA's {CUDA_REPO_DIST[os_]} repository "
                f"(it has {', '.join(available)})"
            )
    if driver_branch is not None and re.fullmatch(r"\d+", driver_branch):
        for v in versions:
            minimum = CUDA_MIN_BRANCH.get(cuda_major(v))
            if minimum is None:
                out.append(f"CUDA {v}: unknown CUDA major version")
            elif int(driver_branch) < minimum:
                out.append(f"CUDA {v} needs driver branch {minimum} or newer (nvidia_driver.branch is {driver_branch})")
    return out


def resolve_cuda(
    os_name: str,
    versions: list[str] | tuple[str, ...] | None,
    default: str | None = None,
    source: str = "auto",
    cudnn: bool = False,
    *,
    driver_branch: str | None = None,
    driver_source: str | None = None,
) -> CudaPlan:
    """The toolkits to install. ``versions`` None: the OS's default for the source; ``auto``
    source follows a ``cuda-repo`` driver (``driver_source``)."""
    problems = cuda_problems(os_name, versions, default, source, cudnn,
                             driver_branch=driver_branch, driver_source=driver_source)
    if problems:
        raise GpuStackError("; ".join(problems))
    os_ = _check_os(os_name)
    src = resolve_cuda_source(os_, source, driver_source)
    chosen_versions = tuple(versions) if versions is not None else default_cuda_versions(os_, src)
    chosen = default if default is not None else chosen_versions[-1]
    packages: tuple[str, ...]
    cudnn_pkgs: tuple[str, ...] = ()
    if src == "debian":
        packages = ("nvidia-cuda-toolkit", "gcc", "g++")
    else:
        # nvcc needs a host compiler; NVIDIA's cuda-toolkit-X-Y packages do not depend on one
        packages = (*(f"cuda-toolkit-{v.replace('.', '-')}" for v in chosen_versions), "gcc", "g++")
        majors = sorted({cuda_major(v) for v in chosen_versions})
        cudnn_pkgs = tuple(f"cudnn9-cuda-{m}" for m in majors) if cudnn else ()
    return CudaPlan(
        os=os_,
        source=src,
        versions=chosen_versions,
        default=chosen,
        packages=packages,
        cudnn_packages=cudnn_pkgs,
        prefixes={v: f"/usr/local/cuda-{v}" for v in chosen_versions},
        uses_cuda_repo=src == "cuda-repo",
    )


# --------------------------------------------------------------------------- NCCL
def pick_nccl_build(os_name: str, version: str, cuda_version: str) -> str:
    """The CUDA X.Y build of an NCCL release to install next to CUDA ``cuda_version`` from
    the OS's repository.

    Same major as the toolkit; the newest build not newer than the toolkit, else the oldest
    newer one (NCCL links the CUDA runtime statically, so any build of the major works).
    """
    os_ = _check_os(os_name)
    base = nccl_base_version(version)
    table = NCCL_APT_BUILDS[os_]
    builds = table.get(base)
    if builds is None:
        raise GpuStackError(
            f"NCCL {base} is not in the table of NVIDIA apt builds for {CUDA_REPO_DIST[os_]} "
            f"(known: {', '.join(table)}); use nccl.source 'pypi' or add it to provisioner/areas/gpu/versions.yaml"
        )
    major = cuda_major(cuda_version)
    same = sorted((b for b in builds if cuda_major(b) == major), key=version_tuple)
    if not same:
        raise GpuStackError(
            f"NCCL {base} has no build for CUDA {major} (builds: {', '.join(builds)}); the NCCL build's "
            f"CUDA major must match the toolkit ({cuda_version})"
        )
    older = [b for b in same if version_tuple(b) <= version_tuple(cuda_version)]
    return older[-1] if older else same[0]


def nccl_wheel(version: str, cuda_version: str) -> str:
    base = nccl_base_version(version)
    major = cuda_major(cuda_version)
    span = NCCL_WHEEL_RANGE.get(major)
    if span is None:
        raise GpuStackError(f"no nvidia-nccl wheel for CUDA {major} (wheels exist for CUDA {sorted(NCCL_WHEEL_RANGE)})")
    lo, hi = span
    v = version_tuple(base)
    if v < lo or (hi is not None and v > hi):
        top = ".".join(map(str, hi)) if hi else "the newest"
        raise GpuStackError(
            f"NCCL {base} has no PyPI wheel for CUDA {major}: nvidia-nccl-cu{major} covers "
            f"{'.'.join(map(str, lo))} to {top}; the NCCL build's CUDA major must match the toolkit ({cuda_version})"
        )
    return f"nvidia-nccl-cu{major}=={base}"


def resolve_nccl(os_name: str, version: str, source: str = "auto", *, cuda_version: str) -> NcclPlan:
    os_ = _check_os(os_name)
    if not re.fullmatch(r"\d+\.\d+\.\d+(-\d+)?", version):
        raise GpuStackError(f"{version!r} is not an NCCL version like 2.21.5")
    src = resolve_source(os_, "nccl", source)
    if src not in NCCL_SOURCES:
        raise GpuStackError(f"unknown NCCL source {src!r}; use auto, {', '.join(NCCL_SOURCES)}")
    base = nccl_base_version(version)
    if src == "apt":
        build = pick_nccl_build(os_, version, cuda_version)
        pinned = nccl_apt_version(version, build)
        return NcclPlan(
            os=os_, source=src, version=base, cuda_version=build,
            packages=(f"libnccl2={pinned}", f"libnccl-dev={pinned}"), wheel=None,
            prefix="/usr", uses_cuda_repo=True,
        )
    wheel = nccl_wheel(version, cuda_version)
    major = cuda_major(cuda_version)
    return NcclPlan(
        os=os_, source=src, version=base, cuda_version=cuda_version,
        packages=(), wheel=wheel, prefix=f"{NCCL_PREFIX_ROOT}/{base}-cuda{major}", uses_cuda_repo=False,
    )


# --------------------------------------------------------------------------- docker
def resolve_docker(os_name: str, source: str = "auto") -> DockerPlan:
    os_ = _check_os(os_name)
    src = resolve_source(os_, "docker", source)
    if src not in DOCKER_SOURCES:
        raise GpuStackError(f"unknown docker source {src!r}; use auto, {', '.join(DOCKER_SOURCES)}")
    if src == "docker-ce":
        url, suite = DOCKER_REPO[os_]
        return DockerPlan(os=os_, source=src, packages=DOCKER_CE_PACKAGES, repo_url=url, repo_suite=suite)
    return DockerPlan(os=os_, source=src, packages=DOCKER_DISTRO_PACKAGES, repo_url=None, repo_suite=None)
