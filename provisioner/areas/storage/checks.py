"""Whole-manifest checks of the storage area: settings a node cannot carry out (e.g. an
RDMA mount without an InfiniBand interface), found by computing its role variables. Run by
``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.storage.decide import StorageError
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


CHECKS: tuple[Check, ...] = (check_storage_vars,)
