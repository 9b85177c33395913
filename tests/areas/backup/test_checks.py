"""What validate says about backup:, at file:line."""

from __future__ import annotations

from typing import Any

import pytest


def _data(kit: Any, **backup: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.example("music-lab.yaml")
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "LAB_BACKUP_KEY", **backup}
    return data


def test_a_clean_backup_section_loads(kit: Any) -> None:
    loaded = kit.load(_data(kit))
    assert loaded.manifest.backup is not None and loaded.manifest.backup.keep == 14


@pytest.mark.parametrize(("backup", "path", "message"), [
    ({"destination": {"dataset": {"node": "store9", "name": "audio/b"}}}, "backup.destination.dataset.node",
     "unknown node 'store9'"),
    ({"destination": {"dataset": {"node": "store1", "name": "tank/b"}}}, "backup.destination.dataset.name",
     "no pool 'tank' on store1"),
    ({"destination": {"path": "/var/lib/slurm"}}, "backup.destination.path", "overlaps /var/lib/slurm/slurmctld"),
    ({"destination": {"path": "/etc/munge/old"}}, "backup.destination.path", "overlaps /etc/munge"),
])
def test_destinations_that_cannot_work(kit: Any, backup: dict[str, Any], path: str, message: str) -> None:
    text = kit.dump(_data(kit, **backup))
    diag = kit.error(text, message)
    assert diag.path == path and diag.line > 0


def test_a_prometheus_snapshot_without_monitoring_is_an_error(kit: Any) -> None:
    data = _data(kit, prometheus=True)
    del data["monitoring"]
    diag = kit.error(data, "no Prometheus to snapshot")
    assert diag.path == "backup.prometheus"


@pytest.mark.parametrize(("backup", "message"), [
    ({"key": "hunter2hunter2hunter2"}, "inline backup key (key) is not allowed"),
    ({"key_env": None}, "give key_env or key_file"),
    ({"key_file": "relative/key"}, "give only one of key_env or key_file"),
    ({"destination": {"path": "/a", "ssh": {"host": "h", "path": "/b"}}}, "exactly one of path, dataset or ssh"),
    ({"at": "2:30"}, "is not HH:MM"),
    ({"keep": 0}, "greater than or equal to 1"),
    ({"schedule": "monthly"}, "'hourly', 'daily', 'weekly' or 'off'"),
])
def test_structural_errors(kit: Any, backup: dict[str, Any], message: str) -> None:
    data = _data(kit, **backup)
    data["backup"] = {k: v for k, v in data["backup"].items() if v is not None}
    assert any(message in d.message for d in kit.errors(data)), [d.message for d in kit.errors(data)]


def test_grafanas_database_where_grafana_is_not_on_the_head_is_an_error(kit: Any) -> None:
    data = _data(kit, grafana=True)
    data["monitoring"]["grafana"] = False
    diag = kit.error(data, "Grafana does not run on the head labhead (monitoring.grafana and monitoring.nodes)")
    assert diag.path == "backup.grafana" and diag.line > 0
