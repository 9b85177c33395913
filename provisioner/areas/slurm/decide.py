"""Slurm decisions taken from the manifest alone (pure), plus the munge key file.

Everything here is computed from the manifest, never from facts of other hosts, so that a
``--limit`` run still renders the whole cluster's slurm.conf. The role ``slurm`` formats
the structures returned here (templates/slurm.conf.j2, gres.conf.j2, cgroup.conf.j2);
``provisioner.areas.slurm.rolevars`` hands them over as role variables.

The only side effect is :func:`ensure_munge_key` (the cluster's MUNGE key in the state
directory).
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.manifest import ranges
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import SelectorError, select_nodes, selects
from provisioner.state import StateDir

MUNGE_KEY_BYTES = 1024
MUNGE_KEY_MIN_BYTES = 32  # munged refuses shorter keys

# Slurm shipped by each supported OS (package slurm-wlm). 21.08 has no cgroup/v2 plugin
# (added in 22.05) and Ubuntu 22.04 boots with the unified (v2) hierarchy by default.
SLURM_VERSION_BY_OS: dict[str, str] = {
    "debian-12": "22.05",
    "ubuntu-22.04": "21.08",
    "ubuntu-24.04": "23.11",
}
CGROUP_V2_MIN_VERSION = (22, 5)
# slurmctld talks to slurmd of its own and the two previous major releases.
# (21.08 -> 22.05 -> 23.02 -> 23.11: 23.11 still accepts 22.05, not 21.08.)
SLURM_RELEASES = ["21.08", "22.05", "23.02", "23.11"]


# --------------------------------------------------------------------------- hostlists
_NUM_TAIL = re.compile(r"^(?P<prefix>.*?)(?P<num>\d+)$")
_HOSTLIST_RE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[0-9,\-]+)\](?P<suffix>.*)$")


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def hostlist(names: Iterable[str]) -> str:
    """Compress host names into a Slurm hostlist expression: gpu01..gpu04 -> gpu[01-04].

    Zero-padded numbers (``01``) and unpadded ones (``1``) are kept in separate groups so
    that the expression expands (in Slurm and in :func:`expand_hostlist`) to exactly the
    names given. Groups keep the order in which their first name appears.
    """
    names = list(names)
    # a number as wide as a zero-padded one of its prefix joins that group: gpu0999 and
    # gpu1000 are one run, gpu[0999-1000]
    padded: dict[str, set[int]] = {}
    for name in names:
        m = _NUM_TAIL.match(name)
        if m and m.group("num").startswith("0") and len(m.group("num")) > 1:
            padded.setdefault(m.group("prefix"), set()).add(len(m.group("num")))
    groups: dict[tuple[str, int], list[int]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, int] | str] = []
    for name in names:
        m = _NUM_TAIL.match(name)
        if not m:
            if name not in plain:
                plain[name] = None
                order.append(name)
            continue
        num = m.group("num")
        width = len(num) if len(num) in padded.get(m.group("prefix"), ()) else 0
        key = (m.group("prefix"), width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(num))
    parts: list[str] = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, width = item
        spans = _ranges(groups[item])
        if len(spans) == 1 and spans[0][0] == spans[0][1]:
            parts.append(f"{prefix}{spans[0][0]:0{width}d}")
            continue
        body = ",".join(
            f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in spans
        )
        parts.append(f"{prefix}[{body}]")
    return ",".join(parts)


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression: a[1-3,7],b -> a1 a2 a3 a7 b; rack[1-2]-n[1-2] ->
    rack1-n1 rack1-n2 rack2-n1 rack2-n2. Raises ValueError on a malformed item."""
    return [name for item in ranges.split_outside_brackets(expr) if item for name in _expand_item(item)]


def _expand_item(item: str) -> list[str]:
    m = _HOSTLIST_RE.match(item)
    if not m:
        if "[" in item or "]" in item:
            raise ValueError(f"bad hostlist item {item!r}")
        return [item]
    heads: list[str] = []
    for span in m.group("body").split(","):
        lo_s, _, hi_s = span.partition("-")
        if not lo_s.isdigit() or not (hi_s or lo_s).isdigit():
            raise ValueError(f"bad hostlist item {item!r}")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        heads += [f"{m.group('prefix')}{i:0{width}d}" for i in range(int(lo_s), int(hi_s or lo_s) + 1)]
    tails = _expand_item(m.group("suffix")) if m.group("suffix") else [""]
    return [head + tail for head in heads for tail in tails]


# --------------------------------------------------------------------------- cluster shape
def slurm_nodes(m: Manifest) -> list[Node]:
    """Nodes that run slurmd: the compute nodes (a head node that is also compute included)."""
    return m.with_role("compute")


def controller(m: Manifest) -> Node:
    return m.head


def client_nodes(m: Manifest) -> list[Node]:
    """Nodes with client commands and slurm.conf only: login nodes that run no daemon."""
    daemons = {controller(m).name, *(n.name for n in slurm_nodes(m))}
    return [n for n in m.with_role("login") if n.name not in daemons]


