"""Whole-manifest checks of the storage area: settings a node cannot carry out (e.g. an
RDMA mount without an InfiniBand interface), found by computing its role variables. Run by
``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.storage.base import StorageError
from provisioner.areas.storage.nfs import export_network_problems, nconnect_ignored
from provisioner.areas.storage.rolevars import node_vars
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check, node_path
from provisioner.manifest.model import Manifest
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


CHECKS: tuple[Check, ...] = (check_export_networks, check_storage_vars, check_nconnect_over_rdma)
