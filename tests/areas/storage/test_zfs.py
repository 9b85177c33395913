"""provisioner.areas.storage.zfs: vdev layouts, zpool arguments, zpool status and drift, ARC;
the zfs role's filter plugin and its pool tasks against stand-in binaries."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import base, replicate, snapshots, zfs
from provisioner.manifest import Manifest
from provisioner.manifest.storage import ZfsPool
from provisioner.runner import strategy_env

ROOT = Path(__file__).resolve().parents[3]
HGST = "ata-HGST_HUS726T6TALE6L4_V8G0000"


def lsblk(children: list[dict[str, Any]] | None = None, **top: Any) -> str:
    dev: dict[str, Any] = {"name": "sdb", "type": "disk", "fstype": None, "pttype": None,
                           "mountpoint": None}
    dev.update(top)
    if children:
        dev["children"] = children
    return json.dumps({"blockdevices": [dev]})


def pool(**kw: Any) -> ZfsPool:
    data: dict[str, Any] = {"name": "tank", "node": "n1",
                            "vdevs": {"type": "mirror", "width": 2, "disks": ["d[1-4]"]}}
    data.update(kw)
    return ZfsPool.model_validate(data)


# =========================================================================== layouts
def test_mirror_pairs_in_order() -> None:
    vdevs = zfs.group_vdevs("mirror", 2, [f"d{i}" for i in range(1, 9)])
    assert [v.disks for v in vdevs] == [("d1", "d2"), ("d3", "d4"), ("d5", "d6"), ("d7", "d8")]
    assert {v.kind for v in vdevs} == {"mirror"}


def test_three_way_mirrors_from_thirty_disks() -> None:
    vdevs = zfs.group_vdevs("mirror", 3, [f"d{i:02d}" for i in range(1, 31)])
    assert len(vdevs) == 10
    assert vdevs[0].disks == ("d01", "d02", "d03")
    assert vdevs[-1].disks == ("d28", "d29", "d30")


def test_raidz_and_stripe_groups() -> None:
    assert [v.kind for v in zfs.group_vdevs("raidz2", 6, [f"d{i}" for i in range(12)])] == ["raidz2"] * 2
    stripe = zfs.group_vdevs("stripe", 1, ["a", "b"])
    assert stripe == (zfs.Vdev("disk", ("a",)), zfs.Vdev("disk", ("b",)))


@pytest.mark.parametrize(
    ("vtype", "width", "count", "message"),
    [
        ("mirror", 2, 7, "7 disks do not divide into mirror groups of 2"),
        ("mirror", 1, 4, "needs a width of at least 2"),
        ("raidz1", 2, 4, "needs a width of at least 3"),
        ("zigzag", 2, 4, "unknown vdev type"),
    ],
)
def test_bad_groups_refused(vtype: str, width: int, count: int, message: str) -> None:
    with pytest.raises(base.StorageError, match=message):
        zfs.group_vdevs(vtype, width, [f"d{i}" for i in range(count)])


def test_disk_listed_twice_refused() -> None:
    with pytest.raises(base.StorageError, match="'a' is listed twice"):
        zfs.group_vdevs("mirror", 2, ["a", "a"])
    with pytest.raises(base.StorageError, match="used twice"):
        zfs.pool_layout(pool(log=["d1"]))


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([], ()),
        (["s1"], (zfs.Vdev("disk", ("s1",)),)),
        (["s1", "s2"], (zfs.Vdev("mirror", ("s1", "s2")),)),
        (["s1", "s2", "s3"], (zfs.Vdev("mirror", ("s1", "s2", "s3")),)),
    ],
)
def test_slog_mirrored_from_two_devices(devices: list[str], expected: tuple[zfs.Vdev, ...]) -> None:
    assert zfs.log_vdevs(devices) == expected


def test_llm200k_layout(llm: Manifest) -> None:
    layout = zfs.pool_layout(llm.zfs.pools[0])
    assert [v.disks for v in layout.data] == [
        (f"{HGST}1", f"{HGST}2"), (f"{HGST}3", f"{HGST}4"),
        (f"{HGST}5", f"{HGST}6"), (f"{HGST}7", f"{HGST}8"),
    ]
    assert layout.log == (zfs.Vdev("disk", ("nvme-INTEL_SSDPE21D280GA_PHM2000001",)),)
    assert layout.cache == (zfs.Vdev("disk", ("ata-Samsung_SSD_870_EVO_1TB_S6PT000001",)),)
    assert layout.special == ()
    assert layout.summary() == "4 x mirror(2) + log: 1 disk + cache: 1 disk"


def test_llm200k_zpool_create_arguments(llm: Manifest) -> None:
    args = zfs.create_args(llm.zfs.pools[0])
    d = "/dev/disk/by-id/"
    assert args == [
        "create", "-o", "ashift=12",
        "-O", "acltype=posixacl", "-O", "atime=off", "-O", "compression=lz4", "-O", "xattr=sa",
        "tank",
        "mirror", f"{d}{HGST}1", f"{d}{HGST}2",
        "mirror", f"{d}{HGST}3", f"{d}{HGST}4",
        "mirror", f"{d}{HGST}5", f"{d}{HGST}6",
        "mirror", f"{d}{HGST}7", f"{d}{HGST}8",
        "log", f"{d}nvme-INTEL_SSDPE21D280GA_PHM2000001",
        "cache", f"{d}ata-Samsung_SSD_870_EVO_1TB_S6PT000001",
    ]
    assert "-f" not in args


def test_music_lab_ten_three_way_mirrors_per_server(lab: Manifest) -> None:
    assert [p.node for p in lab.zfs.pools] == ["store1", "store2"]
    for p in lab.zfs.pools:
        layout = zfs.pool_layout(p)
        assert len(layout.data) == 10
        assert all(v.kind == "mirror" and len(v.disks) == 3 for v in layout.data)
        assert len(set(layout.disks())) == 30
        assert layout.summary() == "10 x mirror(3)"
        args = zfs.create_args(p)
        assert args.count("mirror") == 10
        assert args[args.index("audio") + 1 :][:4] == [
            "mirror", *(f"/dev/disk/by-id/{d}" for d in layout.data[0].disks)
        ]


def test_force_special_ashift_and_properties() -> None:
    p = pool(
        force=True, ashift=13, properties={"compression": "zstd", "atime": False},
        special={"type": "mirror", "width": 2, "disks": ["nv1", "nv2"]},
        log=["l1", "l2"], cache=["c1"],
    )
    assert zfs.create_args(p) == [
        "create", "-f", "-o", "ashift=13", "-O", "atime=off", "-O", "compression=zstd", "tank",
        "mirror", "/dev/disk/by-id/d1", "/dev/disk/by-id/d2",
        "mirror", "/dev/disk/by-id/d3", "/dev/disk/by-id/d4",
        "log", "mirror", "/dev/disk/by-id/l1", "/dev/disk/by-id/l2",
        "special", "mirror", "/dev/disk/by-id/nv1", "/dev/disk/by-id/nv2",
        "cache", "/dev/disk/by-id/c1",
    ]


def test_layout_dict_round_trip(llm: Manifest) -> None:
    layout = zfs.pool_layout(llm.zfs.pools[0])
    assert zfs.PoolLayout.from_dict(json.loads(json.dumps(layout.to_dict()))) == layout
    with pytest.raises(base.StorageError, match="unknown vdev class"):
        zfs.PoolLayout.from_dict({"data": [], "logs": []})


@pytest.mark.parametrize(
    ("memory_gb", "percent", "expected"),
    [(128, 50, 64 * 1024**3), (256, 50, 128 * 1024**3), (64, 25, 16 * 1024**3), (1, 90, 966367641)],
)
def test_arc_max_bytes(memory_gb: int, percent: int, expected: int) -> None:
    assert zfs.arc_max_bytes(memory_gb, percent) == expected


def test_arc_percent_out_of_range() -> None:
    with pytest.raises(base.StorageError):
        zfs.arc_max_bytes(64, 0)


# =========================================================================== zpool status
STATUS_LLM = """\
  pool: tank
 state: ONLINE
  scan: scrub repaired 0B in 05:12:01 with 0 errors on Sun Nov  8 05:36:02 2026
