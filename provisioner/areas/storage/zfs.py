"""ZFS, pure: the vdev layout of a pool spec, the ``zpool create`` arguments, drift between
an existing pool (``zpool status -P``) and the manifest, importable pools, ARC sizing, the
snapshot policy of each dataset (what the policies mean: ``snapshots``), the replications
and their problems (what runs on the nodes: ``replicate``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.areas.storage.base import BY_ID_DIR, StorageError
from provisioner.manifest.model import Manifest
from provisioner.manifest.ranges import expand_all
from provisioner.manifest.storage import Replication, SnapshotPolicy, ZfsPool


@dataclass(frozen=True)
class Vdev:
    """One top-level vdev: ``kind`` is mirror, raidz1..3, draid... or ``disk`` (single)."""

    kind: str
    disks: tuple[str, ...]

    def key(self) -> tuple[str, tuple[str, ...]]:
        """Order-insensitive identity (disk order inside a vdev does not matter)."""
        return (self.kind, tuple(sorted(self.disks)))

    def describe(self) -> str:
        if self.kind == "disk":
            return self.disks[0]
        return f"{self.kind}({', '.join(self.disks)})"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "disks": list(self.disks)}


VDEV_CLASSES = ("data", "log", "special", "dedup", "cache", "spare")


@dataclass(frozen=True)
class PoolLayout:
    """The vdevs of a pool by allocation class (cache and spare devices are single disks)."""

    data: tuple[Vdev, ...]
    log: tuple[Vdev, ...] = ()
    special: tuple[Vdev, ...] = ()
    dedup: tuple[Vdev, ...] = ()
    cache: tuple[Vdev, ...] = ()
    spare: tuple[Vdev, ...] = ()

    def group(self, cls: str) -> tuple[Vdev, ...]:
        value: tuple[Vdev, ...] = getattr(self, cls)
        return value

    def disks(self) -> list[str]:
        return [d for cls in VDEV_CLASSES for v in self.group(cls) for d in v.disks]

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {cls: [v.to_dict() for v in self.group(cls)] for cls in VDEV_CLASSES}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolLayout:
        unknown = set(data) - set(VDEV_CLASSES)
        if unknown:
            raise StorageError(f"unknown vdev class(es) {sorted(unknown)}; known: {VDEV_CLASSES}")
        groups: dict[str, tuple[Vdev, ...]] = {}
        for name in VDEV_CLASSES:
            items = data.get(name) or []
            groups[name] = tuple(Vdev(str(i["type"]), tuple(str(d) for d in i["disks"])) for i in items)
        return cls(**groups)

    def summary(self) -> str:
        """Short text like ``4 x mirror(2) + log: 1 disk + cache: 1 disk``."""
        parts: list[str] = []
        for cls in VDEV_CLASSES:
            vdevs = self.group(cls)
            if not vdevs:
                continue
            counts = Counter(
                "disk" if v.kind == "disk" else f"{v.kind}({len(v.disks)})" for v in vdevs
            )
            text = ", ".join(
                f"{n} x {what}" if what != "disk" else f"{n} disk{'s' if n > 1 else ''}"
                for what, n in counts.items()
            )
            parts.append(text if cls == "data" else f"{cls}: {text}")
        return " + ".join(parts)


_MIN_WIDTH = {"mirror": 2, "raidz1": 3, "raidz2": 4, "raidz3": 5, "stripe": 1}


def group_vdevs(vtype: str, width: int, disks: Sequence[str]) -> tuple[Vdev, ...]:
    """Cut ``disks`` into top-level vdevs of ``width`` disks, in the order given.

    Consecutive disks form a group (disk 1+2, 3+4, ...). ``stripe`` makes every disk its own
    vdev. Raises StorageError when the disks do not divide evenly.
    """
    if vtype not in _MIN_WIDTH:
        raise StorageError(f"unknown vdev type {vtype!r}")
    if not disks:
        raise StorageError("a vdev group needs at least one disk")
    if len(set(disks)) != len(disks):
        dup = next(d for d in disks if list(disks).count(d) > 1)
        raise StorageError(f"disk {dup!r} is listed twice")
    if vtype == "stripe":
        return tuple(Vdev("disk", (d,)) for d in disks)
    if width < _MIN_WIDTH[vtype]:
        raise StorageError(f"a {vtype} group needs a width of at least {_MIN_WIDTH[vtype]}")
    if len(disks) % width:
        raise StorageError(f"{len(disks)} disks do not divide into {vtype} groups of {width}")
    return tuple(Vdev(vtype, tuple(disks[i : i + width])) for i in range(0, len(disks), width))


def log_vdevs(devices: Sequence[str]) -> tuple[Vdev, ...]:
    """SLOG: one device stands alone; two or more form one mirror (a lost SLOG loses writes)."""
    if not devices:
        return ()
    if len(devices) == 1:
        return (Vdev("disk", (devices[0],)),)
    return (Vdev("mirror", tuple(devices)),)


def pool_layout(pool: ZfsPool) -> PoolLayout:
    """The layout a manifest pool asks for (disk ranges expanded)."""
    data = group_vdevs(pool.vdevs.type, pool.vdevs.width, expand_all(pool.vdevs.disks))
    special: tuple[Vdev, ...] = ()
    if pool.special is not None:
        special = group_vdevs(pool.special.type, pool.special.width, expand_all(pool.special.disks))
    layout = PoolLayout(
        data=data,
        log=log_vdevs(expand_all(pool.log)),
        special=special,
        cache=tuple(Vdev("disk", (d,)) for d in expand_all(pool.cache)),
    )
    all_disks = layout.disks()
    if len(set(all_disks)) != len(all_disks):
        dup = next(d for d in all_disks if all_disks.count(d) > 1)
        raise StorageError(f"pool {pool.name!r}: disk {dup!r} is used twice")
    return layout


def disk_path(disk: str) -> str:
    return f"{BY_ID_DIR}/{disk}"


def vdev_args(layout: PoolLayout) -> list[str]:
    """The vdev part of ``zpool create``: ``mirror A B mirror C D log E cache F``."""
    args: list[str] = []
    keyword = {"data": None, "log": "log", "special": "special", "dedup": "dedup",
               "cache": "cache", "spare": "spare"}
    for cls in VDEV_CLASSES:
        vdevs = layout.group(cls)
        if not vdevs:
            continue
        if keyword[cls]:
            args.append(str(keyword[cls]))
        for v in vdevs:
            if v.kind != "disk":
                args.append(v.kind)
            args.extend(disk_path(d) for d in v.disks)
    return args


def property_text(value: str | int) -> str:
    if isinstance(value, bool):  # defensive: the model turns YAML booleans into on/off
        return "on" if value else "off"
    return str(value)


def create_args(pool: ZfsPool) -> list[str]:
    """Arguments after ``zpool``: ``create [-f] -o ashift=N -O prop=value ... NAME VDEVS``.

    ``-f`` only when the manifest says ``force: true``: it lets zpool overwrite disks with
    existing labels, so the role's own safety check decides before zpool ever runs.
    """
    args = ["create"]
    if pool.force:
        args.append("-f")
    args += ["-o", f"ashift={pool.ashift}"]
    for key in sorted(pool.properties):
        args += ["-O", f"{key}={property_text(pool.properties[key])}"]
    args.append(pool.name)
    args += vdev_args(pool_layout(pool))
    return args


def snapshot_policies(pool: ZfsPool) -> dict[str, dict[str, int]]:
    """``{pool/dataset: {frequency: count}}`` of the pool's datasets that keep snapshots:
    a dataset's own ``snapshots`` else the pool's; one that keeps nothing is left out."""
    out: dict[str, dict[str, int]] = {}
    for ds in pool.datasets:
        policy: SnapshotPolicy | None = ds.snapshots if ds.snapshots is not None else pool.snapshots
        kept = policy.kept() if policy is not None else {}
        if kept:
            out[f"{pool.name}/{ds.name}"] = kept
    return out


@dataclass(frozen=True)
class Replica:
    """One replicated dataset: ``source`` on ``node`` to ``target`` on ``to``, over SSH to
    ``host`` (``to``'s data address where both nodes are on the data network, else its
    management one) from ``origin`` (the source's address there, which the target allows);
    ``policy`` is the source's retention, which the target keeps too. ``path`` is the
    manifest's ``replicate`` entry it comes from (a pool's or a dataset's)."""

    node: str
    source: str  # pool/dataset
    to: str
    target: str  # pool/dataset on ``to``
    host: str
    origin: str
    policy: dict[str, int]
    path: tuple[str | int, ...]

    def to_vars(self) -> dict[str, Any]:
        return {"source": self.source, "to": self.to, "target": self.target, "host": self.host,
                "policy": dict(self.policy)}


def replication_of(pool: ZfsPool, index: int) -> tuple[Replication | None, tuple[str | int, ...]]:
    """The ``replicate`` that applies to the pool's dataset ``index`` (its own, else the
    pool's) and where the manifest says it."""
    ds = pool.datasets[index]
    if ds.replicate is not None:
        return ds.replicate, ("datasets", index, "replicate")
    return pool.replicate, ("replicate",)


def ssh_addresses(m: Manifest, source_node: str, target_node: str) -> tuple[str, str]:
    """(target host, source address) of a replication's SSH: the data network where both
    nodes are on it, else management."""
    src, dst = m.node(source_node), m.node(target_node)
    if "data" in src.interfaces and "data" in dst.interfaces:
        return str(dst.interfaces["data"].ip), str(src.interfaces["data"].ip)
    return str(dst.ip), str(src.ip)


def replications(m: Manifest) -> list[Replica]:
    """Every replicated dataset of the manifest, in manifest order. Assumes a manifest
    without :func:`replication_problems` (validate reports those first)."""
    out: list[Replica] = []
    for p, pool in enumerate(m.zfs.pools):
        policies = snapshot_policies(pool)
        for i, ds in enumerate(pool.datasets):
            rep, where = replication_of(pool, i)
            if rep is None or rep.to not in m.node_names():
                continue
            host, origin = ssh_addresses(m, pool.node, rep.to)
            source = f"{pool.name}/{ds.name}"
            out.append(Replica(pool.node, source, rep.to, f"{rep.pool}/{rep.dataset or ds.name}", host, origin,
                               policies.get(source, {}), ("zfs", "pools", p, *where)))
    return out


def replication_problems(m: Manifest) -> list[tuple[tuple[str | int, ...], str]]:
    """Why a manifest's replications cannot run, each at its ``replicate`` entry: the target
    is not a storage node with that pool, the replica is the source itself, another
    replica, or a dataset the manifest creates; its parent does not exist; the source takes
    no snapshots (there would be nothing to send); a pool's default names one dataset."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    pools = {(pool.node, pool.name): pool for pool in m.zfs.pools}
    declared = {(pool.node, f"{pool.name}/{ds.name}") for pool in m.zfs.pools for ds in pool.datasets}
    seen: dict[tuple[str, str], str] = {}
    for p, pool in enumerate(m.zfs.pools):
        if pool.replicate is not None and pool.replicate.dataset is not None:
            out.append((("zfs", "pools", p, "replicate", "dataset"),
                        "a pool's replicate cannot name one dataset for all of them: each is received as "
                        f"{pool.replicate.pool}/<its name>; set dataset on a dataset's own replicate"))
            continue
        policies = snapshot_policies(pool)
        for i, ds in enumerate(pool.datasets):
            rep, where = replication_of(pool, i)
            if rep is None:
                continue
            at = ("zfs", "pools", p, *where)
            source = f"{pool.name}/{ds.name}"
            if rep.to not in m.node_names():
                out.append(((*at, "to"), f"{rep.to!r} is not a node of the manifest"))
                continue
            if not m.node(rep.to).has_role("storage"):
                out.append(((*at, "to"), f"{rep.to} is not a storage node (roles: [storage])"))
                continue
            target_pool = pools.get((rep.to, rep.pool))
            if target_pool is None:
                have = sorted(name for node, name in pools if node == rep.to)
                out.append(((*at, "pool"), f"{rep.to} has no pool {rep.pool!r}"
                            + (f" (its pools: {', '.join(have)})" if have else " (it has none in zfs.pools)")))
                continue
            target = f"{rep.pool}/{rep.dataset or ds.name}"
            if (rep.to, target) == (pool.node, source):
                out.append((at, f"{source} cannot be replicated onto itself: name another pool or dataset"))
                continue
            if (rep.to, target) in declared:
                out.append((at, f"the replica {target} on {rep.to} is a dataset of the manifest: the zfs role "
                                "creates it, and zfs receive does not overwrite one; name a dataset the "
                                "replication alone creates"))
                continue
            parent = target.rsplit("/", 1)[0]
            if parent != rep.pool and (rep.to, parent) not in declared:
                out.append((at, f"the replica's parent {parent} is not a dataset of {rep.to}'s pool "
                                f"{rep.pool} in the manifest (zfs receive does not create parents)"))
                continue
            if (rep.to, target) in seen:
                out.append((at, f"{source} and {seen[(rep.to, target)]} are both replicated to {target} on {rep.to}"))
                continue
            seen[(rep.to, target)] = source
            if source not in policies:
                out.append((at, f"{source} takes no snapshots (snapshots: on the dataset or its pool): "
                                "replication sends the snapshots it takes"))
    return out


def arc_max_bytes(memory_gb: int, percent: int) -> int:
    """zfs_arc_max in bytes: ``percent`` of the node's RAM (GiB as the manifest gives it)."""
    if not 0 < percent <= 100:
        raise StorageError(f"ARC percent {percent} is outside 1..100")
    return memory_gb * 1024**3 * percent // 100


# =========================================================================== zpool status
_TOP_VDEV_RE = re.compile(r"^(mirror|raidz[123]|draid[123]?(:[^-\s]+)?)-\d+$")
_TRANSIENT_RE = re.compile(r"^(replacing|spare)-\d+$")
_CLASS_HEADERS = {"logs": "log", "cache": "cache", "special": "special", "dedup": "dedup",
                  "spares": "spare"}


def normalize_disk(name: str) -> str:
    """``/dev/disk/by-id/ata-X-part1`` -> ``ata-X`` (ZFS partitions whole disks itself)."""
    name = name.removeprefix(BY_ID_DIR + "/")
    if name.startswith("/dev/"):
        return name
    return re.sub(r"-part\d+$", "", name)


def _vdev_kind(name: str) -> str:
    kind = name.rsplit("-", 1)[0]
    if kind == "raidz":
        return "raidz1"
    return kind.split(":")[0]


def parse_zpool_status(text: str) -> PoolLayout:
    """Parse the ``config:`` block of ``zpool status -P POOL`` into a PoolLayout.

    Indentation (two spaces per level after the leading tab) gives the tree: the pool and
    class headers (logs, cache, special, dedup, spares) at level 0, top-level vdevs at 1,
    their disks below. A missing disk shown by GUID with ``was /dev/...`` counts by its path.
    """
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "config:")
    except StopIteration:
        raise StorageError("no 'config:' section in zpool status output") from None
    groups: dict[str, list[list[Any]]] = {cls: [] for cls in VDEV_CLASSES}
    current_class: str | None = None
    current: list[Any] | None = None  # [kind, [disks]] of the open top-level vdev
    header_seen = False
    for raw in lines[start + 1 :]:
        if not raw.strip():
            if header_seen and current_class is not None:
                break
            continue
        if raw.startswith("errors:"):
            break
        body = raw[1:] if raw.startswith("\t") else raw
        indent = len(body) - len(body.lstrip(" "))
        fields = body.split()
        name = fields[0]
        if name == "NAME" and not header_seen:
            header_seen = True
            continue
        was = re.search(r"\bwas (/\S+)", body)
        if was:
            name = was.group(1)
        level = indent // 2
        if level == 0:
            current_class = _CLASS_HEADERS.get(name, "data" if current_class is None else None)
            if current_class is None:
                raise StorageError(f"unexpected top-level entry {name!r} in zpool status")
            current = None
            continue
        if current_class is None:
            raise StorageError(f"vdev {name!r} before the pool line in zpool status")
        if level == 1:
            is_group = _TOP_VDEV_RE.match(name) is not None
            current = [_vdev_kind(name), []] if is_group else ["disk", [normalize_disk(name)]]
            groups[current_class].append(current)
            continue
        if current is None or _TRANSIENT_RE.match(name):
            continue
        current[1].append(normalize_disk(name))
    if current_class is None:
        raise StorageError("no pool found in zpool status output")
    return PoolLayout(
        **{cls: tuple(Vdev(str(k), tuple(d)) for k, d in groups[cls]) for cls in VDEV_CLASSES}
    )


