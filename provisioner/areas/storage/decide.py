"""Storage and fabric decisions, pure: no I/O, no facts from other hosts.

* ZFS: the vdev layout of a pool spec, the ``zpool create`` argument list, the disk-safety
  decision from ``lsblk``/``wipefs`` observations, drift between an existing pool
  (``zpool status -P``) and the manifest, ARC sizing.
* NFS: /etc/exports lines, nfsd threads, client mount options, the server address a client
  mounts from, proto=rdma decisions.
* systemd: mount/automount unit names (``systemd-escape --path``), MergerFS ordering after
  the NFS mounts.
* Fabric: the opensm node, the IPoIB address, GPUDirect RDMA (nvidia-peermem).

The zfs role reaches the runtime parts (disk safety, drift, importable pools) through its
filter plugin, so the same code decides in unit tests and on real machines.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.manifest.model import (
    Manifest,
    MergerfsUnion,
    NetworkName,
    NfsExport,
    NfsMount,
    Node,
    ZfsPool,
)
from provisioner.manifest.ranges import contract, expand_all
from provisioner.manifest.select import select_nodes, selects

BY_ID_DIR = "/dev/disk/by-id"
NETWORK_NAMES: tuple[NetworkName, ...] = ("management", "bmc", "data", "infiniband")
NFS_RDMA_PORT = 20049


class StorageError(ValueError):
    """The manifest asks for something the storage logic cannot build. ``node`` names the
    node that has to change, when it is not the one whose variables were being computed
    (an RDMA mount on a client without InfiniBand, found while rendering the server)."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


# =========================================================================== ZFS layout
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


# =========================================================================== disk safety
@dataclass(frozen=True)
class DiskProbe:
    """What the target saw on one disk: ``lsblk --json`` and ``wipefs --json`` output."""

    disk: str
    exists: bool
    lsblk: Mapping[str, Any] | None = None
    signatures: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_outputs(cls, disk: str, exists: bool, lsblk_text: str, wipefs_text: str) -> DiskProbe:
        """Build a probe from raw command output (empty wipefs output: no signatures)."""
        lsblk: Mapping[str, Any] | None = None
        if lsblk_text.strip():
            try:
                lsblk = json.loads(lsblk_text)
            except json.JSONDecodeError as exc:
                raise StorageError(f"{disk}: unreadable lsblk output ({exc})") from None
        sigs: tuple[Mapping[str, Any], ...] = ()
        if wipefs_text.strip():
            try:
                sigs = tuple(json.loads(wipefs_text).get("signatures") or ())
            except (json.JSONDecodeError, AttributeError) as exc:
                raise StorageError(f"{disk}: unreadable wipefs output ({exc})") from None
        return cls(disk=disk, exists=exists, lsblk=lsblk, signatures=sigs)


@dataclass(frozen=True)
class Findings:
    """Why a disk may not be used: ``blocking`` always refuses, ``data`` unless forced."""

    blocking: tuple[str, ...] = ()
    data: tuple[str, ...] = ()


def _walk(dev: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield dev
    for child in dev.get("children") or ():
        yield from _walk(child)


def _mountpoints(dev: Mapping[str, Any]) -> list[str]:
    points = list(dev.get("mountpoints") or ())
    if dev.get("mountpoint"):
        points.append(dev["mountpoint"])
    return [str(p) for p in points if p]


def disk_findings(probe: DiskProbe) -> Findings:
    """Everything on a disk that says it is in use or holds data."""
    name = probe.disk
    if not probe.exists:
        return Findings(blocking=(f"{name}: not present under {BY_ID_DIR}",))
    blocking: list[str] = []
    data: list[str] = []
    devices = (probe.lsblk or {}).get("blockdevices") or []
    for top in devices:
        for dev in _walk(top):
            dname = dev.get("name", "?")
            for point in _mountpoints(dev):
                blocking.append(f"{name}: {dname} is in use (mounted at {point})")
            if dev is top:
                if dev.get("pttype"):
                    data.append(f"{name}: has a {dev['pttype']} partition table")
                if dev.get("fstype"):
                    data.append(f"{name}: holds a {dev['fstype']} signature")
            else:
                kind = dev.get("type", "part")
                what = f" ({dev['fstype']})" if dev.get("fstype") else ""
                data.append(f"{name}: has {kind} {dname}{what}")
    seen = {t for t in (d.get("pttype") for d in devices) if t} | {
        t for t in (d.get("fstype") for d in devices) if t
    }
    for sig in probe.signatures:
        kind = str(sig.get("type") or "unknown")
        if kind in seen:
            continue
        seen.add(kind)
        hint = " (a ZFS label: an old or foreign pool)" if kind == "zfs_member" else ""
        data.append(f"{name}: carries a {kind} signature at offset {sig.get('offset', '?')}{hint}")
    return Findings(blocking=tuple(blocking), data=tuple(data))


@dataclass(frozen=True)
class SafetyVerdict:
    ok: bool
    refused: tuple[str, ...] = ()  # reasons that stop the pool creation
    overridden: tuple[str, ...] = ()  # data found but accepted because of force: true

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "refused": list(self.refused), "overridden": list(self.overridden)}


