"""Disk safety, pure: whether a pool may take a disk, from ``lsblk``/``wipefs`` observations
(the zfs role gathers them, its filter plugin asks :func:`disk_safety`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.areas.storage.base import BY_ID_DIR, StorageError


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


def disk_safety(probes: Iterable[DiskProbe], force: bool,
                findings: Callable[[DiskProbe], Findings] | None = None) -> SafetyVerdict:
    """May a pool (or another volume) be created on these disks?

    Missing or mounted disks always refuse. Partitions, partition tables and filesystem
    (or ZFS) signatures refuse unless the manifest says ``force: true`` for the pool.
    ``findings``: what counts as blocking and as data on one disk (:func:`disk_findings`
    by default; the scratch volume passes its own).
    """
    refused: list[str] = []
    overridden: list[str] = []
    for probe in probes:
        found = (findings or disk_findings)(probe)
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
