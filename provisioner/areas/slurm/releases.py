"""The Slurm release each node runs, and what follows from it (pure): which releases can work
with the controller's, and whether the slurmd nodes can fence jobs with cgroups.

With ``slurm.source: os`` (the default) a node runs its OS's Slurm (:data:`SLURM_VERSION_BY_OS`);
with ``build`` every node runs the one release built for the cluster
(:mod:`provisioner.areas.slurm.build`), whatever its OS release."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.areas.slurm.build import built_release
from provisioner.areas.slurm.decide import client_nodes, controller, slurm_nodes
from provisioner.areas.slurm.hostlist import hostlist
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.platforms import PLATFORMS

# Slurm shipped by each supported OS (package slurm-wlm; the platform table). 21.08 has no
# cgroup/v2 plugin (added in 22.05) and Ubuntu 22.04 boots with the unified (v2) hierarchy by
# default.
SLURM_VERSION_BY_OS: dict[str, str] = {name: p.slurm for name, p in PLATFORMS.items()}
CGROUP_V2_MIN_VERSION = (22, 5)
# Slurm's major releases in order. A release works with (and upgrades in place from) its own and
# the two previous major releases; from 24.11 on, the three previous ones (SchedMD's upgrade
# guide, "Compatibility Window"; docs/versions.md, "Slurm"). 21.08 -> 22.05 -> 23.02 -> 23.11:
# 23.11 still accepts 22.05, not 21.08; 24.11 accepts 23.02, 23.11 and 24.05.
SLURM_RELEASES = ["20.02", "20.11", "21.08", "22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11"]
THREE_BACK_FROM = "24.11"


def releases_back(release: str) -> int:
    """How many previous major releases ``release`` works with and upgrades from."""
    return 3 if SLURM_RELEASES.index(release) >= SLURM_RELEASES.index(THREE_BACK_FROM) else 2


def node_release(m: Manifest, os_name: str) -> str:
    """The Slurm release a Slurm node on ``os_name`` runs: its OS's, or the built one."""
    return built_release(m) or SLURM_VERSION_BY_OS[os_name]


def slurm_versions(m: Manifest) -> dict[str, str]:
    """Slurm release per Slurm node (controller, slurmd nodes, login clients)."""
    nodes = [controller(m), *slurm_nodes(m), *client_nodes(m)]
    return {n.name: node_release(m, n.os) for n in nodes}


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def cgroups_usable(m: Manifest) -> bool:
    """Whether every slurmd node can use Slurm's cgroup plugins.

    Ubuntu 22.04 runs the unified cgroup v2 hierarchy and ships Slurm 21.08, which only has
    cgroup/v1, so a cluster with such a slurmd node falls back to proctrack/linuxproc and
    task/affinity (no core/memory/device fencing; reported by :func:`problems`). A built Slurm
    (``slurm.source: build``) has cgroup/v2 on every node."""
    return all(_version_tuple(node_release(m, n.os)) >= CGROUP_V2_MIN_VERSION for n in slurm_nodes(m))


@dataclass(frozen=True)
class CgroupPlan:
    """Plugins in slurm.conf and the constraints in cgroup.conf."""

    use_cgroups: bool
    proctrack_type: str
    task_plugin: str
    jobacct_gather_type: str
    constrain_cores: bool
    constrain_memory: bool
    constrain_devices: bool


def cgroup_plan(m: Manifest) -> CgroupPlan:
    if cgroups_usable(m):
        return CgroupPlan(
            use_cgroups=True,
            proctrack_type="proctrack/cgroup",
            task_plugin="task/cgroup,task/affinity",
            jobacct_gather_type="jobacct_gather/cgroup",
            constrain_cores=m.slurm.constrain_cores,
            constrain_memory=m.slurm.constrain_memory,
            constrain_devices=m.slurm.constrain_devices,
        )
    return CgroupPlan(
        use_cgroups=False,
        proctrack_type="proctrack/linuxproc",
        task_plugin="task/affinity",
        jobacct_gather_type="jobacct_gather/linux",
        constrain_cores=False,
        constrain_memory=False,
        constrain_devices=False,
    )


