"""GPU software stack: per-OS package and version resolution (pure, no I/O).

Given a node's OS and the manifest's ``software`` / ``docker`` sections, say exactly what the
``nvidia_driver``, ``cuda``, ``nccl``, ``docker`` and ``nvidia_container_toolkit`` roles
install: package names, version pins, holds, repositories and install prefixes. Unsupported
combinations raise :class:`GpuStackError` with a message that says what to change.

The roles compute the same package names from ``roles/<role>/vars/*.yml`` (so each role works
on its own); ``tests/areas/gpu/test_decide.py`` renders those files and checks that they agree
with the functions here for every OS and source.

Snapshot tables (driver branches, CUDA versions per repository, NCCL builds) describe the
vendors' repositories as of 2025; extend them when NVIDIA publishes new releases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

OsName = Literal["ubuntu-22.04", "ubuntu-24.04", "debian-12"]
OS_NAMES: tuple[OsName, ...] = ("ubuntu-22.04", "ubuntu-24.04", "debian-12")


class GpuStackError(ValueError):
    """An unknown version or an unsupported OS/source/version combination."""


# --------------------------------------------------------------------------- tables
#: Production driver branches this tool knows (NVIDIA data-center releases).
KNOWN_BRANCHES: tuple[str, ...] = ("470", "535", "550", "560", "565", "570", "575", "580")
#: Branches with Canonical's signed precompiled "-server" modules (linux-restricted-modules).
UBUNTU_SERVER_BRANCHES: frozenset[str] = frozenset({"470", "535", "550", "565", "570", "575", "580"})
#: Open GPU kernel modules exist from branch 515 and are NVIDIA's default from 560.
OPEN_MODULES_MIN_BRANCH = 515
OPEN_MODULES_DEFAULT_FROM = 560
#: Debian 12 (bookworm, non-free) ships one driver branch and one CUDA toolkit.
DEBIAN_DRIVER_BRANCH = "535"
DEBIAN_CUDA_VERSION = "11.8"

DRIVER_SOURCES = ("ubuntu-signed", "cuda-repo", "debian")
CUDA_SOURCES = ("cuda-repo", "debian")
NCCL_SOURCES = ("apt", "pypi")
DOCKER_SOURCES = ("docker-ce", "distro")

#: What "auto" means per OS, per component.
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

#: CUDA toolkit versions (cuda-toolkit-X-Y) in NVIDIA's repository per OS. 12.7 never existed.
_CUDA_12 = ("12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9")
CUDA_REPO_VERSIONS: dict[OsName, tuple[str, ...]] = {
    "ubuntu-22.04": ("11.7", "11.8", *_CUDA_12, "13.0"),
    "ubuntu-24.04": ("12.5", "12.6", "12.8", "12.9", "13.0"),
    "debian-12": ("12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9", "13.0"),
}

#: Oldest driver branch that runs a CUDA major (minor-version compatibility).
CUDA_MIN_BRANCH: dict[int, int] = {11: 450, 12: 525, 13: 580}

#: NCCL builds in NVIDIA's apt repository: NCCL version -> CUDA X.Y it was built for
#: (libnccl2=<ver>-1+cuda<X.Y>). CUDA-11 builds stop at 2.21.5, like the PyPI cu11 wheels.
NCCL_APT_BUILDS: dict[str, tuple[str, ...]] = {
    "2.16.5": ("11.0", "11.8", "12.0"),
    "2.17.1": ("11.0", "12.0", "12.1"),
    "2.18.1": ("11.0", "12.0", "12.1"),
    "2.18.3": ("11.0", "12.0", "12.2"),
    "2.18.5": ("11.0", "12.0", "12.2"),
    "2.19.3": ("11.0", "12.0", "12.2", "12.3"),
    "2.20.3": ("11.0", "12.0", "12.2", "12.3"),
    "2.20.5": ("11.0", "12.0", "12.2", "12.4"),
    "2.21.5": ("11.0", "12.2", "12.4", "12.5"),
    "2.22.3": ("12.2", "12.5", "12.6"),
    "2.23.4": ("12.2", "12.6"),
    "2.24.3": ("12.2", "12.6"),
    "2.25.1": ("12.2", "12.8"),
    "2.26.2": ("12.2", "12.8"),
    "2.26.5": ("12.2", "12.9"),
    "2.27.3": ("12.2", "12.9"),
    "2.27.5": ("12.2", "12.9"),
    "2.27.7": ("12.2", "12.9", "13.0"),
    "2.28.3": ("12.2", "12.9", "13.0"),
}

#: PyPI wheels nvidia-nccl-cu<major>: (oldest, newest or None for "still published").
NCCL_WHEEL_RANGE: dict[int, tuple[tuple[int, ...], tuple[int, ...] | None]] = {
    11: ((2, 13, 4), (2, 21, 5)),
    12: ((2, 16, 2), None),
    13: ((2, 27, 7), None),
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

    def install(self, kernel: bool) -> tuple[str, ...]:
        """What the role installs: full + userspace with a kernel and GPUs, else userspace;
        plus the fabric manager on NVSwitch systems."""
        wanted = (*self.packages, *self.userspace_packages) if kernel else self.userspace_packages
        return tuple(dict.fromkeys((*wanted, *self.fabricmanager_packages)))

    def holds(self, kernel: bool) -> tuple[str, ...]:
        """What the role holds: everything it installs except kernel headers and firmware."""
        return tuple(p for p in self.install(kernel) if p not in self.unheld_packages)


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
def resolve_driver(
    os_name: str,
    branch: str,
    source: str = "auto",
    open_kernel_modules: bool | None = None,
    *,
    nvswitch: bool = False,
    gpu_model: str | None = None,
    kernel_flavour: str = "generic",
) -> DriverPlan:
    os_ = _check_os(os_name)
    if branch not in KNOWN_BRANCHES:
        raise GpuStackError(
            f"unknown NVIDIA driver branch {branch!r}; known branches: {', '.join(KNOWN_BRANCHES)}"
        )
    src = resolve_source(os_, "driver", source)
    if src not in DRIVER_SOURCES:
        raise GpuStackError(f"unknown driver source {src!r}; use auto, {', '.join(DRIVER_SOURCES)}")
    if src == "ubuntu-signed" and not os_.startswith("ubuntu"):
        raise GpuStackError(
            f"driver source 'ubuntu-signed' (Canonical's signed modules) exists only on Ubuntu, "
            f"not on {os_}; use 'debian' or 'cuda-repo'"
        )
    if src == "debian" and os_ != "debian-12":
        raise GpuStackError(
            f"driver source 'debian' is for Debian nodes, not {os_}; use 'ubuntu-signed' or 'cuda-repo'"
        )
    use_open = default_open_modules(branch) if open_kernel_modules is None else open_kernel_modules
    if use_open and int(branch) < OPEN_MODULES_MIN_BRANCH:
        raise GpuStackError(
            f"open kernel modules need branch {OPEN_MODULES_MIN_BRANCH} or newer (branch {branch} is proprietary only)"
        )
    if needs_open_modules(gpu_model):
        if int(branch) < OPEN_ONLY_MIN_BRANCH:
            raise GpuStackError(f"{gpu_model} needs driver branch {OPEN_ONLY_MIN_BRANCH} or newer (got {branch})")
        if not use_open:
            raise GpuStackError(f"{gpu_model} runs only with the open kernel modules; set open_kernel_modules: true")
    if src == "ubuntu-signed" and branch not in UBUNTU_SERVER_BRANCHES:
        raise GpuStackError(
            f"Ubuntu has no signed '-server' modules for branch {branch}; use one of "
            f"{', '.join(sorted(UBUNTU_SERVER_BRANCHES))} or source 'cuda-repo'"
        )
    if src == "debian" and branch != DEBIAN_DRIVER_BRANCH:
        raise GpuStackError(
            f"Debian 12 ships driver branch {DEBIAN_DRIVER_BRANCH} only (asked for {branch}); "
            "use source 'cuda-repo' for other branches"
        )
    if src == "debian" and nvswitch:
        raise GpuStackError(
            "Debian does not package nvidia-fabricmanager (needed on NVSwitch systems); use source 'cuda-repo'"
        )

    o = "-open" if use_open else ""
    b = branch
    packages: tuple[str, ...]
    userspace: tuple[str, ...]
    fabric: tuple[str, ...]
    pin: tuple[str, ...] = ()
    unheld: tuple[str, ...] = ()
    if src == "ubuntu-signed":
        packages = (
            f"linux-modules-nvidia-{b}-server{o}-{kernel_flavour}",
            f"nvidia-headless-no-dkms-{b}-server{o}",
            f"nvidia-utils-{b}-server",
        )
        userspace = (f"nvidia-utils-{b}-server", f"libnvidia-compute-{b}-server", f"nvidia-compute-utils-{b}-server")
        fabric = (f"nvidia-fabricmanager-{b}", f"libnvidia-nscq-{b}")
    elif src == "cuda-repo" and os_.startswith("ubuntu"):
        packages = ((f"nvidia-kernel-open-{b}",) if use_open else ()) + (f"cuda-drivers-{b}",)
        userspace = (f"nvidia-utils-{b}", f"libnvidia-compute-{b}", f"nvidia-compute-utils-{b}")
        fabric = (f"nvidia-fabricmanager-{b}", f"libnvidia-nscq-{b}")
    elif src == "cuda-repo":  # Debian 12, NVIDIA's debian12 repository (Debian package names)
        kernel = "nvidia-kernel-open-dkms" if use_open else "nvidia-kernel-dkms"
        packages = (kernel, f"cuda-drivers-{b}", "linux-headers-amd64")
        userspace = ("nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
        fabric = (f"nvidia-fabricmanager-{b}", f"libnvidia-nscq-{b}")
        pin = (kernel, *userspace)
        unheld = ("linux-headers-amd64",)
    else:  # debian
        kernel = "nvidia-open-kernel-dkms" if use_open else "nvidia-kernel-dkms"
        packages = ("nvidia-driver", kernel, "firmware-misc-nonfree", "linux-headers-amd64",
                    "nvidia-smi", "nvidia-persistenced")
        userspace = ("nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
        fabric = ()
        pin = ("nvidia-driver", kernel, "nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
        unheld = ("firmware-misc-nonfree", "linux-headers-amd64")
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
    )


# --------------------------------------------------------------------------- CUDA
def resolve_cuda(
    os_name: str,
    versions: list[str] | tuple[str, ...],
    default: str | None = None,
    source: str = "auto",
    cudnn: bool = False,
    *,
    driver_branch: str | None = None,
) -> CudaPlan:
    os_ = _check_os(os_name)
    if not versions:
        raise GpuStackError("cuda.versions is empty")
    for v in versions:
        if not re.fullmatch(r"\d+\.\d+", v):
            raise GpuStackError(f"{v!r} is not a CUDA version like 12.4")
    if len(set(versions)) != len(versions):
        raise GpuStackError(f"a CUDA version is listed twice in {list(versions)}")
    chosen = default if default is not None else versions[-1]
    if chosen not in versions:
        raise GpuStackError(f"default CUDA {chosen} is not one of {list(versions)}")
    src = resolve_source(os_, "cuda", source)
    if src not in CUDA_SOURCES:
        raise GpuStackError(f"unknown CUDA source {src!r}; use auto, {', '.join(CUDA_SOURCES)}")
    if src == "debian":
        if os_ != "debian-12":
            raise GpuStackError(f"CUDA source 'debian' is for Debian nodes, not {os_}; use 'cuda-repo'")
        wrong = [v for v in versions if v != DEBIAN_CUDA_VERSION]
        if wrong:
            raise GpuStackError(
                f"CUDA {', '.join(wrong)} from Debian: Debian 12 ships CUDA {DEBIAN_CUDA_VERSION} only; "
                f"use versions: [\"{DEBIAN_CUDA_VERSION}\"] or source 'cuda-repo'"
            )
        if cudnn:
            raise GpuStackError(
                "cuDNN with CUDA source 'debian': Debian's nvidia-cudnn only downloads cuDNN from NVIDIA "
                "at install time; use source 'cuda-repo' for cuDNN"
            )
        packages: tuple[str, ...] = ("nvidia-cuda-toolkit", "gcc", "g++")
        cudnn_pkgs: tuple[str, ...] = ()
    else:
        available = CUDA_REPO_VERSIONS[os_]
        missing = [v for v in versions if v not in available]
        if missing:
            raise GpuStackError(
                f"CUDA {', '.join(missing)} is not in NVIDIA's {CUDA_REPO_DIST[os_]} repository "
                f"(it has {', '.join(available)})"
            )
        packages = tuple(f"cuda-toolkit-{v.replace('.', '-')}" for v in versions)
        majors = sorted({cuda_major(v) for v in versions})
        cudnn_pkgs = tuple(f"cudnn9-cuda-{m}" for m in majors) if cudnn else ()
    if driver_branch is not None:
        for v in versions:
            minimum = CUDA_MIN_BRANCH.get(cuda_major(v))
            if minimum is None:
                raise GpuStackError(f"CUDA {v}: unknown CUDA major version")
            if int(driver_branch) < minimum:
                raise GpuStackError(
                    f"CUDA {v} needs driver branch {minimum} or newer (nvidia_driver.branch is {driver_branch})"
                )
    return CudaPlan(
        os=os_,
        source=src,
        versions=tuple(versions),
        default=chosen,
        packages=packages,
        cudnn_packages=cudnn_pkgs,
        prefixes={v: f"/usr/local/cuda-{v}" for v in versions},
        uses_cuda_repo=src == "cuda-repo",
    )


# --------------------------------------------------------------------------- NCCL
def pick_nccl_build(version: str, cuda_version: str) -> str:
    """The CUDA X.Y build of an NCCL release to install next to CUDA ``cuda_version``.

    Same major as the toolkit; the newest build not newer than the toolkit, else the oldest
    newer one (NCCL links the CUDA runtime statically, so any build of the major works).
    """
    base = nccl_base_version(version)
    builds = NCCL_APT_BUILDS.get(base)
    if builds is None:
        raise GpuStackError(
            f"NCCL {base} is not in the table of NVIDIA apt builds (known: {', '.join(NCCL_APT_BUILDS)}); "
            "use nccl.source 'pypi' or add it to provisioner/areas/gpu/decide.py"
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
        build = pick_nccl_build(version, cuda_version)
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
