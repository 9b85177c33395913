"""provisioner.areas.slurm.releases: Slurm releases per OS: conflicts with the controller, cgroups or not."""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm.releases import (
    SLURM_RELEASES,
    cgroup_plan,
    problems,
    releases_back,
    slurm_versions,
    version_conflicts,
)
from provisioner.manifest import Manifest


def example(kit: Any, name: str) -> Manifest:
    m: Manifest = kit.load(kit.example(name), name).manifest
    return m


def test_cgroups_on_debian_and_ubuntu_24(kit: Any) -> None:
    for os_name in ("debian-12", "ubuntu-24.04"):
        data = kit.on_os(kit.base(), os_name)
        data["slurm"]["constrain_memory"] = False
        m = kit.load(data).manifest
        plan = cgroup_plan(m)
        assert plan.use_cgroups
        assert plan.proctrack_type == "proctrack/cgroup"
        assert plan.task_plugin == "task/cgroup,task/affinity"
        assert (plan.constrain_cores, plan.constrain_memory, plan.constrain_devices) == (True, False, True)
        assert problems(m) == []


def test_ubuntu_22_falls_back_without_cgroups_and_says_so(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")  # ubuntu-22.04: Slurm 21.08 on cgroup v2
    plan = cgroup_plan(m)
    assert not plan.use_cgroups
    assert (plan.proctrack_type, plan.task_plugin, plan.jobacct_gather_type) == (
        "proctrack/linuxproc", "task/affinity", "jobacct_gather/linux")
    assert not (plan.constrain_cores or plan.constrain_memory or plan.constrain_devices)
    warnings = problems(m)
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
        "ubuntu-22.04 for node[01-02], or slurm.source: build (one Slurm built for every node, whatever its OS "
        "release)")


def test_slurmd_too_old_for_the_controller_is_an_error(kit: Any) -> None:
    data = kit.on_os(kit.base(), "ubuntu-24.04")  # controller 23.11
    data["nodes"][1]["os"] = "ubuntu-22.04"  # slurmd 21.08: three releases behind
    diag = kit.error(data, "more than two releases older")
    assert diag.path == "nodes[1].os"
    assert diag.message.startswith("node[01-02] (ubuntu-22.04) would run Slurm 21.08, more than two "
                                   "releases older than Slurm 23.11 of the controller head01")
    assert diag.message.endswith("Fix: os: ubuntu-24.04 for node[01-02], or slurm.source: build (one Slurm "
                                 "built for every node, whatever its OS release)")


def test_slurmd_two_releases_behind_the_controller_is_fine(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12", nodes=(1,))  # slurmd 22.05, controller 23.11
    m = kit.load(data).manifest
    assert slurm_versions(m) == {"head01": "23.11", "node01": "22.05", "node02": "22.05"}
    assert version_conflicts(m) == []


def test_disabled_slurm_has_no_problems(kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False, "partitions": [{"name": "p", "nodes": ["head01"]}]}
    assert problems(kit.load(data).manifest) == []


def built(m: Manifest, version: str | None = None) -> Manifest:
    """``m`` with slurm.source: build (validate refuses it until the role installs built packages)."""
    slurm = m.slurm.model_copy(update={"source": "build", "version": version})
    return m.model_copy(update={"slurm": slurm})


def test_a_built_slurm_runs_everywhere_and_fences_ubuntu_22(kit: Any) -> None:
    m = built(example(kit, "llm-200k.yaml"))  # ubuntu-22.04: fenced once Slurm is built
    assert set(slurm_versions(m).values()) == {"25.05"}
    plan = cgroup_plan(m)
    assert (plan.use_cgroups, plan.proctrack_type, plan.constrain_devices) == (True, "proctrack/cgroup", True)
    assert problems(m) == []


def test_mixed_os_releases_are_fine_with_a_built_slurm(kit: Any) -> None:
    data = kit.on_os(kit.base(), "ubuntu-24.04", nodes=(1,))
    data["nodes"][0]["os"] = "ubuntu-22.04"  # refused with the OS's Slurm (see above)
    data["slurm"]["source"] = "build"
    loaded = kit.load(data)  # no error, no warning
    assert loaded.warnings == []
    assert version_conflicts(loaded.manifest) == [] and problems(loaded.manifest) == []


def test_release_windows_follow_schedmd() -> None:
    assert [r for r in SLURM_RELEASES if releases_back(r) == 3] == ["24.11", "25.05", "25.11"]
    assert releases_back("23.11") == 2
