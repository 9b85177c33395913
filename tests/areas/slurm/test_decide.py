"""provisioner.areas.slurm.decide: hostlists, node/partition/cgroup decisions, fact checks, munge key."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.areas.slurm import decide as slurm
from provisioner.manifest import Manifest
from provisioner.manifest.slurm import Partition


def example(kit: Any, name: str) -> Manifest:
    m: Manifest = kit.load(kit.example(name), name).manifest
    return m


# --------------------------------------------------------------------------- hostlists
@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["gpu01", "gpu02", "gpu03", "gpu04"], "gpu[01-04]"),
        (["gpu1", "gpu2", "gpu3"], "gpu[1-3]"),
        (["gpu1"], "gpu1"),
        (["gpu01", "gpu02", "gpu04"], "gpu[01-02,04]"),
        (["gpu9", "gpu10", "gpu11"], "gpu[9-11]"),
        (["head", "gpu01", "gpu02"], "head,gpu[01-02]"),
        (["a1", "b1", "a2"], "a[1-2],b1"),
        (["n01", "n1"], "n01,n1"),  # padded and unpadded stay apart
        # a number as wide as the padded ones continues their run (was gpu[0998-0999],gpu1000)
        (["gpu0998", "gpu0999", "gpu1000", "gpu1001"], "gpu[0998-1001]"),
        (["n09", "n10", "n11", "n100"], "n[09-11],n100"),
        (["slurm-gpu01", "slurm-gpu02"], "slurm-gpu[01-02]"),
    ],
)
def test_hostlist(names: list[str], expr: str) -> None:
    assert slurm.hostlist(names) == expr
    assert sorted(slurm.expand_hostlist(expr)) == sorted(names)


@given(
    st.lists(
        st.tuples(st.sampled_from(["gpu", "node-", "cn", "x"]), st.integers(0, 120), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_hostlist_round_trip(items: list[tuple[str, int, bool]]) -> None:
    names = list(dict.fromkeys(f"{p}{n:03d}" if pad else f"{p}{n}" for p, n, pad in items))
    assert sorted(slurm.expand_hostlist(slurm.hostlist(names))) == sorted(names)


def test_expand_hostlist_rejects_garbage() -> None:
    for bad in ("gpu[01-02", "gpu[0x-2]", "gpu01]"):
        with pytest.raises(ValueError, match="bad hostlist"):
            slurm.expand_hostlist(bad)


def test_expand_hostlist_takes_several_brackets_per_item() -> None:
    assert slurm.expand_hostlist("rack[1-2]-n[1-2],head") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2", "head"]


def test_gpu_files() -> None:
    assert slurm.gpu_files(1) == "/dev/nvidia0"
    assert slurm.gpu_files(8) == "/dev/nvidia[0-7]"
    with pytest.raises(ValueError):
        slurm.gpu_files(0)


# --------------------------------------------------------------------------- examples
def test_llm_nodes_and_partitions(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")
    assert slurm.node_definitions(m) == [
        {"name": "gpu[01-04]", "sockets": 1, "cores_per_socket": 24, "threads_per_core": 2,
         "real_memory_mb": 256 * 1024 - 13107, "gres": "gpu:rtx_a6000:2"},
    ]
    assert slurm.partitions(m) == [
        {"name": "gpu", "nodes": "gpu[01-04]", "default": True, "max_time": "7-00:00:00", "default_time": ""},
    ]
    assert slurm.cluster_name(m) == "llm200k"
    assert slurm.controller(m).name == "head01"


def test_music_lab_nodes_and_partitions(kit: Any) -> None:
    m = example(kit, "music-lab.yaml")
    assert slurm.node_definitions(m) == [
        {"name": "gpu[1-3]", "sockets": 1, "cores_per_socket": 24, "threads_per_core": 2,
         "real_memory_mb": 256 * 1024 - 13107, "gres": "gpu:rtx3090:2"},
    ]
    assert slurm.partitions(m) == [
        {"name": "gpu", "nodes": "gpu[1-3]", "default": True, "max_time": "2-00:00:00", "default_time": ""},
        {"name": "debug", "nodes": "gpu1", "default": False, "max_time": "01:00:00", "default_time": ""},
    ]
    assert slurm.problems(m) == []


def test_heterogeneous_nodes_get_one_line_per_hardware(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append({
        "name": "big[01-02]",
        "roles": ["compute"],
        "os": "ubuntu-24.04",  # the controller's (its Slurm must be the newest)
        "interfaces": {"management": {"ip": "10.0.0.40"}},
        "hardware": {"cpu": {"sockets": 2, "cores_per_socket": 32}, "memory_gb": 1024,
                     "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 8}},
    })
    m = kit.load(data).manifest
    defs = slurm.node_definitions(m)
    assert [d["name"] for d in defs] == ["node[01-02]", "big[01-02]"]
    assert defs[1]["gres"] == "gpu:h100_80gb_hbm3:8"
    assert defs[1]["real_memory_mb"] == 1024 * 1024 - 1024 * 1024 // 20  # 5 %, uncapped (issue 19 item 13)
    # DefMemPerCPU: the smallest memory per thread over all slurmd nodes
    assert slurm.default_mem_per_cpu(m) == (128 * 1024 - 6553) // 32


def test_node_without_gpu_has_no_gres(kit: Any) -> None:
    data = kit.base()
    del data["nodes"][1]["hardware"]["gpu"]
    m = kit.load(data).manifest
    assert slurm.node_definitions(m)[0]["gres"] == ""


def test_head_that_computes_is_a_slurmd_node(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["roles"] = ["head", "compute"]
    m = kit.load(data).manifest
    assert slurm.node_definitions(m)[0]["name"] == "head01"
    assert slurm.partitions(m)[0]["nodes"] == "head01,node[01-02]"


def test_default_partition_when_manifest_has_none(kit: Any) -> None:
    data = kit.base()
    del data["slurm"]
    m = kit.load(data).manifest
    assert slurm.partitions(m) == [
        {"name": "compute", "nodes": "node[01-02]", "default": True, "max_time": "INFINITE", "default_time": ""}
    ]


def test_partition_members_limited_to_compute_nodes(kit: Any) -> None:
    # The manifest checks reject these partitions; partitions() still keeps slurm.conf valid.
    m = kit.load(kit.base()).manifest
    m.slurm.partitions = [
        Partition(name="all", nodes=["head01", "node01"], max_time="1:00:00", default_time="30"),
        Partition(name="heads", nodes=["@head"]),
        Partition(name="ghost", nodes=["nosuchnode"]),
        Partition(name="x", nodes=["node02"], default=True),
        Partition(name="y", nodes=["node01"], default=True),
    ]
    assert slurm.partitions(m) == [
        {"name": "all", "nodes": "node01", "default": False, "max_time": "1:00:00", "default_time": "30"},
        {"name": "x", "nodes": "node02", "default": True, "max_time": "INFINITE", "default_time": ""},
        {"name": "y", "nodes": "node01", "default": False, "max_time": "INFINITE", "default_time": ""},
    ]


def test_partitions_checked_by_the_manifest_checks(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"] = [{"name": "heads", "nodes": ["head01"]}]
    kit.error(data, "head01 does not have role 'compute'")


def test_no_compute_node_reported(kit: Any) -> None:
    data = kit.base()
    data["nodes"] = data["nodes"][:1]
    del data["slurm"]
    data["docker"] = {"enabled": False}
    m = kit.load(data).manifest
    assert slurm.partitions(m) == []
    assert any("no node has role 'compute'" in p for p in slurm.problems(m))


def test_first_partition_is_default_when_none_is(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"] = [{"name": "a", "nodes": ["node01"]}, {"name": "b", "nodes": ["node02"]}]
    parts = slurm.partitions(kit.load(data).manifest)
    assert [p["default"] for p in parts] == [True, False]


# --------------------------------------------------------------------------- cgroups, versions
def test_cgroups_on_debian_and_ubuntu_24(kit: Any) -> None:
    for os_name in ("debian-12", "ubuntu-24.04"):
        data = kit.on_os(kit.base(), os_name)
        data["slurm"]["constrain_memory"] = False
        m = kit.load(data).manifest
        plan = slurm.cgroup_plan(m)
        assert plan.use_cgroups
        assert plan.proctrack_type == "proctrack/cgroup"
        assert plan.task_plugin == "task/cgroup,task/affinity"
        assert (plan.constrain_cores, plan.constrain_memory, plan.constrain_devices) == (True, False, True)
        assert slurm.problems(m) == []


def test_ubuntu_22_falls_back_without_cgroups_and_says_so(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")  # ubuntu-22.04: Slurm 21.08 on cgroup v2
    plan = slurm.cgroup_plan(m)
    assert not plan.use_cgroups
    assert (plan.proctrack_type, plan.task_plugin, plan.jobacct_gather_type) == (
        "proctrack/linuxproc", "task/affinity", "jobacct_gather/linux")
    assert not (plan.constrain_cores or plan.constrain_memory or plan.constrain_devices)
    warnings = slurm.problems(m)
    assert len(warnings) == 1 and "NOT fenced" in warnings[0] and "gpu[01-04]" in warnings[0]


def test_slurmd_newer_than_the_controller_is_an_error_with_the_fix(kit: Any) -> None:
    data = kit.on_os(kit.base(), "ubuntu-24.04", nodes=(1,))  # node[01-02]: slurmd 23.11
    data["nodes"][0]["os"] = "ubuntu-22.04"  # controller 21.08
    text = kit.dump(data)
    diag = kit.error(text, "newer than Slurm")
    assert diag.severity == "error"
    assert diag.path == "nodes[1].os"  # the ranged entry, once
    assert diag.line == kit.line_of(text, "os: ubuntu-24.04")
    assert diag.message == (
        "node[01-02] (ubuntu-24.04) would run Slurm 23.11, newer than Slurm 21.08 of the "
        "controller head01 (ubuntu-22.04): slurmctld must be the newest, a newer slurmd or client "
        "cannot register with it. Fix: os: ubuntu-24.04 for head01 (Slurm 23.11), or os: "
        "ubuntu-22.04 for node[01-02]")


def test_slurmd_too_old_for_the_controller_is_an_error(kit: Any) -> None:
    data = kit.on_os(kit.base(), "ubuntu-24.04")  # controller 23.11
    data["nodes"][1]["os"] = "ubuntu-22.04"  # slurmd 21.08: three releases behind
    diag = kit.error(data, "more than two releases older")
    assert diag.path == "nodes[1].os"
    assert diag.message.startswith("node[01-02] (ubuntu-22.04) would run Slurm 21.08, more than two "
                                   "releases older than Slurm 23.11 of the controller head01")
    assert diag.message.endswith("Fix: os: ubuntu-24.04 for node[01-02]")


def test_slurmd_two_releases_behind_the_controller_is_fine(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12", nodes=(1,))  # slurmd 22.05, controller 23.11
    m = kit.load(data).manifest
    assert slurm.slurm_versions(m) == {"head01": "23.11", "node01": "22.05", "node02": "22.05"}
    assert slurm.version_conflicts(m) == []


def test_disabled_slurm_has_no_problems(kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False, "partitions": [{"name": "p", "nodes": ["head01"]}]}
    assert slurm.problems(kit.load(data).manifest) == []


# --------------------------------------------------------------------------- fact checks
EXPECTED = {"name": "gpu01", "cpus": 48, "real_memory_mb": 249037, "memory_gb": 256,
            "gpu_count": 2, "gpu_type": "rtx_a6000", "gpu_files": "/dev/nvidia[0-1]"}
GOOD = {"vcpus": 48, "memtotal_mb": 257000, "gpu_devices": ["/dev/nvidia0", "/dev/nvidia1"]}


def test_facts_matching_the_manifest() -> None:
    assert slurm.fact_report(EXPECTED, GOOD) == {"errors": [], "warnings": []}


def test_fewer_gpus_than_the_manifest() -> None:
    report = slurm.fact_report(EXPECTED, {**GOOD, "gpu_devices": ["/dev/nvidia0"]})
    assert len(report["errors"]) == 1
    msg = report["errors"][0]
    assert "gpu01" in msg and "2 GPU(s) (rtx_a6000)" in msg and "/dev/nvidia1 missing" in msg
    assert "1 /dev/nvidia<N> found: /dev/nvidia0" in msg


def test_no_gpu_device_at_all() -> None:
    report = slurm.fact_report(EXPECTED, {**GOOD, "gpu_devices": []})
    assert "/dev/nvidia0, /dev/nvidia1 missing" in report["errors"][0]
    assert "found: none" in report["errors"][0]


def test_less_memory_than_the_manifest() -> None:
    report = slurm.fact_report(EXPECTED, {**GOOD, "memtotal_mb": 225000})
    assert len(report["errors"]) == 1
    assert "225000 MB" in report["errors"][0] and "RealMemory=249037" in report["errors"][0]


def test_fewer_cpus_than_the_manifest() -> None:
    report = slurm.fact_report(EXPECTED, {**GOOD, "vcpus": 24})
    assert len(report["errors"]) == 1 and "48 CPUs" in report["errors"][0]


def test_more_hardware_is_only_a_warning() -> None:
    report = slurm.fact_report(
        EXPECTED, {"vcpus": 64, "memtotal_mb": 515000, "gpu_devices": [f"/dev/nvidia{i}" for i in range(4)]}
    )
    assert report["errors"] == []
    assert len(report["warnings"]) == 2


def test_node_without_gpus_in_manifest() -> None:
    expected = {**EXPECTED, "gpu_count": 0, "gpu_type": "", "gpu_files": ""}
    assert slurm.fact_report(expected, {**GOOD, "gpu_devices": []}) == {"errors": [], "warnings": []}


# --------------------------------------------------------------------------- munge key
def test_munge_key_created_once_private(tmp_path: Path) -> None:
    key = tmp_path / "state" / "secrets" / "munge.key"
    old = os.umask(0)
    try:
        slurm.ensure_munge_key(key)
    finally:
        os.umask(old)
    st_ = key.stat()
    assert stat.S_IMODE(st_.st_mode) == 0o600
    assert st_.st_size == 1024
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    content = key.read_bytes()
    slurm.ensure_munge_key(key)
    assert key.read_bytes() == content
    assert list(key.parent.iterdir()) == [key]  # no temporary file left behind


def test_munge_keys_are_random(tmp_path: Path) -> None:
    slurm.ensure_munge_key(tmp_path / "a")
    slurm.ensure_munge_key(tmp_path / "b")
    assert (tmp_path / "a").read_bytes() != (tmp_path / "b").read_bytes()


def test_existing_key_kept_and_tightened(tmp_path: Path) -> None:
    key = tmp_path / "munge.key"
    key.write_bytes(b"k" * 64)
    key.chmod(0o644)
    slurm.ensure_munge_key(key)
    assert key.read_bytes() == b"k" * 64
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["dir", "short", "symlink"])
def test_unusable_existing_key_refused(tmp_path: Path, kind: str) -> None:
    key = tmp_path / "munge.key"
    if kind == "dir":
        key.mkdir()
    elif kind == "short":
        key.write_bytes(b"x" * 8)
    else:
        key.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError):
        slurm.ensure_munge_key(key)


def test_prepare_hook_creates_the_key_when_slurm_is_on(kit: Any, tmp_path: Path) -> None:
    from provisioner.state import StateDir

    state = StateDir(tmp_path / ".provision")
    loaded = kit.load(kit.base())
    slurm.prepare_munge_key(loaded, state)
    key = state.secrets / "munge.key"
    assert key.stat().st_size == 1024 and stat.S_IMODE(key.stat().st_mode) == 0o600

    off = kit.base()
    off["slurm"] = {"enabled": False}
    other = StateDir(tmp_path / "other")
    slurm.prepare_munge_key(kit.load(off), other)
    assert not (other.secrets / "munge.key").exists()
