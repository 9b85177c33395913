"""The NVIDIA driver: which packages, holds, pins and kernel packages a node's driver
branch and source need, and what is refused (pure; the nvidia_driver role)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from provisioner.areas.gpu.tables import (
    CUDA_REPO_BRANCHES,
    CUDA_REPO_DIST,
    CUDA_REPO_RENAMED_FROM,
    CUDA_REPO_URL,
    DEBIAN_DRIVER_BRANCH,
    DRIVER_SOURCES,
    KNOWN_BRANCHES,
    OPEN_MODULES_DEFAULT_FROM,
    OPEN_MODULES_MIN_BRANCH,
    UBUNTU_NEWER_RELEASES_ONLY,
    UBUNTU_SERVER_BRANCHES,
    UBUNTU_SERVER_MODULES,
    UBUNTU_TRANSITIONAL,
    GpuStackError,
    OsName,
    check_os,
    resolve_source,
    version_tuple,
)
from provisioner.platforms import PLATFORMS, Family


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

_OPEN_ONLY_GPU = re.compile(r"\b(B100|B200|B300|GB200|GB300|RTX\s*50\d0|RTX\s+PRO\s+\d+\s+Blackwell|Blackwell)\b", re.I)
OPEN_ONLY_MIN_BRANCH = 570
#: 8-GPU SXM/HGX baseboards carry NVSwitches (4-GPU boards use direct NVLink).
_SXM_BOARD = re.compile(r"\b(SXM\d?|HGX|DGX)\b", re.I)


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
        os_ = check_os(os_name)
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
    os_ = check_os(os_name)
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


#: Kernel release -> (ABI flavour, kernel metas' flavour) per family: the release without its
#: version and ABI (``5.15.0-91-generic``, ``6.1.0-18-cloud-amd64``, ``6.12.12+bpo-amd64``),
#: and the flavour of the family's usual kernel metas.
_KERNEL_NAMES: dict[Family, tuple[str, str]] = {
    "ubuntu": (r"^[0-9.]+-[0-9]+-", "generic"),
    "debian": (r"^[0-9.]+(-[0-9]+|[+]bpo)-", "amd64"),
}
KERNEL_ABI_RE: dict[OsName, str] = {name: _KERNEL_NAMES[p.family][0] for name, p in PLATFORMS.items()}
DEFAULT_KERNEL_FLAVOUR: dict[OsName, str] = {name: _KERNEL_NAMES[p.family][1] for name, p in PLATFORMS.items()}
#: The release's GA kernel series (the platform table); Ubuntu's metas of a newer (HWE) kernel
#: are <flavour>-hwe-<release>.
GA_KERNEL: dict[OsName, str] = {name: p.kernel for name, p in PLATFORMS.items()}


def kernel_flavour(os_name: str, kernel_release: str) -> str:
    """The kernel metas' flavour of a running kernel: ``generic``, ``generic-hwe-22.04`` (an
    Ubuntu kernel series newer than the release's GA one), ``cloud-amd64``."""
    os_ = check_os(os_name)
    abi = re.sub(KERNEL_ABI_RE[os_], "", kernel_release)
    series = re.match(r"[0-9]+\.[0-9]+", kernel_release)
    if os_.startswith("ubuntu") and series and version_tuple(series.group()) > version_tuple(GA_KERNEL[os_]):
        return f"{abi}-hwe-{os_.split('-')[1]}"
    return abi