config:

\tNAME                                                   STATE     READ WRITE CKSUM
\ttank                                                   ONLINE       0     0     0
\t  mirror-0                                             ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00001-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00002-part1  ONLINE       0     0     0
\t  mirror-1                                             ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00003-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00004-part1  ONLINE       0     0     0
\t  mirror-2                                             ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00005-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00006-part1  ONLINE       0     0     0
\t  mirror-3                                             ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00007-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/ata-HGST_HUS726T6TALE6L4_V8G00008-part1  ONLINE       0     0     0
\tlogs\t
\t  /dev/disk/by-id/nvme-INTEL_SSDPE21D280GA_PHM2000001-part1  ONLINE       0     0     0
\tcache
\t  /dev/disk/by-id/ata-Samsung_SSD_870_EVO_1TB_S6PT000001-part1  ONLINE       0     0     0

errors: No known data errors
"""


def test_parse_status_of_llm_pool_matches_manifest(llm: Manifest) -> None:
    parsed = zfs.parse_zpool_status(STATUS_LLM)
    assert parsed == zfs.pool_layout(llm.zfs.pools[0])
    assert zfs.layout_drift(zfs.pool_layout(llm.zfs.pools[0]), parsed) == []


def test_parse_status_raidz_special_spares_degraded() -> None:
    text = """\
  pool: big
 state: DEGRADED
