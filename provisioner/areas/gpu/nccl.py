"""NCCL: the apt build or PyPI wheel matching a CUDA version, and its prefix (pure; the
nccl role)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from provisioner.areas.gpu.tables import (
    CUDA_REPO_DIST,
    NCCL_APT_BUILDS,
    NCCL_PREFIX_ROOT,
    NCCL_SOURCES,
    NCCL_WHEEL_RANGE,
    GpuStackError,
    OsName,
    check_os,
    cuda_major,
    resolve_source,
    version_tuple,
)


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


def nccl_base_version(version: str) -> str:
    """``2.21.5-1`` -> ``2.21.5`` (the wheel version; apt adds the package revision)."""
    return re.sub(r"-\d+$", "", version)


def nccl_apt_version(version: str, cuda_build: str) -> str:
    """``2.21.5`` + ``12.4`` -> ``2.21.5-1+cuda12.4`` (a given revision is kept)."""
    revision = version if re.search(r"-\d+$", version) else f"{version}-1"
    return f"{revision}+cuda{cuda_build}"


# --------------------------------------------------------------------------- NCCL
def pick_nccl_build(os_name: str, version: str, cuda_version: str) -> str:
    """The CUDA X.Y build of an NCCL release to install next to CUDA ``cuda_version`` from
    the OS's repository.

    Same major as the toolkit; the newest build not newer than the toolkit, else the oldest
    newer one (NCCL links the CUDA runtime statically, so any build of the major works).
    """
    os_ = check_os(os_name)
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
    os_ = check_os(os_name)
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