def disk_safety(probes: Iterable[DiskProbe], force: bool) -> SafetyVerdict:
    """May a pool be created on these disks?

    Missing or mounted disks always refuse. Partitions, partition tables and filesystem
    (or ZFS) signatures refuse unless the manifest says ``force: true`` for the pool.
    """
    refused: list[str] = []
    overridden: list[str] = []
    for probe in probes:
        found = disk_findings(probe)
        refused.extend(found.blocking)
        (overridden if force else refused).extend(found.data)
    return SafetyVerdict(ok=not refused, refused=tuple(refused), overridden=tuple(overridden))


def probes_from_results(results: Iterable[Mapping[str, Any]]) -> list[DiskProbe]:
    """Probes from the role's observations: dicts with disk, exists, lsblk, wipefs (text)."""
    return [
        DiskProbe.from_outputs(
            str(r["disk"]), bool(r["exists"]), str(r.get("lsblk") or ""), str(r.get("wipefs") or "")
        )
        for r in results
    ]


def probes_from_ansible(
    lsblk_results: Sequence[Mapping[str, Any]], wipefs_results: Sequence[Mapping[str, Any]]
) -> list[DiskProbe]:
    """Probes from two registered Ansible loops over the pool's disks (``item`` = disk):
    ``lsblk --json`` (a non-zero rc means the disk is absent) and ``wipefs --json``."""
    wipefs_by_disk = {str(r.get("item")): str(r.get("stdout") or "") for r in wipefs_results}
    probes: list[DiskProbe] = []
    for r in lsblk_results:
        disk = str(r.get("item"))
        exists = r.get("rc") == 0
        probes.append(
            DiskProbe.from_outputs(
                disk,
                exists,
                str(r.get("stdout") or "") if exists else "",
                wipefs_by_disk.get(disk, "") if exists else "",
            )
        )
    return probes


# =========================================================================== networks
def node_network_ip(node: Node, net: NetworkName) -> str | None:
    iface = node.interfaces.get(net)
    return str(iface.ip) if iface is not None else None


def network_of(m: Manifest, client: str) -> NetworkName | None:
    """The manifest network a client entry names or lies in (None: outside all of them)."""
    if client in NETWORK_NAMES:
        return client
    cidr = ipaddress.IPv4Network(client, strict=False)
    for name in NETWORK_NAMES:
        net = getattr(m.networks, name)
        if net is not None and cidr.subnet_of(net.cidr):
            return name
    return None


# =========================================================================== NFS server
# Option pairs that contradict each other: a manifest option replaces the generated one.
_OPPOSITES = {
    "rw": "ro", "ro": "rw",
    "sync": "async", "async": "sync",
    "root_squash": "no_root_squash", "no_root_squash": "root_squash",
    "all_squash": "no_all_squash", "no_all_squash": "all_squash",
    "subtree_check": "no_subtree_check", "no_subtree_check": "subtree_check",
    "secure": "insecure", "insecure": "secure",
    "hard": "soft", "soft": "hard",
}