config:

\tNAME            STATE     READ WRITE CKSUM
\tbig             DEGRADED     0     0     0
\t  raidz2-0      DEGRADED     0     0     0
\t    /dev/disk/by-id/wwn-1-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/wwn-2-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/wwn-3-part1  ONLINE       0     0     0
\t    1234567890123456789  UNAVAIL      0     0     0  was /dev/disk/by-id/wwn-4-part1
\t  /dev/sdz        ONLINE       0     0     0
\tspecial
\t  mirror-2      ONLINE       0     0     0
\t    /dev/disk/by-id/nvme-a-part1  ONLINE       0     0     0
\t    /dev/disk/by-id/nvme-b-part1  ONLINE       0     0     0
\tspares
\t  /dev/disk/by-id/wwn-9-part1    AVAIL

errors: No known data errors
"""
    parsed = zfs.parse_zpool_status(text)
    assert parsed.data == (
        zfs.Vdev("raidz2", ("wwn-1", "wwn-2", "wwn-3", "wwn-4")),
        zfs.Vdev("disk", ("/dev/sdz",)),
    )
    assert parsed.special == (zfs.Vdev("mirror", ("nvme-a", "nvme-b")),)
    assert parsed.spare == (zfs.Vdev("disk", ("wwn-9",)),)


def test_parse_status_replacing_disk_counts_both() -> None:
    text = """\
config:

\tNAME              STATE     READ WRITE CKSUM
\tp                 DEGRADED     0     0     0
\t  mirror-0        DEGRADED     0     0     0
\t    replacing-0   DEGRADED     0     0     0
\t      /dev/disk/by-id/old-part1  FAULTED  0  0  0
\t      /dev/disk/by-id/new-part1  ONLINE   0  0  0
\t    /dev/disk/by-id/b-part1      ONLINE   0  0  0
"""
    assert zfs.parse_zpool_status(text).data == (zfs.Vdev("mirror", ("old", "new", "b")),)


def test_parse_status_without_config_refused() -> None:
    with pytest.raises(base.StorageError, match="config"):
        zfs.parse_zpool_status("cannot open 'x': no such pool\n")


def test_drift_ignores_order_reports_differences() -> None:
    want = zfs.PoolLayout(
        data=(zfs.Vdev("mirror", ("a", "b")), zfs.Vdev("mirror", ("c", "d"))),
        log=(zfs.Vdev("disk", ("l",)),),
    )
    reordered = zfs.PoolLayout(
        data=(zfs.Vdev("mirror", ("d", "c")), zfs.Vdev("mirror", ("b", "a"))),
        log=(zfs.Vdev("disk", ("l",)),),
    )
    assert zfs.layout_drift(want, reordered) == []
    changed = zfs.PoolLayout(
        data=(zfs.Vdev("mirror", ("a", "b")), zfs.Vdev("mirror", ("c", "x")), zfs.Vdev("disk", ("e",))),
    )
    assert zfs.layout_drift(want, changed) == [
        "data: mirror(c, d) is in the manifest but not in the pool",
        "data: e is in the pool but not in the manifest",
        "data: mirror(c, x) is in the pool but not in the manifest",
        "log: l is in the manifest but not in the pool",
    ]


def test_drift_raidz_pool_against_mirror_manifest(llm: Manifest) -> None:
    want = zfs.pool_layout(llm.zfs.pools[0])
    have = zfs.PoolLayout(data=(zfs.Vdev("raidz1", tuple(f"{HGST}{i}" for i in range(1, 9))),))
    drift = zfs.layout_drift(want, have)
    assert sum("in the manifest but not in the pool" in d for d in drift) == 6
    assert any(d.startswith("data: raidz1(") and "in the pool" in d for d in drift)


def test_status_drift_from_role_variables(llm: Manifest) -> None:
    expected = zfs.pool_layout(llm.zfs.pools[0]).to_dict()
    assert zfs.status_drift(STATUS_LLM, expected) == []
    expected["cache"] = []
    assert zfs.status_drift(STATUS_LLM, expected) == [
        "cache: ata-Samsung_SSD_870_EVO_1TB_S6PT000001 is in the pool but not in the manifest"
    ]


def test_importable_pools() -> None:
    text = """\
   pool: tank
     id: 1234567890
  state: ONLINE
 action: The pool can be imported using its name or numeric identifier.
 config:

