"""provisioner.areas.storage.mergerfs: union options and the NFS mounts a union is ordered after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import base, mergerfs
from provisioner.manifest import Manifest
from provisioner.manifest.storage import MergerfsUnion

ROOT = Path(__file__).resolve().parents[3]
HGST = "ata-HGST_HUS726T6TALE6L4_V8G0000"


# =========================================================================== MergerFS
def test_mergerfs_options_and_order(lab: Manifest) -> None:
    union = lab.mergerfs[0]
    assert mergerfs.mergerfs_options(union, network=True) == [
        "allow_other", "cache.files=partial", "dropcacheonclose=true",
        "category.create=mfs", "minfreespace=500G", "_netdev",
    ]
    local = MergerfsUnion(path="/u", branches=["/a", "/b"], nodes=["n"], create_policy="ff",
                          options=["minfreespace=10G", "moveonenospc=true"])
    assert mergerfs.mergerfs_options(local, network=False) == [
        "allow_other", "cache.files=partial", "dropcacheonclose=true", "category.create=ff",
        "minfreespace=10G", "moveonenospc=true",
    ]


@pytest.mark.parametrize(("version", "option"), [
    ("2.33.5", "cache.files=partial"), ("2.40.2", "cache.files=partial"), ("mergerfs v2.28.0", "cache.files=partial"),
])
def test_mergerfs_keeps_shared_mmap_working(version: str, option: str) -> None:
    """cache.files=off made a read-only shared mmap through the union fail (issue 19 item 14)."""
    assert mergerfs.mergerfs_cache_option(version) == option
    assert option in mergerfs.MERGERFS_BASE_OPTIONS
    assert "cache.files=off" not in mergerfs.MERGERFS_BASE_OPTIONS


def test_mergerfs_before_cache_files_is_refused() -> None:
    with pytest.raises(base.StorageError, match=r"predates cache\.files"):
        mergerfs.mergerfs_cache_option("2.24.2")
    with pytest.raises(base.StorageError, match="not a mergerfs version"):
        mergerfs.mergerfs_cache_option("unknown")


def test_union_requires_the_nfs_mounts_holding_its_branches(lab: Manifest, kit: Any) -> None:
    gpu1 = lab.node("gpu1")
    assert mergerfs.union_mount_units(lab, lab.mergerfs[0], gpu1) == ["mnt-corpus1.mount", "mnt-corpus2.mount"]
    # a branch below a mount point needs that mount; an unrelated local branch needs none
    m = kit.load(kit.base(storage=True)).manifest
    union = MergerfsUnion(path="/u", branches=["/data/sub", "/scratch", "/datax"], nodes=["node01"])
    assert mergerfs.union_mount_units(m, union, m.node("node01")) == ["data.mount"]
    assert mergerfs.union_mount_units(m, union, m.node("head01")) == []
