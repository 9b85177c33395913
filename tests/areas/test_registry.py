"""provisioner.areas.registry: what the engine asks of the areas, gathered from their entries."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas import registry
from provisioner.areas.baremetal import install as baremetal_install
from provisioner.areas.slurm.munge import MUNGE_KEY_NAME, ensure_munge_key
from provisioner.state import StateDir


def test_every_group_has_one_area(kit: Any) -> None:
    m = kit.load(kit.example("music-lab.yaml")).manifest
    g = registry.groups(m)
    assert {"gpu", "docker", "zfs", "nfs_server", "nfs_client", "mergerfs", "infiniband", "roce",
            "scratch", "slurm_controller", "slurm_compute", "slurm_node", "slurm_containers", "monitoring_server",
            "monitoring_node", "backup_head"} == set(g)
    assert g["zfs"] == {"store1", "store2"}


def test_a_group_made_by_two_areas_is_refused(kit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = next(a for a in registry.AREAS if a.name == "gpu")
    twin = dataclasses.replace(gpu, name="twin")
    monkeypatch.setattr(registry, "AREAS", (*registry.AREAS, twin))
    with pytest.raises(ValueError, match="inventory group 'gpu' is made by two areas"):
        registry.groups(kit.load(kit.base()).manifest)


def test_the_installing_area_loads_its_runner_only_when_asked() -> None:
    installer = registry.install()
    assert installer is not None and installer.playbook == "baremetal.yml"
    steps = installer.steps()
    assert steps.install is baremetal_install.install and steps.server_vars is baremetal_install.server_vars


def test_secret_values_come_from_the_areas(tmp_path: Path) -> None:
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    assert registry.secret_values(state) == []
    ensure_munge_key(state.secrets / MUNGE_KEY_NAME)
    raw = (state.secrets / MUNGE_KEY_NAME).read_bytes()
    assert raw.hex() in registry.secret_values(state)


def test_secret_envs_come_from_the_areas(kit: Any) -> None:
    m = kit.load(kit.example("llm-200k.yaml")).manifest
    assert "LLM_SMTP_PASSWORD" in registry.secret_envs(m)
    assert registry.secret_envs(kit.load(kit.base()).manifest) == set()


def test_each_area_with_verify_checks_adds_its_own(kit: Any) -> None:
    assert [a.name for a in registry.AREAS if a.verify is not None] == ["common", "fabric", "storage", "people",
                                                                        "gpu", "slurm", "backup"]
    m = kit.load(kit.base(storage=True)).manifest
    common, fabric, storage, people, gpu, slurm_checks, backup = ([c.name for c in checks(m.node("node01"), "")]
                                                                  for checks in registry.verify_checks(m))
    assert common[:2] == ["hosts", "clock"]
    assert fabric == people == backup == []  # no RDMA fabric, no users, no backup section: no check
    assert "mount:/data" in storage and "gpu.count" in gpu and "docker.runtime" in gpu
    assert slurm_checks[0] == "slurm.node"
    bare = kit.load(kit.base()).manifest  # no storage sections: the storage area checks only scratch there
    assert [c.name for c in registry.verify_checks(bare)[2](bare.node("node01"), "")] == [
        "mount:/scratch", "io:/scratch"]
    assert registry.verify_checks(bare)[2](bare.node("head01"), "") == []  # no scratch disk
