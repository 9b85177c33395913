"""Whole-manifest checks of the storage area: settings a node cannot carry out (e.g. an
RDMA mount without an InfiniBand interface), found by computing its role variables. Run by
``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.storage.base import StorageError
from provisioner.areas.storage.nfs import export_network_problems, nconnect_ignored
from provisioner.areas.storage.rolevars import node_vars
from provisioner.areas.storage.scratch import lacks_scratch, local_path_problem, mount_clash
from provisioner.areas.storage.zfs import replication_problems
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check, node_path
from provisioner.manifest.model import Manifest
from provisioner.manifest.ranges import contract
from provisioner.manifest.select import select_nodes
from provisioner.manifest.source import Source


def check_storage_vars(m: Manifest, src: Source) -> list[Diagnostic]:
    """Storage settings a node cannot carry out (e.g. an RDMA mount without an IB interface)."""
    out: list[Diagnostic] = []
    seen: set[str] = set()
    for node in m.nodes:
        try:
            node_vars(m, node)
        except StorageError as exc:
            if str(exc) not in seen:
                seen.add(str(exc))
                culprit = m.node(exc.node) if exc.node in m.node_names() else node
                out.append(src.diag(node_path(culprit), f"{culprit.name}: {exc}"))
    return out


def check_replications(m: Manifest, src: Source) -> list[Diagnostic]:
    """ZFS replications that cannot run (provisioner.areas.storage.zfs.replication_problems)."""
    return [src.diag(path, message) for path, message in replication_problems(m)]


def check_nconnect_over_rdma(m: Manifest, src: Source) -> list[Diagnostic]:
    """Warn where a manifest's nconnect is dropped because the mount runs over RDMA."""
    out: list[Diagnostic] = []
    for i, mount in enumerate(m.nfs.mounts):
        message = nconnect_ignored(m, mount)
        if message is not None:
            key = "nconnect" if "nconnect" in mount.model_fields_set else "options"
            out.append(src.diag(("nfs", "mounts", i, key), message, "warning"))
    return out


def check_export_networks(m: Manifest, src: Source) -> list[Diagnostic]:
    """An export limited to a network its server is not on cannot be mounted over it."""
    return [src.diag(("nfs", "exports", i, "clients", j), message)
            for i, export in enumerate(m.nfs.exports)
            for j, message in export_network_problems(m, export)]


def check_docker_data_root(m: Manifest, src: Source) -> list[Diagnostic]:
    """Docker's data-root must lie on a file system the manifest makes on each Docker node
    (its scratch, a ZFS dataset), or under /var/lib: else the images fill the root disk."""
    if not m.docker.enabled:
        return []
    problems: list[tuple[str, str]] = []
    for name in select_nodes(m, m.docker.nodes):
        try:
            problem = local_path_problem(m, m.node(name), m.docker.data_root, "docker.data_root")
        except StorageError:
            continue  # the node's own scratch problem is reported by check_storage_vars
        if problem is not None:
            problems.append((name, problem))
    if not problems:
        return []
    message = problems[0][1]
    if len(problems) > 1:
        others = contract([name for name, _ in problems[1:]])
        message += f" (the same on {', '.join(others)})"
    return [src.diag(("docker", "data_root"), message)]


def check_scratch_mount_points(m: Manifest, src: Source) -> list[Diagnostic]:
    """A node's scratch may not share its mount point with another file system there
    (said once per manifest entry: the first node's words)."""
    out: list[Diagnostic] = []
    seen: set[int] = set()
    for node in m.nodes:
        if node.source_index in seen:
            continue
        try:
            message = mount_clash(m, node)
        except StorageError:
            continue  # reported by check_storage_vars
        if message is not None:
            seen.add(node.source_index)
            where = ("scratch", "path") if node.scratch is not None else ("hardware", "disks")
            out.append(src.diag(node_path(node, *where), message))
    return out


def check_gpu_nodes_have_scratch(m: Manifest, src: Source) -> list[Diagnostic]:
    """Warn (once per manifest entry) where GPU compute nodes have no local scratch disk."""
    out: list[Diagnostic] = []
    by_entry: dict[int, list[str]] = {}
    for node in m.nodes:
        if lacks_scratch(node):
            by_entry.setdefault(node.source_index, []).append(node.name)
    for index, names in by_entry.items():
        out.append(src.diag(
            ("nodes", index, "hardware", "disks"),
            f"{', '.join(contract(names))}: GPU compute node without local scratch (no disk with use: scratch): "
            "staged datasets, container images and job tmp go to the root disk or NFS; give it its NVMe "
            "as use: scratch",
            "warning"))
    return out


CHECKS: tuple[Check, ...] = (check_export_networks, check_storage_vars, check_replications, check_nconnect_over_rdma,
                             check_docker_data_root, check_scratch_mount_points, check_gpu_nodes_have_scratch)