def cluster_name(m: Manifest) -> str:
    return (m.slurm.cluster_name or m.cluster.name).lower()


def gpu_files(count: int) -> str:
    """Device files of ``count`` GPUs in gres.conf syntax: /dev/nvidia0 or /dev/nvidia[0-3]."""
    if count < 1:
        raise ValueError("a GPU count is at least 1")
    return "/dev/nvidia0" if count == 1 else f"/dev/nvidia[0-{count - 1}]"


def shared_mounts(m: Manifest, node: Node) -> list[str]:
    """Mount points the node must have (its NFS mounts and MergerFS unions, from the
    manifest): the health check drains a node that lacks one."""
    paths = [mnt.path for mnt in m.nfs.mounts if selects(m, mnt.nodes, node.name)]
    paths += [union.path for union in m.mergerfs if selects(m, union.nodes, node.name)]
    return sorted(set(paths))


def gres_string(node: Node) -> str:
    """``gpu:<type>:<count>`` for slurm.conf's Gres=, or "" for a node without GPUs."""
    gpu = node.hardware.gpu
    return f"gpu:{gpu.gres_type}:{gpu.count}" if gpu else ""


def _hardware_key(node: Node) -> tuple[int, int, int, int, str]:
    cpu = node.hardware.cpu
    return (cpu.sockets, cpu.cores_per_socket, cpu.threads_per_core,
            node.hardware.real_memory_mb, gres_string(node))


def node_definitions(m: Manifest) -> list[dict[str, Any]]:
    """One entry per group of identical slurmd nodes (NodeName lines), manifest order."""
    groups: dict[tuple[int, int, int, int, str], list[str]] = {}
    for node in slurm_nodes(m):
        groups.setdefault(_hardware_key(node), []).append(node.name)
    out: list[dict[str, Any]] = []
    for (sockets, cores, threads, mem, gres), names in groups.items():
        out.append({
            "name": hostlist(names),
            "sockets": sockets,
            "cores_per_socket": cores,
            "threads_per_core": threads,
            "real_memory_mb": mem,
            "gres": gres,
        })
    return out


def partitions(m: Manifest) -> list[dict[str, Any]]:
    """PartitionName entries. Members are limited to slurmd nodes and a partition left empty
    is dropped (the manifest checks reject such partitions; this keeps slurm.conf valid
    whatever the input). Without partitions in the manifest: one default
    partition ``compute`` with every compute node. Exactly one partition is the default."""
    compute = {n.name for n in slurm_nodes(m)}
    out: list[dict[str, Any]] = []
    if not m.slurm.partitions:
        if compute:
            out.append({"name": "compute", "nodes": hostlist(n.name for n in slurm_nodes(m)),
                        "default": True, "max_time": "INFINITE", "default_time": ""})
        return out
    for part in m.slurm.partitions:
        try:
            members = [n for n in select_nodes(m, part.nodes) if n in compute]
        except SelectorError:
            members = []
        if not members:
            continue
        out.append({
            "name": part.name,
            "nodes": hostlist(members),
            "default": part.default,
            "max_time": part.max_time,
            "default_time": part.default_time or "",
        })
    defaults = [p for p in out if p["default"]]
    for p in defaults[1:]:
        p["default"] = False
    if out and not defaults:
        out[0]["default"] = True
    return out


def default_mem_per_cpu(m: Manifest) -> int:
    """DefMemPerCPU (MB) so that a job without --mem does not take a whole node's memory:
    the smallest RealMemory per hardware thread over all slurmd nodes (0 = no nodes)."""
    per_cpu = [n.hardware.real_memory_mb // n.hardware.cpu.threads for n in slurm_nodes(m)]
    return min(per_cpu) if per_cpu else 0


def slurm_versions(m: Manifest) -> dict[str, str]:
    """Slurm release per Slurm node (controller, slurmd nodes, login clients)."""
    nodes = [controller(m), *slurm_nodes(m), *client_nodes(m)]
    return {n.name: SLURM_VERSION_BY_OS[n.os] for n in nodes}


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def cgroups_usable(m: Manifest) -> bool:
    """Whether every slurmd node can use Slurm's cgroup plugins.

    Ubuntu 22.04 runs the unified cgroup v2 hierarchy and ships Slurm 21.08, which only has
    cgroup/v1, so a cluster with such a slurmd node falls back to proctrack/linuxproc and
    task/affinity (no core/memory/device fencing; reported by :func:`problems`)."""
    return all(
        _version_tuple(SLURM_VERSION_BY_OS[n.os]) >= CGROUP_V2_MIN_VERSION for n in slurm_nodes(m)
    )


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
            "fenced (proctrack/linuxproc, task/affinity); use ubuntu-24.04 or debian-12 for "
            "ConstrainDevices"
        )
    return out


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
                f"{ctl.name} (Slurm {newest}), or os: {ctl.os} for {names}")))
        elif ctl_idx - idx > 2:
            out.append((nodes[0], (
                f"{names} ({os_name}) would run Slurm {version}, more than two releases older "
                f"than Slurm {ctl_version} of the controller {ctl.name} ({ctl.os}), which only "
                f"talks to its own and the two previous releases. Fix: os: {ctl.os} for {names}")))
    return out