def layout_drift(expected: PoolLayout, actual: PoolLayout) -> list[str]:
    """Differences between the manifest's layout and the pool's, one sentence each.

    Vdev order and disk order inside a vdev do not matter. An empty list means no drift.
    """
    out: list[str] = []
    for cls in VDEV_CLASSES:
        want = Counter(v.key() for v in expected.group(cls))
        have = Counter(v.key() for v in actual.group(cls))
        for key in sorted((want - have).elements()):
            out.append(f"{cls}: {Vdev(*key).describe()} is in the manifest but not in the pool")
        for key in sorted((have - want).elements()):
            out.append(f"{cls}: {Vdev(*key).describe()} is in the pool but not in the manifest")
    return out


def status_drift(status_text: str, expected: Mapping[str, Any]) -> list[str]:
    """``layout_drift`` from raw ``zpool status -P`` text and a layout dict (role variable)."""
    return layout_drift(PoolLayout.from_dict(expected), parse_zpool_status(status_text))


_IMPORT_POOL_RE = re.compile(r"^\s*pool:\s*(\S+)\s*$", re.MULTILINE)


def importable_pools(text: str) -> list[str]:
    """Pool names listed by ``zpool import`` (pools on attached disks, not yet imported)."""
    return _IMPORT_POOL_RE.findall(text)
