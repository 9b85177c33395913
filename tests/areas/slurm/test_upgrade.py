"""provisioner.areas.slurm.upgrade: SchedMD's order and release windows, from what the nodes ran
at their last good apply to what the manifest asks."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas.slurm.build import NOT_INSTALLED_YET
from provisioner.areas.slurm.upgrade import order, path, plan_view, recorded
from provisioner.manifest import Manifest


def built(m: Manifest, **settings: Any) -> Manifest:
    slurm = m.slurm.model_copy(update={"source": "build", **settings})
    return m.model_copy(update={"slurm": slurm})


def configured(m: Manifest, record: dict[str, str] | None = None) -> dict[str, dict[str, str] | None]:
    return {n.name: dict(record or {}) for n in m.nodes}


@pytest.mark.parametrize(("running", "target", "steps"), [
    ("22.05", "22.05", []),
    ("22.05", "23.11", ["23.11"]),  # two back
    ("23.11", "24.11", ["24.11"]),
    ("23.11", "25.05", ["25.05"]),  # three back from 24.11 on
    ("22.05", "24.11", ["23.11", "24.11"]),  # 24.11 takes 23.02, 23.11, 24.05: not 22.05
    ("21.08", "25.05", ["23.02", "24.11", "25.05"]),  # 24.11 takes 23.02
])
def test_path_goes_as_far_as_each_window_allows(running: str, target: str, steps: list[str]) -> None:
    assert path(running, target) == steps


def test_no_downgrade() -> None:
    with pytest.raises(ValueError, match=r"older than the running 25\.05"):
        path("25.05", "24.11")


def test_the_os_slurm_needs_no_upgrade(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert order(m, configured(m)).steps == [] and order(m, configured(m)).refusal == ""
    assert recorded(m, m.head) == {"slurm": "23.11"}  # the base manifest is on ubuntu-24.04


def test_schedmds_order_from_the_os_slurm_to_the_built_one(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12")  # the OS's 22.05 today
    data["slurm"]["accounting"] = True
    m = built(kit.load(data).manifest, version=None)
    before = configured(m)  # applied before the record existed: the OS's Slurm
    refused = order(m, before)  # 22.05 -> 25.05 is not one step
    assert refused.steps == [] and refused.refusal == (
        "head01,node[01-02] run Slurm 22.05, which Slurm 25.05 cannot upgrade in place (it takes its own and the "
        "3 previous releases): upgrade to Slurm 23.11 first (slurm.version of that release), then to 25.05 "
        "(22.05 -> 23.11 -> 25.05)")
    up = order(m, configured(m, {"slurm": "23.11"}))
    assert up.refusal == "" and up.steps == [
        "back up slurmdbd's database and slurmctld's StateSaveLocation first: provision backup (Slurm 23.11 -> 25.05)",
        "slurmdbd on head01 (it converts the database; slurmctld waits for it)",
        "slurmctld on head01",
        "slurmd on node[01-02], a batch at a time, drained first: provision apply --rolling",
    ]
    assert recorded(m, m.head) == {"slurm": "25.05"}


def test_new_nodes_and_settled_nodes_need_nothing(kit: Any) -> None:
    m = built(kit.load(kit.on_os(kit.base(), "debian-12")).manifest)
    assert order(m, {}).steps == []  # a new cluster: nothing runs yet
    assert order(m, configured(m, {"slurm": "25.05"})).steps == []
    half = configured(m, {"slurm": "25.05"}) | {"node02": {"slurm": "24.11"}}  # a roll stopped half-way
    assert order(m, half).steps == ["slurmd on node02, a batch at a time, drained first: provision apply --rolling"]


def test_a_downgrade_is_refused(kit: Any) -> None:
    m = built(kit.load(kit.on_os(kit.base(), "debian-12")).manifest, version="24.11.6")
    assert "Slurm cannot downgrade in place" in order(m, configured(m, {"slurm": "25.05"})).refusal


def test_apply_keeps_off_a_built_slurm_until_the_role_installs_it(kit: Any) -> None:
    m = kit.load(kit.on_os(kit.base(), "debian-12")).manifest
    assert plan_view(m, configured(m)) == ([], "")
    steps, refusal = plan_view(built(m), {})  # a new cluster: no steps, still refused
    assert (steps, refusal) == ([], NOT_INSTALLED_YET)
    steps, refusal = plan_view(built(m), configured(m, {"slurm": "23.11"}))
    assert steps[-1].startswith("slurmd on node[01-02]") and refusal == NOT_INSTALLED_YET