# --------------------------------------------------------------------------- node facts
def fact_report(expected: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, list[str]]:
    """Compare what a node reports with what the manifest promises.

    ``expected``: the role variable ``slurm_node_expected`` (name, cpus, real_memory_mb,
    memory_gb, gpu_count, gpu_type, gpu_files). ``observed``: ``vcpus``, ``memtotal_mb``
    and ``gpu_devices`` (the /dev/nvidia<N> files present). ``errors`` are contradictions
    that would make slurmctld drain the node or hand out GPUs that do not exist;
    ``warnings`` are harmless differences (more hardware than the manifest says).
    """
    errors: list[str] = []
    warnings: list[str] = []
    name = str(expected.get("name", "this node"))
    cpus = int(expected.get("cpus", 0))
    vcpus = int(observed.get("vcpus", 0))
    if vcpus < cpus:
        errors.append(
            f"{name}: the manifest says {cpus} CPUs (sockets x cores_per_socket x "
            f"threads_per_core) but the node has {vcpus}; fix hardware.cpu in the manifest"
        )
    real_mem = int(expected.get("real_memory_mb", 0))
    mem_gb = int(expected.get("memory_gb", 0))
    memtotal = int(observed.get("memtotal_mb", 0))
    if memtotal < real_mem:
        errors.append(
            f"{name}: the node has {memtotal} MB of memory, less than RealMemory={real_mem} MB "
            f"derived from memory_gb: {mem_gb} in the manifest; fix hardware.memory_gb (or a "
            "missing DIMM)"
        )
    elif mem_gb and memtotal > mem_gb * 1024 * 1.1:
        warnings.append(
            f"{name}: the node has {memtotal} MB of memory, more than memory_gb: {mem_gb} in "
            "the manifest; Slurm only hands out the manifest's amount"
        )
    want = int(expected.get("gpu_count", 0))
    found = sorted(str(d) for d in observed.get("gpu_devices", []) or [])
    if want:
        wanted = expand_hostlist(str(expected.get("gpu_files", gpu_files(want))))
        missing = [d for d in wanted if d not in found]
        if missing:
            gpu_type = expected.get("gpu_type", "gpu")
            errors.append(
                f"{name}: the manifest says {want} GPU(s) ({gpu_type}) but "
                f"{', '.join(missing)} missing ({len(found)} /dev/nvidia<N> found: "
                f"{', '.join(found) or 'none'}); fix hardware.gpu.count in the manifest or the "
                "node (driver loaded? GPU seated?)"
            )
    if len(found) > want:
        warnings.append(
            f"{name}: {len(found)} GPU device files found, the manifest says {want}; the extra "
            "GPUs are not given to Slurm"
        )
    return {"errors": errors, "warnings": warnings}


# --------------------------------------------------------------------------- munge key
MUNGE_KEY_NAME = "munge.key"  # in the state directory's secrets/ (rolevars: munge_key_file)


def prepare_munge_key(loaded: Loaded, state: StateDir) -> None:
    """The slurm area's ``prepare`` step (provisioner.areas.registry): the cluster's munge
    key exists before a run whenever the manifest enables Slurm."""
    if loaded.manifest.slurm.enabled:
        ensure_munge_key(state.secrets / MUNGE_KEY_NAME)


def secret_values(state: StateDir) -> list[str]:
    """The munge key as it could appear in a run's artifacts (hex, base64), for the artifact
    scan of ``provision apply``; none before the key exists."""
    key = state.secrets / MUNGE_KEY_NAME
    if not key.exists():
        return []
    raw = key.read_bytes()
    return [raw.hex(), base64.b64encode(raw).decode()]


def ensure_munge_key(path: Path) -> None:
    """Create the cluster's MUNGE key (1024 random bytes, mode 0600) unless it exists.

    Created atomically: written to a temporary file in the same directory, then hard-linked
    into place, so a concurrent run never sees a partial key and never overwrites one. An
    existing key is kept (it is the cluster's identity); one that is not a regular file or
    is too short raises ``ValueError``; group/other permission bits are removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() or path.is_symlink():
        _check_existing_key(path)
        return
    fd = -1
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)  # the umask cannot widen it, but be explicit
        data = secrets.token_bytes(MUNGE_KEY_BYTES)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)
        except FileExistsError:
            _check_existing_key(path)  # another run won the race: keep its key
    except OSError as exc:  # a full disk says ENOSPC; the message must say where
        if exc.errno is not None:
            exc.filename = exc.filename or str(path)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _check_existing_key(path: Path) -> None:
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} exists but is not a regular file; refusing to use it as the munge key")
    if st.st_size < MUNGE_KEY_MIN_BYTES:
        raise ValueError(f"{path} holds {st.st_size} bytes; a munge key needs at least {MUNGE_KEY_MIN_BYTES}")
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