\ttank        ONLINE
\t  mirror-0  ONLINE

   pool: old
     id: 42
  state: FAULTED
"""
    assert zfs.importable_pools(text) == ["tank", "old"]
    assert zfs.importable_pools("") == []


def zfs_filters() -> dict[str, Any]:
    path = ROOT / "roles" / "zfs" / "filter_plugins" / "zfs_storage.py"
    spec = importlib.util.spec_from_file_location("zfs_storage_filters", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    filters: dict[str, Any] = mod.FilterModule().filters()
    return filters


def test_zfs_role_filter_plugin_uses_this_logic() -> None:
    filters = zfs_filters()
    assert set(filters) == {"zfs_importable_pools", "zfs_layout_drift", "zfs_disk_safety",
                            "zfs_zpool_module_args", "zfs_program_path", "zfs_snapshot_timers",
                            "zfs_replica_authorized_key"}
    assert filters["zfs_importable_pools"]("   pool: tank\n") == ["tank"]
    verdict = filters["zfs_disk_safety"]([{"item": "a", "rc": 0, "stdout": lsblk(pttype="dos")}],
                                         [{"item": "a", "rc": 0, "stdout": ""}], False)
    assert verdict == {"ok": False, "refused": ["a: has a dos partition table"], "overridden": []}
    expected = {"data": [{"type": "mirror", "disks": ["x", "y"]}]}
    drift = filters["zfs_layout_drift"](STATUS_LLM, expected)
    assert "data: mirror(x, y) is in the manifest but not in the pool" in drift


def test_the_role_installs_the_snapshot_module_itself_and_a_timer_per_frequency() -> None:
    filters = zfs_filters()
    assert filters["zfs_program_path"]("snapshot") == str(Path(snapshots.__file__).resolve())
    with pytest.raises(ValueError, match="no program 'other'"):
        filters["zfs_program_path"]("other")
    timers = filters["zfs_snapshot_timers"]({"tank/a": {"hourly": 24, "daily": 7}, "tank/b": {"daily": 1}})
    assert timers == [{"frequency": "hourly", "enabled": True}, {"frequency": "daily", "enabled": True},
                      {"frequency": "weekly", "enabled": False}, {"frequency": "monthly", "enabled": False}]
    assert not any(t["enabled"] for t in filters["zfs_snapshot_timers"]({}))
    assert filters["zfs_program_path"]("replicate") == str(Path(replicate.__file__).resolve())
    assert filters["zfs_replica_authorized_key"]("ssh-ed25519 K c", "/p", "/c", ["10.0.0.1"]) == (
        replicate.authorized_key_line("ssh-ed25519 K c", "/p", "/c", ["10.0.0.1"]))


def zpool_module_argv(margs: dict[str, Any]) -> list[str]:
    """The `zpool create` arguments community.general.zpool builds from its parameters."""
    argv = ["create"] + (["-d"] if margs["disable_new_features"] else []) + (["-f"] if margs["force"] else [])
    argv += [x for k, v in margs["pool_properties"].items() for x in ("-o", f"{k}={v}")]
    argv += [x for k, v in margs["filesystem_properties"].items() for x in ("-O", f"{k}={v}")]
    argv.append(margs["name"])
    for vdev in margs["vdevs"]:
        argv += ([vdev["role"]] if vdev.get("role") else []) + ([] if vdev["type"] == "stripe" else [vdev["type"]])
        argv += vdev["disks"]
    return argv


COMPLEX_POOL = {"force": True, "ashift": 13, "properties": {"compression": "zstd", "atime": False},
                "special": {"type": "mirror", "width": 2, "disks": ["nv[1-4]"]},
                "log": ["l1", "l2"], "cache": ["c1", "c2"]}


@pytest.mark.parametrize("kw", [
    {},
    {"vdevs": {"type": "stripe", "width": 1, "disks": ["d[1-3]"]}, "log": ["l1"], "cache": ["c1", "c2", "c3"]},
    {"vdevs": {"type": "raidz2", "width": 6, "disks": ["d[01-12]"]}},
    COMPLEX_POOL,
])
def test_zpool_module_args_create_what_create_args_say(kw: dict[str, Any]) -> None:
    args = zfs.create_args(pool(**kw))
    margs = zfs_filters()["zfs_zpool_module_args"](args)
    assert margs["name"] == "tank"
    assert all(d.startswith("/dev/disk/by-id/") for v in margs["vdevs"] for d in v["disks"])
    # zpool reads the module's arguments as the same pool (and accepts them)
    assert zpool_spec(zpool_module_argv(margs)) == zpool_spec(args)


def test_zpool_module_args_group_the_once_only_classes() -> None:
    margs = zfs_filters()["zfs_zpool_module_args"](zfs.create_args(pool(**COMPLEX_POOL)))
    assert margs["force"] is True
    assert margs["pool_properties"] == {"ashift": "13"}
    assert margs["filesystem_properties"] == {"atime": "off", "compression": "zstd"}
    by_role = [(v.get("role"), v["type"], len(v["disks"])) for v in margs["vdevs"]]
    assert by_role == [(None, "mirror", 2), (None, "mirror", 2), ("log", "mirror", 2),
                       ("special", "mirror", 2), ("special", "mirror", 2), ("cache", "stripe", 2)]
    # the module writes the role before every vdev it gets: one cache vdev per disk would
    # read `cache c1 cache c2`, which zpool refuses
    with pytest.raises(SystemExit, match="'cache' can be specified only once"):
        zpool_spec(["create", "tank", "mirror", "a", "b", "cache", "c1", "cache", "c2"])


@pytest.mark.parametrize(("args", "message"), [
    (["create", "tank", "mirror", "a", "b", "log", "mirror", "l1", "l2", "mirror", "l3", "l4"], "2 log vdevs"),
    (["create", "tank", "draid2:4d", "a", "b", "c", "d", "e", "f"], "draid2:4d vdevs are not supported"),
    (["create", "-o", "ashift=12", "-X", "tank", "a"], "option -X has no zpool module equivalent"),
    (["list", "tank"], "expected zpool create arguments"),
    (["create", "tank", "log", "a"], "no data vdev"),
])
def test_zpool_module_args_refuse_what_the_module_cannot_create(args: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        zfs_filters()["zfs_zpool_module_args"](args)


# =========================================================================== zfs role, kernel path
# The role's pool tasks (roles/zfs/tasks/pool.yml) run against stand-ins for zpool, zfs,
# lsblk and wipefs that keep their state in a directory: every branch of the kernel path
# (create after the safety check, refusal, force, import, drift, idempotence) runs the
# real tasks and filter plugin, with only the binaries simulated.
# zpool's reading of `zpool create` arguments (cmd/zpool/zpool_vdev.c, construct_spec): a
# `log`, `cache` or `spare` keyword may appear once, `special`/`dedup` may repeat, log,
# special and dedup vdevs are disks or mirrors. The stand-in zpool refuses what zpool
# refuses, and tests compare pools by this reading, not by argument order.
ZPOOL_SPEC = r'''
def zpool_spec(args):
    if not args or args[0] != "create":
        raise SystemExit("usage: zpool create ...")
    flags, pool_props, fs_props, opts, i = set(), {}, {}, {}, 1
    while i < len(args) and args[i].startswith("-"):
        if args[i] in ("-o", "-O"):
            key, value = args[i + 1].split("=", 1)
            (pool_props if args[i] == "-o" else fs_props)[key] = value
            i += 2
        elif args[i] in ("-m", "-R", "-t"):
            opts[args[i]] = args[i + 1]
            i += 2
        else:
            flags.add(args[i])
            i += 1
    name, rest = args[i], args[i + 1:]
    types = {"mirror": ("mirror", 2), "raidz": ("raidz1", 2), "raidz1": ("raidz1", 2),
             "raidz2": ("raidz2", 3), "raidz3": ("raidz3", 4)}
    keywords = ("log", "special", "dedup", "cache", "spare")
    top, aux, seen, cls, j = [], {"cache": [], "spare": []}, set(), "data", 0
    while j < len(rest):
        token = rest[j]
        if token in ("log", "special", "dedup"):
            if token == "log" and "log" in seen:
                raise SystemExit("invalid vdev specification: 'log' can be specified only once")
            seen.add(token)
            cls, j = token, j + 1
            continue
        if token in types or token in ("cache", "spare"):
            end = j + 1
            while end < len(rest) and rest[end] not in types and rest[end] not in keywords:
                end += 1
            children = rest[j + 1:end]
            if token in ("cache", "spare"):
                if token in seen:
                    raise SystemExit(f"invalid vdev specification: '{token}' can be specified only once")
                seen.add(token)
                aux[token], cls = sorted(children), "data"
            else:
                kind, least = types[token]
                if cls != "data" and kind != "mirror":
                    raise SystemExit(f"invalid vdev specification: unsupported '{cls}' device: {kind}")
                if len(children) < least:
                    raise SystemExit(f"invalid vdev specification: {token} requires at least {least} devices")
                top.append([cls, kind, sorted(children)])
            j = end
            continue
        top.append([cls, "disk", [token]])
        j += 1
    if not [v for v in top if v[0] == "data"]:
        raise SystemExit("at least one general top-level vdev must be specified")
    return {"name": name, "flags": sorted(flags - {"-n"}), "dry_run": "-n" in flags,
            "pool_properties": pool_props, "filesystem_properties": fs_props, "options": opts,
            "vdevs": sorted(top), "cache": aux["cache"], "spare": aux["spare"]}
'''
_ZPOOL_NS: dict[str, Any] = {}
exec(ZPOOL_SPEC, _ZPOOL_NS)  # zpool_spec() for the tests below (the same text is the stand-in's)
zpool_spec = _ZPOOL_NS["zpool_spec"]

FAKE_TOOL = r'''#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
''' + ZPOOL_SPEC + r'''
state = Path(os.environ["FAKE_ZFS_DIR"])
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(state / "calls.log", "a") as log:
    log.write(json.dumps([tool, *args]) + "\n")
def lines(name):
    p = state / name
    return p.read_text().split() if p.exists() else []
def props():
    p = state / "props.json"
    return json.loads(p.read_text()) if p.exists() else {}
def save_props(d):
    (state / "props.json").write_text(json.dumps(d))
if tool == "lsblk":
    p = state / "lsblk" / Path(args[-1]).name
    if not p.exists():
        sys.exit(32)
    print(p.read_text())
elif tool == "wipefs":
    p = state / "wipefs" / Path(args[-1]).name
    if p.exists():
        print(p.read_text())
elif tool == "zpool":
    cmd = args[0]
    if cmd == "list":
        sys.exit(0 if args[-1] in lines("pools") else 1)
    if cmd == "import" and args[-1] == "/dev/disk/by-id":
        names = lines("importable")
        print("".join(f"   pool: {n}\n     id: 1\n  state: ONLINE\n" for n in names))
        sys.exit(0 if names else 1)
    if cmd == "import":
        (state / "pools").write_text(" ".join(lines("pools") + [args[-1]]))
        sys.exit(0)
    if cmd == "create":
        spec = zpool_spec(args)  # exits 1 with zpool's message on a bad specification
        if spec["name"] in lines("pools"):
            sys.exit(f"cannot create '{spec['name']}': pool already exists")
        if spec["dry_run"]:
            print(f"would create '{spec['name']}' with the following layout:")
            sys.exit(0)
        (state / "pools").write_text(" ".join(lines("pools") + [spec["name"]]))
        sys.exit(0)
    if cmd == "status":
        print((state / ("status_" + args[-1])).read_text())
        sys.exit(0)
    if cmd == "get":
        print(f"NAME PROPERTY VALUE SOURCE\n{args[-1]} version - default")
        sys.exit(0)
    sys.exit(2)
elif tool == "zfs":
    d = props()
    cmd, name = args[0], args[-1]
    if cmd == "list":
        sys.exit(0 if name in d or name in lines("pools") else 1)
    if cmd == "create":
        opts, it = {}, iter(args[1:-1])
        for a in it:
            if a == "-o":
                key, value = next(it).split("=", 1)
                opts[key] = value
        d[name] = opts
        save_props(d)
    elif cmd == "set":
        key, value = args[1].split("=", 1)
        d.setdefault(name, {})[key] = value
        save_props(d)
    elif cmd == "get":
        # zfs get [-H] [-p] [-o col,...] PROPS|all NAME: the requested columns, tab-separated
        opts, it = [], iter(args[1:-1])
        cols = ["name", "property", "value", "source"]
        for a in it:
            if a == "-o":
                cols = next(it).split(",")
            elif not a.startswith("-"):
                opts.append(a)
        local = d.get(name, {})
        wanted = list(local) if opts == ["all"] else opts[0].split(",")
        for k in wanted:
            if k in local:
                row = {"name": name, "property": k, "value": local[k], "source": "local"}
            else:  # a property ZFS knows but nobody set
                row = {"name": name, "property": k, "value": "-", "source": "default"}
            print("\t".join(row[c] for c in cols))
    sys.exit(0)
'''


@pytest.fixture
def fake_kernel(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    (state / "lsblk").mkdir(parents=True)
    (state / "wipefs").mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "fake-tool"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    for name in ("zpool", "zfs", "lsblk", "wipefs"):
        (bindir / name).symlink_to(tool)
    return tmp_path


def run_pool_tasks(tmp: Path, pool_vars: dict[str, Any], *options: str) -> subprocess.CompletedProcess[str]:
    playbook = tmp / "play.yml"
    playbook.write_text(json.dumps([{
        "name": "Pool tasks of the zfs role against stand-in binaries",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "environment": {"PATH": f"{tmp / 'bin'}:/usr/bin:/bin", "FAKE_ZFS_DIR": str(tmp / "state")},
        "tasks": [{"ansible.builtin.include_role": {"name": "zfs", "tasks_from": "pool"},
                   "vars": {"__zfs_pool": pool_vars}}],
    }]))
    venv_bin = Path(sys.executable).parent
    # under Mitogen (`apply --strategy mitogen`): its loops of probes, one module per disk,
    # take half the time of a new Python per module; what the tasks decide is the same
    env = {**os.environ, **strategy_env("mitogen"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
           "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [str(venv_bin / "ansible-playbook"), "-i", "localhost,", str(playbook),
         "-e", json.dumps({"__zfs_zpool": str(tmp / "bin" / "zpool"),
                           "ansible_python_interpreter": sys.executable}), *options],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )


def calls(tmp: Path, tool: str, sub: str) -> list[list[str]]:
    out = [json.loads(x) for x in (tmp / "state" / "calls.log").read_text().splitlines()]
    return [c[1:] for c in out if c[0] == tool and c[1] == sub]


def blank_disks(tmp: Path, disks: list[str]) -> None:
    for d in disks:
        (tmp / "state" / "lsblk" / d).write_text(lsblk())


def llm_pool_vars(llm: Manifest) -> dict[str, Any]:
    from provisioner.areas.storage import rolevars as rv

    pools: list[dict[str, Any]] = rv.zfs_pool_vars(llm, llm.node("head01"))
    return pools[0]


def pool_vars_of(p: ZfsPool) -> dict[str, Any]:
    """The role's variables for one pool (as provisioner.rolevars.storage writes them)."""
    layout = zfs.pool_layout(p)
    return {"name": p.name, "purpose": p.purpose, "force": p.force, "create_args": zfs.create_args(p),
            "layout": layout.to_dict(), "summary": layout.summary(), "disks": layout.disks(),
            "properties": {k: zfs.property_text(v) for k, v in sorted(p.properties.items())}, "datasets": []}


