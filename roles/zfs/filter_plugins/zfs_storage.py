"""Filters of the zfs role: thin wrappers over provisioner.areas.storage.decide (the tested logic),
and the path of the node program the role installs (provisioner.areas.storage.snapshots).

They run on the controller, where the provisioner package is installed (the venv that
runs ansible-playbook); from a plain checkout the repository root is put on sys.path.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    from provisioner.areas.storage import decide as storage
    from provisioner.areas.storage import replicate, snapshots
except ImportError:  # pragma: no cover - running from a checkout without the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from provisioner.areas.storage import decide as storage
    from provisioner.areas.storage import replicate, snapshots

# The programs the role copies onto nodes: modules of the package, standard library only,
# so a node runs the very code the unit tests check (the copy module reads them here).
_PROGRAMS = {"snapshot": snapshots, "replicate": replicate}


def zfs_importable_pools(text: str) -> list[str]:
    """Pool names from `zpool import` output."""
    return storage.importable_pools(str(text))


def zfs_layout_drift(status_text: str, expected: Mapping[str, Any]) -> list[str]:
    """Drift sentences between `zpool status -P` output and the expected layout."""
    return storage.status_drift(str(status_text), expected)


def zfs_disk_safety(
    lsblk_results: Sequence[Mapping[str, Any]],
    wipefs_results: Sequence[Mapping[str, Any]],
    force: bool,
) -> dict[str, Any]:
    """{ok, refused, overridden} from the registered lsblk and wipefs loops."""
    probes = storage.probes_from_ansible(lsblk_results, wipefs_results)
    return storage.disk_safety(probes, bool(force)).to_dict()


# `zpool create` keywords: classes that take one keyword for all their vdevs (zpool refuses
# a second `log`, `cache` or `spare`), classes whose keyword may repeat, and vdev types.
_ONCE_CLASSES = ("log", "cache", "spare")
_REPEAT_CLASSES = ("special", "dedup")
_GROUP_TYPES = ("mirror", "raidz", "raidz1", "raidz2", "raidz3")
_FLAG_OPTIONS = {"-f": "force", "-d": "disable_new_features"}
_VALUE_OPTIONS = {"-m": "mountpoint", "-R": "altroot", "-t": "temp_name"}


def zfs_zpool_module_args(create_args: Sequence[str]) -> dict[str, Any]:
    """community.general.zpool arguments that create exactly what ``zpool create_args`` would.

    ``create_args`` (provisioner.storage.create_args: ``create [-f] -o ashift=N -O k=v ...
    NAME VDEVS``) stays the one description of a new pool; this only re-expresses it. The
    module writes its role keyword before every vdev it is given, so the vdevs of a class
    whose keyword zpool accepts once (log, cache, spare) go into one vdev of that role;
    a layout the module cannot express (two log mirrors, a draid) is refused here rather
    than turned into a different pool.
    """
    args = [str(a) for a in create_args]
    if not args or args[0] != "create":
        raise ValueError(f"zfs_zpool_module_args: expected zpool create arguments, got {args[:1]}")
    out: dict[str, Any] = {"force": False, "disable_new_features": False,
                           "pool_properties": {}, "filesystem_properties": {}}
    i = 1
    while i < len(args) and args[i].startswith("-"):
        opt = args[i]
        if opt in _FLAG_OPTIONS:
            out[_FLAG_OPTIONS[opt]] = True
            i += 1
        elif opt in ("-o", "-O") and i + 1 < len(args) and "=" in args[i + 1]:
            key, value = args[i + 1].split("=", 1)
            out["pool_properties" if opt == "-o" else "filesystem_properties"][key] = value
            i += 2
        elif opt in _VALUE_OPTIONS and i + 1 < len(args):
            out[_VALUE_OPTIONS[opt]] = args[i + 1]
            i += 2
        else:
            raise ValueError(f"zfs_zpool_module_args: option {opt} has no zpool module equivalent")
    if i >= len(args):
        raise ValueError("zfs_zpool_module_args: no pool name")
    out["name"] = args[i]

    # The vdev specification, read the way zpool reads it: a class keyword switches the
    # class, a type starts a grouped vdev whose leaves follow, anything else is a leaf.
    groups: list[dict[str, Any]] = []
    role: str | None = None
    for token in args[i + 1:]:
        if token in _ONCE_CLASSES or token in _REPEAT_CLASSES:
            role = token
        elif token in _GROUP_TYPES:
            groups.append({"role": role, "type": token, "disks": []})
        elif token.startswith("draid"):
            raise ValueError(f"zfs_zpool_module_args: {token} vdevs are not supported by the zpool module")
        elif groups and groups[-1]["type"] != "stripe" and groups[-1]["role"] == role:
            groups[-1]["disks"].append(token)
        else:
            groups.append({"role": role, "type": "stripe", "disks": [token]})

    vdevs: list[dict[str, Any]] = []
    for group in groups:
        last = vdevs[-1] if vdevs else None
        merge = (group["type"] == "stripe" and last is not None and last["type"] == "stripe"
                 and last.get("role") == group["role"] and group["role"] in _ONCE_CLASSES)
        if merge:
            last["disks"].extend(group["disks"])
            continue
        vdev = {"type": group["type"], "disks": list(group["disks"])}
        if group["role"] is not None:
            vdev["role"] = group["role"]
        vdevs.append(vdev)
    for cls in _ONCE_CLASSES:
        count = sum(1 for v in vdevs if v.get("role") == cls)
        if count > 1:
            raise ValueError(f"zfs_zpool_module_args: {count} {cls} vdevs need one `{cls}` keyword, "
                             "which the zpool module cannot write; create this pool by hand")
    if not any("role" not in v for v in vdevs):
        raise ValueError("zfs_zpool_module_args: no data vdev")
    out["vdevs"] = vdevs
    return out


def zfs_program_path(name: str) -> str:
    """The controller path of a program the role installs: ``'snapshot' | zfs_program_path``."""
    module = _PROGRAMS.get(str(name))
    if module is None or module.__file__ is None:
        raise ValueError(f"zfs_program_path: no program {name!r}; known: {sorted(_PROGRAMS)}")
    return str(Path(module.__file__).resolve())


def zfs_snapshot_timers(policies: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    """One ``{frequency, enabled}`` per frequency there is: enabled where a policy keeps it."""
    kept = {f for policy in policies.values() for f, n in policy.items() if int(n) > 0}
    return [{"frequency": f, "enabled": f in kept} for f in snapshots.PERIODS]


def zfs_replica_authorized_key(public_key: str, program: str, config: str, sources: Sequence[str]) -> str:
    """The receiving account's authorized_keys line: the forced command alone, from the sources."""
    return replicate.authorized_key_line(str(public_key), str(program), str(config), [str(s) for s in sources])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "zfs_importable_pools": zfs_importable_pools,
            "zfs_layout_drift": zfs_layout_drift,
            "zfs_disk_safety": zfs_disk_safety,
            "zfs_zpool_module_args": zfs_zpool_module_args,
            "zfs_program_path": zfs_program_path,
            "zfs_snapshot_timers": zfs_snapshot_timers,
            "zfs_replica_authorized_key": zfs_replica_authorized_key,
        }
