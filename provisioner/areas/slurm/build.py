"""One Slurm for the whole cluster (``slurm.source: build``), decided from the manifest (pure):
which release, from which pinned source files, built with which options into which .deb
packages per OS release, cached under which key, and how the nodes get them (a signed apt
repository served from the head node, pinned over the OS's Slurm).

The facts and their sources: docs/versions.md, "Slurm built for the cluster"; the design:
docs/design.md, "One Slurm for the cluster". The edge that runs the build (a chroot of each
OS release, the cache) is ``provisioner/commands/slurm.py``.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from provisioner.image.recipe import KEYRINGS, OS_IMAGES
from provisioner.manifest.model import Manifest
from provisioner.platforms import OS_NAMES, PLATFORMS, Family


@dataclass(frozen=True)
class SlurmSource:
    """A pinned Slurm source tarball: SchedMD's GitHub tag archive, which carries SchedMD's own
    Debian packaging (``debian/``, since 23.11; binary packages ``slurm-smd-*``)."""

    version: str
    file: str  # the upstream file name (a mirror holds it under this name)
    upstream: str  # the folder holding it when slurm.mirror is unset
    sha256: str
    read_from: str  # where the version and sha256 were read

    @property
    def release(self) -> str:
        """The major release: 25.05.1 -> 25.05."""
        return ".".join(self.version.split(".")[:2])


GITHUB = "https://github.com/SchedMD/slurm/archive/"
_SPACK = ("spack/spack-packages repos/spack_repo/builtin/packages/slurm/package.py (commit 1319487e), "
          "which pins SchedMD's GitHub tag archives by sha256")
SOURCES: dict[str, SlurmSource] = {
    "25.05.1": SlurmSource("25.05.1", "slurm-25-05-1-1.tar.gz", GITHUB,
                           "b568c761a6c9d72358addb3bb585456e73e80a02214ce375d2de8534f9ddb585", _SPACK),
    "24.11.6": SlurmSource("24.11.6", "slurm-24-11-6-1.tar.gz", GITHUB,
                           "282708483326f381eb001a14852a1a82e65e18f37b62b7a5f4936c0ed443b600", _SPACK),
    # Debian trixie's slurm-wlm_24.11.5.orig.tar.gz is this archive (top folder
    # slurm-slurm-24-11-5-1, SchedMD's debian/ inside): what the build machine here can reach.
    "24.11.5": SlurmSource("24.11.5", "slurm-24-11-5-1.tar.gz", GITHUB,
                           "e1a5547edd212c38b5e3230a284133f777b32746551f094aaa81cc4af375e332",
                           "Debian trixie main Sources (deb.debian.org, read 2026-11-27): Checksums-Sha256 of "
                           "slurm-wlm_24.11.5.orig.tar.gz"),
}
# The newest pinned release SchedMD still supports (25.05; 24.11 went out of support in 2026).
DEFAULT_VERSION = "25.05.1"

# What every build turns on (configure finds each library at build time: its -dev package in
# the chroot is what switches the feature on); part of the cache key.
BUILD_OPTIONS: tuple[str, ...] = ("nvml", "pmix", "cgroup-v2", "slurmrestd", "pam", "mysql", "munge", "hwloc", "lua")
RECIPE_VERSION = 1


def wanted(m: Manifest) -> bool:
    return m.slurm.enabled and m.slurm.source == "build"


def source(m: Manifest) -> SlurmSource | None:
    """The pinned source the manifest builds, None with ``slurm.source: os`` or an unknown
    version (:func:`problems` reports it)."""
    if not wanted(m):
        return None
    return SOURCES.get(m.slurm.version or DEFAULT_VERSION)


def built_release(m: Manifest) -> str | None:
    """The major release every Slurm node runs with ``slurm.source: build``, else None."""
    src = source(m)
    return src.release if src else None


def source_url(m: Manifest, src: SlurmSource) -> str:
    """Where the tarball is fetched: slurm.mirror's folder, else the upstream one."""
    base = m.slurm.mirror or src.upstream
    return (base if base.endswith("/") else base + "/") + src.file


# ---------------------------------------------------------------- build dependencies per OS