def never_reshaped(tmp: Path) -> None:
    """No zpool subcommand that changes an existing pool's vdevs ever ran."""
    for sub in ("add", "remove", "destroy", "attach", "detach", "replace", "labelclear"):
        assert calls(tmp, "zpool", sub) == [], sub


def test_role_creates_pool_on_blank_disks_then_is_idempotent(fake_kernel: Path, llm: Manifest) -> None:
    pool_vars = llm_pool_vars(llm)
    blank_disks(fake_kernel, pool_vars["disks"])
    first = run_pool_tasks(fake_kernel, pool_vars)
    assert first.returncode == 0, first.stdout + first.stderr
    assert calls(fake_kernel, "zpool", "create") == [pool_vars["create_args"]]
    props = json.loads((fake_kernel / "state" / "props.json").read_text())
    assert props["tank"]["org.debian:periodic-scrub"] == "disable"
    assert props["tank"]["compression"] == "lz4"
    assert props["tank/home"] == {"quota": "2T", "recordsize": "128K"}
    # second run: the pool exists and matches the manifest
    (fake_kernel / "state" / "status_tank").write_text(STATUS_LLM)
    second = run_pool_tasks(fake_kernel, pool_vars)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "changed=0" in second.stdout
    assert "DRIFT" not in second.stdout
    assert len(calls(fake_kernel, "zpool", "create")) == 1
    never_reshaped(fake_kernel)