def merge_options(generated: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Generated options followed by the manifest's own; a manifest option overrides a
    generated one with the same key (``nconnect=4``) or its opposite (``async``)."""
    def key(opt: str) -> str:
        return opt.split("=", 1)[0]

    overridden = {key(o) for o in extra} | {_OPPOSITES.get(key(o), "") for o in extra}
    out = [o for o in generated if key(o) not in overridden]
    for o in extra:
        if o not in out:
            out.append(o)
    return out


def export_clients(m: Manifest, export: NfsExport) -> list[str]:
    """CIDRs allowed to mount: a network name becomes that network's CIDR."""
    out: list[str] = []
    for client in export.clients:
        if client in NETWORK_NAMES:
            net = getattr(m.networks, client)
            if net is None:
                raise StorageError(f"export {export.name!r}: network {client!r} is not defined")
            cidr = str(net.cidr)
        else:
            cidr = str(ipaddress.IPv4Network(client, strict=False))
        if cidr not in out:
            out.append(cidr)
    return out


def export_options(export: NfsExport) -> list[str]:
    generated = [
        "rw" if export.rw else "ro",
        "sync" if export.sync else "async",
        "root_squash" if export.root_squash else "no_root_squash",
        "no_subtree_check",
    ]
    return merge_options(generated, export.options)


def exports_line(path: str, clients: Sequence[str], options: Sequence[str]) -> str:
    """One /etc/exports line: ``/path cidr1(opts) cidr2(opts)``."""
    if not clients:
        raise StorageError(f"export {path}: no clients")
    opts = ",".join(options)
    return " ".join([_exports_path(path), *(f"{c}({opts})" for c in clients)])


def _exports_path(path: str) -> str:
    # exports(5): a path with blanks is written in double quotes
    return f'"{path}"' if re.search(r"\s", path) else path


def nfsd_threads(cores: int, override: int | None = None) -> int:
    """nfsd threads: the manifest's number, else 4 per physical core within 8..256."""
    if override is not None:
        return override
    return max(8, min(256, 4 * cores))


def dataset_mountpoint(m: Manifest, node_name: str, dataset: str) -> str:
    """Where ZFS mounts ``pool/dataset`` on ``node_name``: the ``mountpoint`` property the
    manifest sets on it, else on its nearest listed ancestor (the pool's own properties
    included) with the rest of the name appended, else ZFS's default ``/<pool>/<dataset>``."""
    parts = dataset.split("/")
    pool = next((p for p in m.zfs.pools if p.name == parts[0] and p.node == node_name), None)
    props: dict[str, Mapping[str, Any]] = {}
    if pool is not None:
        props[pool.name] = pool.properties
        props.update({f"{pool.name}/{ds.name}": ds.properties for ds in pool.datasets})
    for i in range(len(parts), 0, -1):
        owner = "/".join(parts[:i])
        value = props.get(owner, {}).get("mountpoint")
        if value is None:
            continue
        text = property_text(value)
        inherited = "" if owner == dataset else f" (inherited from {owner})"
        if text in ("none", "legacy"):
            raise StorageError(
                f"dataset {dataset} has mountpoint={text}{inherited}: ZFS does not mount it, so it cannot be "
                "exported; give it a mountpoint or export a path")
        if not text.startswith("/"):
            raise StorageError(f"dataset {dataset}: mountpoint {text!r}{inherited} is not an absolute path")
        rest = "/".join(parts[i:])
        base = text.rstrip("/")
        return (f"{base}/{rest}" if rest else base) or "/"
    return "/" + dataset


def export_path(m: Manifest, export: NfsExport) -> str:
    """The exported directory: the export's ``path``, or its dataset's ZFS mountpoint."""
    if export.path is not None:
        return export.path
    return dataset_mountpoint(m, export.node, str(export.dataset))


def exports_for(m: Manifest, node: Node) -> list[NfsExport]:
    return [e for e in m.nfs.exports if e.node == node.name]


def export_by_name(m: Manifest, name: str) -> NfsExport:
    for exp in m.nfs.exports:
        if exp.name == name:
            return exp
    raise StorageError(f"unknown export {name!r}")


def mounts_for(m: Manifest, node: Node) -> list[NfsMount]:
    return [mnt for mnt in m.nfs.mounts if selects(m, mnt.nodes, node.name)]


def mounts_of_export(m: Manifest, export: NfsExport) -> list[NfsMount]:
    return [mnt for mnt in m.nfs.mounts if mnt.export == export.name]


# =========================================================================== NFS client
def rdma_fabric(m: Manifest) -> bool:
    ib = m.networks.infiniband
    return ib is not None and ib.rdma


def export_networks(m: Manifest, export: NfsExport) -> list[NetworkName]:
    """Networks an export serves, in the order its clients list them."""
    out: list[NetworkName] = []
    for client in export.clients:
        net = network_of(m, client)
        if net is not None and net not in out:
            out.append(net)
    return out


def mount_proto(m: Manifest, mount: NfsMount, client: Node) -> str:
    """tcp or rdma. ``auto`` picks rdma when the export serves the InfiniBand network, the
    fabric has rdma: true and both ends have an InfiniBand interface."""
    export = export_by_name(m, mount.export)
    server = m.node(export.node)
    both_ib = "infiniband" in client.interfaces and "infiniband" in server.interfaces
    if mount.proto == "rdma":
        if not rdma_fabric(m):
            raise StorageError(f"mount {mount.path}: proto rdma needs an infiniband network with rdma: true")
        if not both_ib:
            missing = client.name if "infiniband" not in client.interfaces else server.name
            raise StorageError(f"mount {mount.path}: proto rdma but {missing} has no infiniband interface",
                               node=missing)
        return "rdma"
    if mount.proto == "tcp":
        return "tcp"
    if rdma_fabric(m) and both_ib and "infiniband" in export_networks(m, export):
        return "rdma"
    return "tcp"


def server_address(m: Manifest, export: NfsExport, client: Node, proto: str) -> str:
    """The server IP a client mounts from: on a network where both ends have an interface
    and the export allows the client's address there (the server checks the source address
    of the mount, which is the client's address on that network). The networks the export
    names come first, in its order (InfiniBand for rdma); a CIDR that spans several networks
    (10.0.0.0/16) is matched by address. No such network: StorageError (the server would
    refuse the mount)."""
    server = m.node(export.node)
    if proto == "rdma":
        ip = node_network_ip(server, "infiniband")
        if ip is None:
            raise StorageError(f"export {export.name!r}: {server.name} has no infiniband interface", node=server.name)
        return ip
    allowed = [ipaddress.IPv4Network(c) for c in export_clients(m, export)]
    named = export_networks(m, export)
    for net in [*named, *(n for n in NETWORK_NAMES if n not in named)]:
        server_ip = node_network_ip(server, net)
        client_ip = node_network_ip(client, net)
        if server_ip is None or client_ip is None:
            continue
        if any(ipaddress.IPv4Address(client_ip) in cidr for cidr in allowed):
            return server_ip
    raise StorageError(
        f"{client.name} cannot mount export {export.name!r}: {server.name} allows only "
        f"{', '.join(str(c) for c in allowed)}, and {client.name} has no address there on a network "
        f"{server.name} is on; add the network to the export's clients or the interface to {client.name}"
    )


def export_network_problems(m: Manifest, export: NfsExport) -> list[tuple[int, str]]:
    """(index in clients, message) for every client network of an export its server has
    no interface on: clients there would mount an address the export does not allow."""
    server = m.node(export.node)
    out: list[tuple[int, str]] = []
    for i, client in enumerate(export.clients):
        net = network_of(m, client)
        if net is not None and net not in server.interfaces:
            out.append((i, f"export {export.name!r} is limited to the {net} network ({client}), but its server "
                           f"{server.name} has no {net} interface, so no client can mount it over that network; "
                           f"give {server.name} an interfaces.{net} entry or serve a network it is on"))
    return out


def check_one_path_per_server(m: Manifest, client: Node) -> None:
    """NFS 4.1+ clients detect that two addresses belong to one server (session trunking)
    and send every mount of that server through the connection of the first one. Mounts of
    one server over different addresses or transports then fail (the server sees the first
    network's address and refuses an export it does not serve there) or silently leave
    RDMA. So a client mounts all NFSv4 exports of one server the same way."""
    seen: dict[str, tuple[str, str, str]] = {}
    for mount in mounts_for(m, client):
        if mount.vers == "3":
            continue
        export = export_by_name(m, mount.export)
        proto = mount_proto(m, mount, client)
        address = server_address(m, export, client, proto)
        first = seen.setdefault(export.node, (address, proto, mount.path))
        if first[:2] != (address, proto):
            raise StorageError(
                f"mounts {first[2]} and {mount.path} reach server {export.node} over {first[0]} ({first[1]}) "
                f"and {address} ({proto}): NFS 4.1+ shares one connection per server, so the second "
                "would use the first one's network; mount every export of a server over the same "
                "network and proto (serve them to the same clients)"
            )


def _nconnect_option(opt: str) -> bool:
    return opt.split("=", 1)[0] == "nconnect"


def mount_options(mount: NfsMount, proto: str) -> list[str]:
    """Mount options. Over RDMA there is no ``nconnect``: the NFS/RDMA transport of the
    Ubuntu 22.04/24.04 and Debian 12 kernels ignores it (validate warns when a manifest
    sets it there, :func:`nconnect_ignored`)."""
    generated = [f"vers={mount.vers}", f"proto={proto}"]
    if proto == "rdma":
        generated.append(f"port={NFS_RDMA_PORT}")
    else:
        generated.append(f"nconnect={mount.nconnect}")
    generated += [
        f"rsize={mount.rsize}",
        f"wsize={mount.wsize}",
        "hard" if mount.hard else "soft",
        "_netdev",
    ]
    extra = [o for o in mount.options if not (proto == "rdma" and _nconnect_option(o))]
    return merge_options(generated, extra)


def nconnect_ignored(m: Manifest, mount: NfsMount) -> str | None:
    """Why the manifest's nconnect for this mount has no effect (None: it has, or it is
    not set): clients that mount it over RDMA do not render it."""
    explicit = "nconnect" in mount.model_fields_set or any(_nconnect_option(o) for o in mount.options)
    if not explicit:
        return None
    try:
        rdma = sorted(n for n in select_nodes(m, mount.nodes) if mount_proto(m, mount, m.node(n)) == "rdma")
    except (StorageError, KeyError, ValueError):
        return None  # the mount's own problem is reported elsewhere
    if not rdma:
        return None
    return (f"mount {mount.path}: nconnect has no effect with proto=rdma (the NFS/RDMA transport of these "
            f"kernels ignores it) and is left out for {', '.join(contract(rdma))}; remove it")


# =========================================================================== systemd units
_UNIT_SAFE = re.compile(r"[A-Za-z0-9:_.]")


@functools.lru_cache(maxsize=1024)  # pure; every node's mount units escape the same few paths
def systemd_escape_path(path: str) -> str:
    """``systemd-escape --path``: /mnt/corpus1 -> mnt-corpus1, / -> -."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "-"
    text = "/".join(parts)
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "/":
            out.append("-")
        elif _UNIT_SAFE.match(ch) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out)


def mount_unit(path: str) -> str:
    return systemd_escape_path(path) + ".mount"


def automount_unit(path: str) -> str:
    return systemd_escape_path(path) + ".automount"


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# =========================================================================== MergerFS
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
        if any(_under(branch, mount.path) for branch in union.branches):
            unit = mount_unit(mount.path)
            if unit not in units:
                units.append(unit)
    return units


# =========================================================================== fabric
def opensm_node(m: Manifest) -> str | None:
    """Where opensm runs when the fabric has no managed switch: the head node if it is on
    the fabric, else the first node with an InfiniBand interface."""
    ib = m.networks.infiniband
    if ib is None or ib.subnet_manager != "opensm":
        return None
    heads = [n for n in m.with_role("head") if "infiniband" in n.interfaces]
    chosen = heads[0] if heads else next((n for n in m.nodes if "infiniband" in n.interfaces), None)
    return chosen.name if chosen is not None else None


def ipoib_config(m: Manifest, node: Node) -> dict[str, Any]:
    """The IPoIB interface of a node ({} when it has none)."""
    ib = m.networks.infiniband
    iface = node.interfaces.get("infiniband")
    if ib is None or iface is None:
        return {}
    if not iface.interface:
        raise StorageError(f"{node.name}: the infiniband interface needs a name (interface: ib0)")
    return {
        "interface": iface.interface,
        "address": f"{iface.ip}/{ib.cidr.prefixlen}",
        "mtu": ib.mtu,
        "mode": ib.mode,
    }


def wants_peermem(m: Manifest, node: Node) -> bool:
    """GPUDirect RDMA: a GPU node on an RDMA fabric loads nvidia-peermem."""
    return node.gpu_count > 0 and "infiniband" in node.interfaces and rdma_fabric(m)


# =========================================================================== groups
def storage_groups(m: Manifest, node: Node) -> list[str]:
    """zfs / nfs_server / nfs_client / mergerfs / infiniband membership of one node."""
    groups: list[str] = []
    if any(p.node == node.name for p in m.zfs.pools):
        groups.append("zfs")
    if exports_for(m, node):
        groups.append("nfs_server")
    if mounts_for(m, node):
        groups.append("nfs_client")
    if unions_for(m, node):
        groups.append("mergerfs")
    if "infiniband" in node.interfaces:
        groups.append("infiniband")
    return groups
