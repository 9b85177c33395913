"""Manifest loading: text -> positions -> pydantic model -> expanded nodes -> structural checks.

The areas' checks run on top of this in ``provisioner.validate`` (``load_manifest``).
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from provisioner.errors import Diagnostic, ManifestError
from provisioner.manifest.checks import run_checks
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Bmc, Hardware, Interface, Nic, Node
from provisioner.manifest.ranges import RangeError, add_ip, add_mac, expand
from provisioner.manifest.source import PathKey, Source


@dataclass
class Loaded:
    """A validated manifest with its source (for positions) and any warnings."""

    manifest: Manifest
    source: Source
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return Path(self.source.file)


# --------------------------------------------------------------------------- pydantic errors
def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """Walk ``loc`` through model fields and return the model class found there."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            if isinstance(part, int):
                return None
            info = current.model_fields.get(str(part))
            if info is None:
                return None
            current = info.annotation
        elif isinstance(part, (int, str)):
            current = _unwrap(current, container=True)
        if current is None:
            return None
        current = _unwrap(current, container=False)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: Any, container: bool) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _unwrap(args[0], container)
    if origin in (typing.Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        non_none = [a for a in args if a is not type(None)]
        if models:
            return models[0]
        return _unwrap(non_none[0], container) if len(non_none) == 1 else tp
    if container and origin in (list, dict):
        return args[-1] if args else None
    return tp


# What a list section looks like, for a manifest that gives it as a mapping.
LIST_SECTION_EXAMPLES: dict[tuple[str, ...], str] = {
    ("mergerfs",): "mergerfs: [{path: /corpus, branches: [/mnt/corpus1, /mnt/corpus2], nodes: ['@compute']}]",
    ("nodes",): "nodes: [{name: gpu[01-04], roles: [compute], interfaces: {...}, hardware: {...}}]",
    ("zfs", "pools"): "pools: [{name: tank, node: store1, vdevs: {type: mirror, disks: [...]}}]",
    ("nfs", "exports"): "exports: [{name: data, node: store1, dataset: tank/data, clients: [data]}]",
    ("nfs", "mounts"): "mounts: [{export: data, path: /data, nodes: ['@compute']}]",
    ("slurm", "partitions"): "partitions: [{name: gpu, nodes: ['@compute'], default: true}]",
    ("cluster", "admin_users"): "admin_users: [{name: alice, ssh_keys: [ssh-ed25519 AAAA... alice@host]}]",
}


def _list_hint(loc: tuple[Any, ...], given: Any) -> str:
    """For a mapping where a list belongs: say so, and what the section looks like."""
    example = LIST_SECTION_EXAMPLES.get(tuple(str(p) for p in loc))
    text = "expected a list, one '- ' item per entry, but got a mapping"
    if isinstance(given, dict) and ("path" in given or "name" in given or "export" in given):
        text += " that looks like a single entry: put '- ' before its first key"
    return text + (f"; the section looks like: {example}" if example else "")


def _message(err: Any, loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    if kind == "list_type" and isinstance(err.get("input"), dict):
        return _list_hint(loc, err["input"])
    if kind == "extra_forbidden":
        key = str(loc[-1])
        parent = _model_at(Manifest, loc[:-1])
        hint = ""
        if parent is not None:
            close = difflib.get_close_matches(key, list(parent.model_fields), n=1, cutoff=0.6)
            allowed = ", ".join(sorted(parent.model_fields))
            hint = f"; did you mean '{close[0]}'?" if close else f"; allowed: {allowed}"
        return f"unknown field{hint}"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"got {err.get('input')!r}; expected one of {expected}"
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


def _diagnostics(source: Source, exc: ValidationError) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    seen: set[tuple[PathKey, str]] = set()
    for err in exc.errors(include_url=False):
        loc = _data_loc(source, tuple(err["loc"]), keep_last=err["type"] == "missing")
        message = _message(err, loc)
        key = (loc, message)
        if key in seen:
            continue
        seen.add(key)
        out.append(source.diag(loc, message))
    return out


def _data_loc(source: Source, loc: tuple[Any, ...], keep_last: bool) -> PathKey:
    """Drop pydantic's union/validator tags: keep only the parts that exist in the data."""
    kept: list[str | int] = []
    for i, part in enumerate(loc):
        candidate = (*kept, part)
        if candidate in source.positions or candidate in source.key_positions or (keep_last and i == len(loc) - 1):
            kept.append(part)
    return tuple(kept)


# --------------------------------------------------------------------------- node ranges
class NodeRangeError(RangeError):
    """A ranged node entry whose addresses cannot increment; ``path`` is the source field."""

    def __init__(self, path: PathKey, message: str) -> None:
        super().__init__(message)
        self.path = path


def _disk_per_node(disk: str, count: int, where: PathKey) -> list[str]:
    """Install disks of a ranged node may be a range too (by-id names carry serials):
    ``nvme-SSD_S7H[01-04]`` gives the first node S7H01, the second S7H02, ... A plain name
    is every node's. Expanded once per node entry: the list has one disk per node."""
    try:
        items = expand(disk)
    except RangeError as exc:
        raise NodeRangeError(where, str(exc)) from None
    if len(items) == 1:
        return items * count
    if len(items) != count:
        raise NodeRangeError(where, f"install disk range {disk!r} has {len(items)} items for {count} nodes")
    return items


def _hardware_per_node(hardware: Hardware, count: int, where: PathKey, entry: str) -> list[Hardware]:
    """Each node's hardware of an entry of ``count`` nodes: a disk given ``per_node`` gets
    that node's id. The entry's own hardware, shared, where no disk is given so."""
    if all(d.per_node is None for d in hardware.disks):
        return [hardware] * count
    for j, disk in enumerate(hardware.disks):
        if disk.per_node is not None and len(disk.per_node) != count:
            raise NodeRangeError((*where, j, "per_node"), f"{entry}: per_node lists {len(disk.per_node)} disk "
                                 f"id(s) for {count} node(s); give one per node, in the entry's order")
    return [hardware.model_copy(update={"disks": [
        d if d.per_node is None else d.model_copy(update={"id": d.per_node[k], "per_node": None})
        for d in hardware.disks]}) for k in range(count)]


_N = TypeVar("_N", bound=Nic)


def _nic_at(nic: _N, offset: int, entry: str, where: PathKey) -> _N:
    """A NIC of a ranged entry's ``offset``-th node: its IP and MAC incremented."""
    try:
        ip = add_ip(nic.ip, offset)
    except RangeError as exc:
        raise NodeRangeError((*where, "ip"), f"{entry}: {exc}") from None
    try:
        mac = add_mac(nic.mac, offset) if nic.mac else None
    except RangeError as exc:
        raise NodeRangeError((*where, "mac"), f"{entry}: {exc}") from None
    return nic.model_copy(update={"ip": ip, "mac": mac})


def expand_nodes(nodes: list[Node]) -> list[Node]:
    """Expand ``gpu[01-04]`` entries into one node each; addresses increment per node."""
    out: list[Node] = []
    for index, node in enumerate(nodes):
        names = expand(node.name)
        per_node = [_disk_per_node(d, len(names), ("nodes", index, "install_disks", i))
                    for i, d in enumerate(node.install_disks)]
        hardware = _hardware_per_node(node.hardware, len(names), ("nodes", index, "hardware", "disks"), node.name)
        for offset, name in enumerate(names):
            interfaces: dict[Any, Interface] = {}
            for net, iface in node.interfaces.items():
                where: PathKey = ("nodes", index, "interfaces", net)
                more = [_nic_at(nic, offset, node.name, (*where, k + 1)) for k, nic in enumerate(iface.more)]
                # the values are validated already (the entry's, incremented): no second validation;
                # every other field (interface, rdma_device) is the entry's own
                interfaces[net] = _nic_at(iface, offset, node.name, where).model_copy(update={"more": more})
            bmc: Bmc | None = node.bmc
            if bmc is not None and offset:
                where = ("nodes", index, "bmc", "address")
                if bmc.ipv4 is None:
                    raise NodeRangeError(where, f"{node.name}: a ranged node needs an IPv4 BMC address to increment")
                try:
                    bmc = bmc.model_copy(update={"address": str(add_ip(bmc.ipv4, offset))})
                except RangeError as exc:
                    raise NodeRangeError(where, f"{node.name}: BMC {exc}") from None
            disks = [disks_of_entry[offset] for disks_of_entry in per_node]
            copy = node.model_copy(update={"name": name, "interfaces": interfaces, "bmc": bmc, "install_disks": disks,
                                           "hardware": hardware[offset]})
            copy._source_index = index
            out.append(copy)
    return out


# --------------------------------------------------------------------------- entry points
def load_source(source: Source) -> Loaded:
    """Schema, node ranges and the structural checks; raises ManifestError with every error."""
    data = source.data
    version = data.get("version")
    if version is None:
        raise ManifestError([source.diag(("version",), "required field is missing; this tool reads version: 1")])
    if isinstance(version, str) and version.strip() == "1":
        raise ManifestError([source.diag(("version",), 'a number, not a string: write version: 1 (without quotes)')])
    if version != 1 or isinstance(version, bool):  # True == 1 in Python; `version: yes` is not 1
        raise ManifestError(
            [source.diag(("version",), f"schema version {version!r} is not supported; this tool reads version: 1")]
        )
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(_diagnostics(source, exc)) from None
    try:
        expanded = expand_nodes(manifest.nodes)
    except RangeError as exc:
        path = exc.path if isinstance(exc, NodeRangeError) else ("nodes",)
        raise ManifestError([source.diag(path, str(exc))]) from None
    manifest = manifest.model_copy(update={"nodes": expanded})
    errors, warnings = run_checks(manifest, source)
    if errors:
        raise ManifestError(errors)
    return Loaded(manifest, source, warnings)