# Packages per build option, per OS release (the names the archives use; docs/versions.md,
# "Slurm built for the cluster", has the sources). mk-build-deps installs the rest of
# debian/control's Build-Depends; these make sure each option's library is there whatever the
# packaging lists (SchedMD's 24.11 control has no NVML; 25.11's has).
_COMMON_DEPS: dict[str, tuple[str, ...]] = {
    "toolchain": ("build-essential", "fakeroot", "devscripts", "equivs", "ca-certificates"),
    "nvml": ("libnvidia-ml-dev",),
    "pmix": ("libpmix-dev",),
    "cgroup-v2": ("libdbus-1-dev",),
    "slurmrestd": ("libhttp-parser-dev", "libjson-c-dev", "libjwt-dev", "libyaml-dev"),
    "pam": ("libpam0g-dev",),
    "mysql": ("libmariadb-dev",),
    "munge": ("libmunge-dev",),
    "hwloc": ("libhwloc-dev",),
    "lua": ("liblua5.3-dev",),
}
BUILD_DEPS: dict[str, dict[str, tuple[str, ...]]] = {name: _COMMON_DEPS for name in OS_NAMES}
# Archive components the chroot needs for those packages, per family (libnvidia-ml-dev:
# Debian non-free, Ubuntu multiverse).
_COMPONENTS_BY_FAMILY: dict[Family, tuple[str, ...]] = {
    "debian": ("main", "contrib", "non-free"),
    "ubuntu": ("main", "universe", "multiverse"),
}
BUILD_COMPONENTS: dict[str, tuple[str, ...]] = {name: _COMPONENTS_BY_FAMILY[p.family] for name, p in PLATFORMS.items()}


def build_packages(os_name: str) -> tuple[str, ...]:
    """Every package the build chroot of ``os_name`` installs before mk-build-deps, once each."""
    deps = BUILD_DEPS[os_name]
    names = [p for option in ("toolchain", *BUILD_OPTIONS) for p in deps[option]]
    return tuple(dict.fromkeys(names))


APT = "apt-get -o DPkg::Lock::Timeout=60 -o Acquire::http::Timeout=60"


def build_commands(src: SlurmSource, os_name: str, jobs: int = 2) -> list[list[str]]:
    """The build, in order, run as root in a chroot of ``os_name`` whose working directory
    holds the fetched tarball; the .deb files land in the working directory. SchedMD's
    quickstart_admin, "Building Debian Packages": mk-build-deps, then a binary-only build."""
    return [
        ["sh", "-c", f"{APT} update && {APT} install -y --no-install-recommends "
                     + " ".join(build_packages(os_name))],
        ["sh", "-c", f"mkdir src && tar -xf {shlex.quote(src.file)} --strip-components=1 -C src"],
        ["sh", "-c", "cd src && mk-build-deps --install --remove --tool "
                     f"'{APT} -y --no-install-recommends' debian/control"],
        ["sh", "-c", f"cd src && dpkg-buildpackage -b -uc -us -j{jobs}"],
    ]


