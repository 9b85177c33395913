"""MergerFS, pure: a union's mount options and the NFS mount units it is ordered after."""

from __future__ import annotations

import re

from provisioner.areas.storage.base import StorageError, merge_options
from provisioner.areas.storage.nfs import mounts_for
from provisioner.areas.storage.units import mount_unit, under
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import selects
from provisioner.manifest.storage import MergerfsUnion

# cache.files=off (direct I/O) breaks a read-only shared mmap through the union (ENODEV with
# mergerfs 2.33.5 on Debian 12), which numpy memmap, Arrow / HF datasets and LMDB use; with
# the page cache on (partial: cached while open, dropped on close) mmap works.
MERGERFS_CACHE_FILES_SINCE = (2, 28)  # cache.files replaced direct_io in mergerfs 2.28.0
MERGERFS_BASE_OPTIONS = ("allow_other", "cache.files=partial", "dropcacheonclose=true")


def mergerfs_cache_option(version: str) -> str:
    """The page-cache option of a mergerfs version that keeps shared mmap working (for the
    mergerfs role to check the version it installed: every supported OS ships 2.33)."""
    numbers = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    if len(numbers) < 2:
        raise StorageError(f"{version!r} is not a mergerfs version")
    if numbers[:2] < MERGERFS_CACHE_FILES_SINCE:
        raise StorageError(f"mergerfs {version} predates cache.files (2.28); shared mmap through the union "
                           "needs a newer mergerfs")
    return "cache.files=partial"


def mergerfs_options(union: MergerfsUnion, network: bool) -> list[str]:
    """Mount options of a union. ``network``: a branch lives on a network mount; then
    ``_netdev`` makes systemd order the union after the network (with a local union's
    implicit Before=local-fs.target, requiring an NFS mount would be an ordering cycle)."""
    generated = [
        *MERGERFS_BASE_OPTIONS,
        f"category.create={union.create_policy}",
        f"minfreespace={union.minfreespace}",
    ]
    if network:
        generated.append("_netdev")
    return merge_options(generated, union.options)


def unions_for(m: Manifest, node: Node) -> list[MergerfsUnion]:
    return [u for u in m.mergerfs if selects(m, u.nodes, node.name)]


def union_mount_units(m: Manifest, union: MergerfsUnion, node: Node) -> list[str]:
    """Mount units of this node's NFS mounts that hold a branch (the branch itself or a
    parent of it): the union Requires= and starts After= them."""
    units: list[str] = []
    for mount in mounts_for(m, node):
        if any(under(branch, mount.path) for branch in union.branches):
            unit = mount_unit(mount.path)
            if unit not in units:
                units.append(unit)
    return units
