"""The storage sections: ``zfs:`` pools and datasets, ``nfs:`` exports and mounts, ``mergerfs:``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from provisioner.manifest.fields import AbsPath, PropertyValue, Strict

SIZE_RE = re.compile(r"^\d+(\.\d+)?[KMGT]?$")


class VdevGroup(Strict):
    type: Literal["mirror", "raidz1", "raidz2", "raidz3", "stripe"] = "mirror"
    width: int = Field(default=2, ge=1, le=32)
    disks: list[str] = Field(min_length=1)


class SnapshotPolicy(Strict):
    """How many snapshots of each frequency a dataset keeps (0: none taken). The frequencies
    are provisioner.areas.storage.snapshots.PERIODS (a unit test keeps the two equal)."""

    hourly: int = Field(default=0, ge=0, le=10000)
    daily: int = Field(default=0, ge=0, le=10000)
    weekly: int = Field(default=0, ge=0, le=10000)
    monthly: int = Field(default=0, ge=0, le=10000)

    def kept(self) -> dict[str, int]:
        """The frequencies kept, with their counts (empty: no snapshots)."""
        return {f: n for f, n in self.model_dump().items() if n > 0}


class Replication(Strict):
    """Where a dataset's snapshots are replicated: a pool on a storage node (another one, or a
    second pool of the same node), received as ``<pool>/<dataset>``. What it means and how it
    is checked: provisioner.areas.storage.zfs.replications and replication_problems."""

    to: str = Field(description="the storage node that receives the replica")
    pool: str = Field(description="that node's pool")
    dataset: str | None = Field(
        default=None, description="the replica's dataset relative to the pool; unset: the source dataset's name")

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str | None) -> str | None:
        if v is not None and not DATASET_RE.match(v):
            raise ValueError(f"{v!r} is not a dataset name relative to the pool (e.g. replica/imagenet)")
        return v


DATASET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*(/[A-Za-z0-9][A-Za-z0-9_.:-]*)*$")


class Dataset(Strict):
    name: str
    properties: dict[str, PropertyValue] = Field(default_factory=dict)
    snapshots: SnapshotPolicy | None = Field(
        default=None, description="snapshot retention; unset: the pool's snapshots, {}: none")
    replicate: Replication | None = Field(
        default=None, description="replicate the dataset's snapshots to a storage node's pool; unset: the pool's")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not DATASET_RE.match(v):
            raise ValueError(f"{v!r} is not a dataset name relative to the pool (e.g. data/imagenet)")
        return v


def _default_pool_properties() -> dict[str, str | int]:
    return {"compression": "lz4", "atime": "off", "xattr": "sa", "acltype": "posixacl"}


class ZfsPool(Strict):
    name: str
    node: str
    purpose: Literal["training-data", "general", "backup", "scratch"] = "general"
    vdevs: VdevGroup
    log: list[str] = Field(default_factory=list, description="SLOG devices; two or more are mirrored")
    cache: list[str] = Field(default_factory=list, description="L2ARC devices")
    special: VdevGroup | None = None
    ashift: int = Field(default=12, ge=9, le=16)
    force: bool = Field(default=False, description="allow creating the pool on disks with data")
    properties: dict[str, PropertyValue] = Field(default_factory=_default_pool_properties)
    datasets: list[Dataset] = Field(default_factory=list)
    snapshots: SnapshotPolicy | None = Field(
        default=None, description="snapshot retention of the datasets that set none of their own")
    replicate: Replication | None = Field(
        default=None, description="replication of the datasets that set none of their own (each as its name)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$", v) or v in {"mirror", "raidz", "spare", "log"}:
            raise ValueError(f"{v!r} is not a valid pool name")
        return v


class Zfs(Strict):
    arc_max_percent: int = Field(default=50, ge=5, le=90, description="ARC maximum, percent of RAM")
    # YAML 1.1 reads a bare `off` as false
    scrub: Annotated[Literal["weekly", "monthly", "off"], BeforeValidator(lambda v: "off" if v is False else v)] = (
        "monthly"
    )
    pools: list[ZfsPool] = Field(default_factory=list)


class NfsExport(Strict):
    name: str
    node: str
    path: AbsPath | None = None
    dataset: str | None = Field(default=None, description="pool/dataset; exported at its mountpoint")
    clients: list[str] = Field(default_factory=lambda: ["data"], description="network names or CIDRs")
    rw: bool = True
    root_squash: bool = True
    sync: bool = True
    options: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _path_or_dataset(self) -> NfsExport:
        if (self.path is None) == (self.dataset is None):
            raise ValueError("give exactly one of path or dataset")
        return self

    # The path of a dataset export is the dataset's ZFS mountpoint, which the zfs section
    # decides: provisioner.areas.storage.decide.export_path.


class NfsMount(Strict):
    export: str = Field(description="name of an nfs.exports entry")
    path: AbsPath
    nodes: list[str] = Field(min_length=1, description="node names, ranges or @role")
    vers: Literal["4.2", "4.1", "3"] = "4.2"
    nconnect: int = Field(default=8, ge=1, le=16)
    rsize: int = Field(default=1048576, ge=4096, le=1048576)
    wsize: int = Field(default=1048576, ge=4096, le=1048576)
    hard: bool = True
    proto: Literal["auto", "tcp", "rdma"] = "auto"
    automount: bool = False
    options: list[str] = Field(default_factory=list)


class Nfs(Strict):
    threads: int | None = Field(default=None, ge=8, le=1024, description="nfsd threads; default from cores")
    exports: list[NfsExport] = Field(default_factory=list)
    mounts: list[NfsMount] = Field(default_factory=list)


class MergerfsUnion(Strict):
    path: AbsPath
    branches: list[AbsPath] = Field(min_length=2)
    nodes: list[str] = Field(min_length=1)
    create_policy: Literal["epmfs", "mfs", "lfs", "pfrd", "rand", "ff", "epff", "eplfs", "lus"] = "pfrd"
    minfreespace: str = "50G"
    options: list[str] = Field(default_factory=list)

    @field_validator("minfreespace")
    @classmethod
    def _size(cls, v: str) -> str:
        if not SIZE_RE.match(v):
            raise ValueError(f"{v!r} is not a size like 50G or 500M")
        return v