def test_role_creates_a_pool_with_special_log_and_cache_vdevs(fake_kernel: Path) -> None:
    pool_vars = pool_vars_of(pool(**COMPLEX_POOL))
    blank_disks(fake_kernel, pool_vars["disks"])
    result = run_pool_tasks(fake_kernel, pool_vars)
    assert result.returncode == 0, result.stdout + result.stderr
    (created,) = calls(fake_kernel, "zpool", "create")
    # two special mirrors, a log mirror and two cache disks: zpool (the stand-in refuses
    # what zpool refuses) reads the module's command as the pool create_args describes
    assert zpool_spec(created) == zpool_spec(pool_vars["create_args"])
    assert zpool_spec(created)["flags"] == ["-f"]
    never_reshaped(fake_kernel)


def test_role_in_check_mode_probes_and_dry_runs_the_creation(fake_kernel: Path, llm: Manifest) -> None:
    pool_vars = llm_pool_vars(llm)
    blank_disks(fake_kernel, pool_vars["disks"])
    result = run_pool_tasks(fake_kernel, pool_vars, "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    (dry,) = calls(fake_kernel, "zpool", "create")
    assert zpool_spec(dry) == zpool_spec(pool_vars["create_args"]) | {"dry_run": True}
    assert not (fake_kernel / "state" / "pools").exists()  # nothing created
    assert calls(fake_kernel, "zfs", "create") == [] and calls(fake_kernel, "zfs", "set") == []
    # the disk-safety check runs in check mode too
    used = pool_vars["disks"][0]
    (fake_kernel / "state" / "lsblk" / used).write_text(lsblk(pttype="gpt"))
    refused = run_pool_tasks(fake_kernel, pool_vars, "--check")
    assert refused.returncode != 0
    assert "REFUSED: pool tank is not created" in refused.stdout
    assert len(calls(fake_kernel, "zpool", "create")) == 1


def test_role_refuses_disks_with_data(fake_kernel: Path, llm: Manifest) -> None:
    pool_vars = llm_pool_vars(llm)
    blank_disks(fake_kernel, pool_vars["disks"])
    used = pool_vars["disks"][3]
    (fake_kernel / "state" / "lsblk" / used).write_text(
        lsblk([{"name": "sdd1", "type": "part", "fstype": "ext4", "mountpoint": None}], pttype="gpt"))
    result = run_pool_tasks(fake_kernel, pool_vars)
    assert result.returncode != 0
    assert "REFUSED: pool tank is not created" in result.stdout
    assert f"{used}: has part sdd1 (ext4)" in result.stdout
    assert calls(fake_kernel, "zpool", "create") == []
    # force: true lets it overwrite the data (and says so)
    forced = run_pool_tasks(fake_kernel, pool_vars | {"force": True,
                            "create_args": ["create", "-f", *pool_vars["create_args"][1:]]})
    assert forced.returncode == 0, forced.stdout
    assert "FORCE: pool tank overwrites:" in forced.stdout
    assert calls(fake_kernel, "zpool", "create")[0][:2] == ["create", "-f"]


def test_role_refuses_missing_disks(fake_kernel: Path, llm: Manifest) -> None:
    pool_vars = llm_pool_vars(llm)
    blank_disks(fake_kernel, pool_vars["disks"][:-1])
    result = run_pool_tasks(fake_kernel, pool_vars | {"force": True})
    assert result.returncode != 0
    assert f"{pool_vars['disks'][-1]}: not present under /dev/disk/by-id" in result.stdout
    assert calls(fake_kernel, "zpool", "create") == []


def test_role_imports_an_exported_pool_and_reports_drift(fake_kernel: Path, llm: Manifest) -> None:
    pool_vars = llm_pool_vars(llm)
    (fake_kernel / "state" / "importable").write_text("tank")
    drifted = STATUS_LLM.replace("V8G00008-part1", "V8G00009-part1")
    (fake_kernel / "state" / "status_tank").write_text(drifted)
    result = run_pool_tasks(fake_kernel, pool_vars)
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls(fake_kernel, "zpool", "import")[-1] == ["import", "-d", "/dev/disk/by-id", "tank"]
    assert calls(fake_kernel, "zpool", "create") == []
    assert "DRIFT: pool tank differs from the manifest" in result.stdout
    assert f"mirror({HGST}7, {HGST}8) is in the manifest but not in the pool" in result.stdout
    assert calls(fake_kernel, "lsblk", "--json") == []  # an existing pool's disks are not probed
    never_reshaped(fake_kernel)