def cache_key(src: SlurmSource, os_name: str) -> str:
    """Hash of every input of one build: a build is redone only when one of them changes."""
    blob = json.dumps({
        "recipe": RECIPE_VERSION, "version": src.version, "sha256": src.sha256, "os": os_name,
        "options": BUILD_OPTIONS, "packages": build_packages(os_name),
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_dir(src: SlurmSource, os_name: str) -> str:
    """The build's folder in the state directory's Slurm cache (``.provision/slurm/``)."""
    return f"{os_name}-{src.version}-{cache_key(src, os_name)}"


# ---------------------------------------------------------------- what comes out

# Binary packages per daemon and feature, from SchedMD's debian/control (read in the 24.11.5
# tarball; the same names in 25.11.4's .dsc).
PACKAGES: dict[str, tuple[str, ...]] = {
    "client": ("slurm-smd", "slurm-smd-client"),
    "controller": ("slurm-smd-slurmctld",),
    "compute": ("slurm-smd-slurmd",),
    "dbd": ("slurm-smd-slurmdbd",),
    "restd": ("slurm-smd-slurmrestd",),
    "pam_adopt": ("slurm-smd-libpam-slurm-adopt",),
    "pmi": ("slurm-smd-libpmi2-0",),
    "dev": ("slurm-smd-dev",),  # the headers pyxis is built against (the containers role: libslurm-dev today)
}


def debs() -> tuple[str, ...]:
    """The binary packages a build must leave (it leaves more: docs, sview, the PBS wrappers)."""
    return tuple(sorted({p for names in PACKAGES.values() for p in names}))


# Files the built packages must hold, one per build option that makes a file: a build whose
# chroot lacked a library silently leaves its plugin out, and the check after the build fails.
PROOF_FILES: dict[str, str] = {
    "nvml": "gpu_nvml.so",
    "pmix": "mpi_pmix",
    "cgroup-v2": "cgroup_v2.so",
    "slurmrestd": "slurmrestd",
    "pam": "pam_slurm_adopt.so",
    "mysql": "accounting_storage_mysql.so",
}


def missing_options(paths: Iterable[str]) -> list[str]:
    """The build options whose file none of ``paths`` (every file the built packages hold,
    as ``dpkg-deb -c`` lists them) ends with or names; [] for a complete build."""
    names = [p.rsplit("/", 1)[-1] for p in paths]
    return [option for option, file in PROOF_FILES.items() if not any(n.startswith(file) for n in names)]


# ---------------------------------------------------------------- one build per OS release

BUILD_TIMEOUT_S = 5400  # one OS release's build, all of it (a Slurm build is minutes to tens of minutes)
CHROOT_DIR = "/build"  # where the source files and the build live inside the chroot


def chroot_script(src: SlurmSource, os_name: str, jobs: int = 2) -> str:
    """The build as one shell line run in the chroot: :func:`build_commands` in ``/build``
    without a terminal, then the .deb files moved to ``/build/out``."""
    steps = [shlex.join(cmd) for cmd in build_commands(src, os_name, jobs)]
    # no debconf question may wait for an answer nobody gives (libnvidia-ml1's alternatives)
    return " && ".join([f"cd {CHROOT_DIR}", "export DEBIAN_FRONTEND=noninteractive", *steps, "mkdir -p out",
                        "mv ./*.deb out/"])


@dataclass(frozen=True)
class Job:
    """One OS release's build: what to fetch and check, the cache folder, what must come out."""

    os: str
    source: SlurmSource
    url: str
    name: str  # the cache folder (:func:`cache_dir`)
    debs: tuple[str, ...]  # binary packages the build must leave

    def mmdebstrap(self, workdir: str, outdir: str, proxy: str | None = None, mirror: str | None = None,
                   jobs: int = 2) -> list[str]:
        """A throwaway chroot of the OS release (``--mode=root``, no output tree: /dev/null),
        the source files of ``workdir`` copied in, the build run inside, the .deb files
        copied out to ``outdir``."""
        facts = OS_IMAGES[self.os]  # type: ignore[index]
        base = (mirror or facts.default_mirror).rstrip("/")
        script = chroot_script(self.source, self.os, jobs)
        cmd = [
            "mmdebstrap", "--mode=root", "--variant=apt", "--format=null",
            "--aptopt=Acquire::Retries \"3\"", "--aptopt=Acquire::http::Timeout \"60\"",
            "--aptopt=DPkg::Lock::Timeout \"120\"",
            f"--customize-hook=mkdir -p \"$1{CHROOT_DIR}\"",
            f"--customize-hook=sync-in {workdir} {CHROOT_DIR}",
            f"--customize-hook=chroot \"$1\" sh -c {shlex.quote(script)}",
            f"--customize-hook=sync-out {CHROOT_DIR}/out {outdir}",
        ]
        if proxy:
            cmd.append(f"--aptopt=Acquire::http::Proxy \"{proxy}\"")
        cmd += [f"--keyring={KEYRINGS[facts.distro][0]}", facts.suite, "/dev/null", *facts.sources(base)]
        return cmd


def jobs(m: Manifest, only: str | None = None) -> list[Job]:
    """The builds of the manifest (one per OS release of its Slurm nodes, or ``only``); []
    with ``slurm.source: os``."""
    src = source(m)
    if src is None:
        return []
    return [Job(os_name, src, source_url(m, src), cache_dir(src, os_name), debs())
            for os_name in slurm_os_releases(m) if only in (None, os_name)]


def slurm_os_releases(m: Manifest) -> tuple[str, ...]:
    """The OS releases of the manifest's Slurm nodes (controller, slurmd nodes, login nodes)."""
    names = {n.os for n in m.nodes if n.has_role("compute") or n.has_role("login") or n.name == m.head.name}
    return tuple(sorted(names))


# ---------------------------------------------------------------- manifest checks

# apply stops at this (provisioner.areas.slurm.upgrade.plan_view) until the role installs the
# built packages: it would install the OS's Slurm with the built one's cgroup settings
NOT_INSTALLED_YET = (
    "slurm.source: build is decided (versions, build recipe, repository, upgrade order) but the slurm "
    "role does not install built packages yet (issue 33): apply keeps to slurm.source: os until it does")


def problems(m: Manifest) -> list[tuple[tuple[str, ...], str]]:
    """(manifest path, error) for the build settings."""
    s = m.slurm
    if not s.enabled:
        return []
    if s.source == "os":
        return [(("slurm", key), f"slurm.{key} applies only with slurm.source: build")
                for key in ("version", "mirror") if getattr(s, key) is not None]
    if s.version is not None and s.version not in SOURCES:
        known = ", ".join(sorted(SOURCES))
        return [(("slurm", "version"), f"Slurm {s.version} has no pinned source here (known: {known}); "
                 "pin its files and sha256 in provisioner/areas/slurm/build.py SOURCES")]
    return []
