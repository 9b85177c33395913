"""CUDA toolkits: which versions from which source, their packages and install prefixes,
and what is refused against the driver branch (pure; the cuda role)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from provisioner.areas.gpu.tables import (
    AUTO_SOURCES,
    CUDA_DEFAULTS,
    CUDA_MIN_BRANCH,
    CUDA_REPO_DIST,
    CUDA_REPO_VERSIONS,
    CUDA_SOURCES,
    DEBIAN_CUDA_VERSION,
    GpuStackError,
    OsName,
    check_os,
    cuda_major,
)


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


# --------------------------------------------------------------------------- CUDA
def resolve_cuda_source(os_name: str, source: str = "auto", driver_source: str | None = None) -> str:
    """``auto``: NVIDIA's repository when the driver comes from it (``cuda-repo``), else the
    per-OS default (Debian 12: Debian's own toolkit)."""
    os_ = check_os(os_name)
    if source != "auto":
        return source
    if driver_source == "cuda-repo":
        return "cuda-repo"
    return AUTO_SOURCES[os_]["cuda"]


def default_cuda_versions(os_name: str, source: str = "auto", driver_source: str | None = None) -> tuple[str, ...]:
    """The toolkit a manifest without ``cuda.versions`` gets on this OS from this source."""
    os_ = check_os(os_name)
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
        os_ = check_os(os_name)
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
    os_ = check_os(os_name)
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
