"""The shape of the Slurm cluster, decided from the manifest alone (pure): which nodes run
slurmctld, slurmd or only the clients, their NodeName lines, the partitions and the memory
defaults.

Everything here is computed from the manifest, never from facts of other hosts, so that a
``--limit`` run still renders the whole cluster's slurm.conf. The role ``slurm`` formats
the structures returned here and in :mod:`provisioner.areas.slurm.releases` (templates/
slurm.conf.j2, gres.conf.j2, cgroup.conf.j2); ``provisioner.areas.slurm.rolevars`` hands
them over as role variables.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm.hostlist import hostlist
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import SelectorError, select_nodes, selects


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