def problems(m: Manifest) -> list[str]:
    """Warnings about the Slurm section for ``provision validate``/``plan`` (nothing fatal:
    the rendered configuration stays valid, but it is not what the manifest asks for).
    Partition references are checked by provisioner.manifest.checks.check_slurm, Slurm
    releases that cannot work together by :func:`version_conflicts` (errors)."""
    if not m.slurm.enabled:
        return []
    out: list[str] = []
    compute = {n.name for n in slurm_nodes(m)}
    if not compute:
        out.append("slurm is enabled but no node has role 'compute': no slurmd will run")
    plan = cgroup_plan(m)
    wanted = m.slurm.constrain_cores or m.slurm.constrain_memory or m.slurm.constrain_devices
    if not plan.use_cgroups and wanted:
        old = sorted(n.name for n in slurm_nodes(m) if n.os == "ubuntu-22.04")
        out.append(
            "slurm: Ubuntu 22.04 ships Slurm 21.08, which has no cgroup v2 support, and "
            f"Ubuntu 22.04 uses cgroup v2 ({hostlist(old)}): cores, memory and GPUs are NOT "
            "fenced (proctrack/linuxproc, task/affinity); use slurm.source: build (one Slurm with "
            "cgroup v2 built for every node), or ubuntu-24.04 or debian-12, for ConstrainDevices"
        )
    return out


BUILD_FIX = "slurm.source: build (one Slurm built for every node, whatever its OS release)"


def _os_with(version: str) -> str:
    return next(os_name for os_name, v in SLURM_VERSION_BY_OS.items() if v == version)


def version_conflicts(m: Manifest) -> list[tuple[Node, str]]:
    """Slurm nodes whose release the controller's slurmctld cannot work with (errors for
    ``provision validate``): a slurmd or client newer than slurmctld cannot register or
    talk to it, and slurmctld only talks to its own and the two previous releases. One
    entry per manifest node entry and OS (a ranged entry is reported once, naming all its
    nodes), as (first node of the entry, message with the fix)."""
    if not m.slurm.enabled:
        return []
    if built_release(m):
        return []  # one Slurm on every node
    ctl = controller(m)
    ctl_version = SLURM_VERSION_BY_OS[ctl.os]
    ctl_idx = SLURM_RELEASES.index(ctl_version)
    entries: dict[tuple[int, str], list[Node]] = {}
    for node in (*slurm_nodes(m), *client_nodes(m)):
        if node.name != ctl.name:
            entries.setdefault((node.source_index, node.os), []).append(node)
    newest = max(slurm_versions(m).values(), key=SLURM_RELEASES.index)
    out: list[tuple[Node, str]] = []
    for (_, os_name), nodes in entries.items():
        version = SLURM_VERSION_BY_OS[os_name]
        idx = SLURM_RELEASES.index(version)
        names = hostlist(n.name for n in nodes)
        if idx > ctl_idx:
            out.append((nodes[0], (
                f"{names} ({os_name}) would run Slurm {version}, newer than Slurm {ctl_version} "
                f"of the controller {ctl.name} ({ctl.os}): slurmctld must be the newest, a newer "
                f"slurmd or client cannot register with it. Fix: os: {_os_with(newest)} for "
                f"{ctl.name} (Slurm {newest}), or os: {ctl.os} for {names}, or {BUILD_FIX}")))
        elif ctl_idx - idx > releases_back(ctl_version):
            out.append((nodes[0], (
                f"{names} ({os_name}) would run Slurm {version}, more than two releases older "
                f"than Slurm {ctl_version} of the controller {ctl.name} ({ctl.os}), which only "
                f"talks to its own and the two previous releases. Fix: os: {ctl.os} for {names}, or "
                f"{BUILD_FIX}")))
    return out
