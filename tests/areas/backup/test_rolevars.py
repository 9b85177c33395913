"""The backup role's variables: the tool itself, its configuration, the timer, the key's path."""

from __future__ import annotations

import json
from typing import Any

import yaml

from provisioner.areas.backup import decide, rolevars
from provisioner.inventory import build


def _manifest(kit: Any) -> Any:
    data = kit.example("music-lab.yaml")
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "LAB_BACKUP_KEY", "schedule": "hourly"}
    return kit.load(data).manifest


def test_nothing_without_a_backup_section(kit: Any) -> None:
    m = kit.load(kit.example("music-lab.yaml")).manifest
    assert rolevars.cluster_vars(m) == {} and rolevars.groups(m) == {"backup_head": set()}


def test_the_role_gets_the_tool_its_config_and_the_keys_path(kit: Any) -> None:
    m = _manifest(kit)
    v = rolevars.cluster_vars(m)
    assert v["backup_tool"]["content"].startswith('"""The head node\'s backup tool')
    assert v["backup_config"] == decide.tool_config(m)
    assert v["backup_on_calendar"] == "*-*-* *:00:00 UTC"
    assert v["backup_key_source"].endswith("/secrets/backup.key")
    assert rolevars.groups(m) == {"backup_head": {"labhead"}}


def test_every_variable_is_declared_by_the_role(kit: Any) -> None:
    specs = yaml.safe_load((kit.root / "roles" / "backup" / "meta" / "argument_specs.yml").read_text())
    declared = set(specs["argument_specs"]["main"]["options"])
    assert set(rolevars.cluster_vars(_manifest(kit))) <= declared


def test_the_inventory_writes_the_tool_unsafe_and_no_key(kit: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("LAB_BACKUP_KEY", "correct horse battery staple")
    files = build(_manifest(kit), source="m.yaml")
    text = files["group_vars/all/backup.json"]
    assert '"__ansible_unsafe"' in text and "correct horse" not in "".join(files.values())
    assert json.loads(text)["backup_config"]["key_file"] == decide.KEY_FILE
