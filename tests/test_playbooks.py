"""playbooks/: what the plays ask of every node before their first task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas import registry

ROOT = Path(__file__).resolve().parents[1]
PLAYS = [
    (path.name, play)
    for path in sorted((ROOT / "playbooks").glob("*.yml"))
    for play in yaml.safe_load(path.read_text()) or []
    if "hosts" in play
]


def test_the_plays_are_found() -> None:
    assert {name for name, _ in PLAYS} >= {"common.yml", "storage.yml", "gpu.yml", "slurm.yml", "baremetal.yml"}


def test_each_area_has_a_playbook_named_after_it() -> None:
    """site.yml imports one playbook per area, ``<area>.yml``, in registry order; the area
    that installs nodes has its own (the install server's), which apply runs before installs."""
    entries = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    site = [entry["ansible.builtin.import_playbook"] for entry in entries]
    assert site == [f"{area.name}.yml" for area in registry.AREAS if area.install is None]
    installers = [area for area in registry.AREAS if area.install is not None]
    assert [area.install.playbook for area in installers if area.install] == [f"{a.name}.yml" for a in installers]
    assert {path.name for path in (ROOT / "playbooks").glob("*.yml")} == {
        "site.yml", *(f"{area.name}.yml" for area in registry.AREAS)}


@pytest.mark.parametrize(("playbook", "play"), PLAYS, ids=[str(p.get("name", "")) for _, p in PLAYS])
def test_no_play_gathers_every_fact(playbook: str, play: dict[str, Any]) -> None:
    """A full gather (hardware, every mount and device) costs seconds per node, on every new
    node and under emulation far more: a play gathers nothing (its roles gather the subsets
    they read, when they are not cached) or names the subsets it reads."""
    if play.get("gather_facts", True) is False:
        return
    subset = play.get("gather_subset")
    assert subset, f"{playbook}: play {play.get('name')!r} gathers every fact"
    assert not {"all", "hardware"} & set(subset), f"{playbook}: play {play.get('name')!r} gathers {subset}"
