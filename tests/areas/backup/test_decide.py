"""provisioner.areas.backup.decide: destinations, parts, restore order, schedule, lateness,
the tool's configuration, and the operator's key kept out of everything but secrets/."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.backup import decide
from provisioner.manifest.backup import Backup
from provisioner.state import StateDir

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _lab(kit: Any, **backup: Any) -> Any:
    """music-lab (head labhead runs Prometheus; store1/store2 hold pool audio) with a backup."""
    data = kit.example("music-lab.yaml")
    data["slurm"]["accounting"] = True
    data["backup"] = {"destination": {"dataset": {"node": "store2", "name": "audio/backup"}},
                      "key_env": "LAB_BACKUP_KEY", **backup}
    return kit.load(data).manifest


def test_a_dataset_destination_is_its_mountpoint_on_its_storage_node(kit: Any) -> None:
    m = _lab(kit)
    store2 = m.node("store2")
    assert decide.destination(m) == {"kind": "ssh", "user": "root", "host": str(store2.ip), "port": 22,
                                     "path": "/audio/backup"}
    assert decide.describe(decide.destination(m)) == f"root@{store2.ip}:/audio/backup"


def test_path_and_ssh_destinations(kit: Any) -> None:
    m = _lab(kit, destination={"path": "/srv/backup"})
    assert decide.destination(m) == {"kind": "local", "path": "/srv/backup"}
    m = _lab(kit, destination={"ssh": {"host": "vault.example.org", "user": "backup", "port": 2222,
                                       "path": "/srv/heads"}})
    assert decide.describe(decide.destination(m)) == "backup@vault.example.org:2222:/srv/heads"


@pytest.mark.parametrize(("text", "want"), [
    ("/mnt/usb/", {"kind": "local", "path": "/mnt/usb"}),
    ("vault:/srv/b", {"kind": "ssh", "user": "root", "host": "vault", "port": 22, "path": "/srv/b"}),
    ("bk@10.0.0.9:2200:/b", {"kind": "ssh", "user": "bk", "host": "10.0.0.9", "port": 2200, "path": "/b"}),
])
def test_to_takes_a_path_or_an_ssh_target(text: str, want: dict[str, Any]) -> None:
    assert decide.parse_to(text) == want


@pytest.mark.parametrize("text", ["relative/dir", "host:relative", "a b:/x", "h:99999:/x", "-oProxyCommand=x:/y"])
def test_to_refuses_anything_else(text: str) -> None:
    with pytest.raises(decide.BackupConfigError, match="--to"):
        decide.parse_to(text)


def test_parts_follow_the_manifest(kit: Any) -> None:
    m = _lab(kit, prometheus=True)
    assert [(p["name"], p["encrypt"]) for p in decide.parts(m)] == [
        ("munge", True), ("slurmdbd", False), ("slurmctld", False), ("prometheus", False), ("grafana", True)]
    state = next(p for p in decide.parts(m) if p["name"] == "slurmctld")
    assert state["stable"] is True
    assert state["settle"] > 5  # slurmctld's deferred save (SAVE_MAX_WAIT) is over before the copy
    m = _lab(kit)  # not by default: the snapshot API needs Prometheus' admin API
    assert "prometheus" not in [p["name"] for p in decide.parts(m)]


def test_no_accounting_no_database_part(kit: Any) -> None:
    data = kit.example("music-lab.yaml")
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "K"}
    del data["monitoring"]
    m = kit.load(data).manifest
    assert [p["name"] for p in decide.parts(m)] == ["munge", "slurmctld"]
    assert decide.services(m) == {"stop": ["slurmctld", "munge"], "start": ["munge", "slurmctld"]}


def test_restore_stops_the_controller_first_and_starts_munge_first(kit: Any) -> None:
    order = decide.services(_lab(kit, prometheus=True))
    assert order["stop"] == ["grafana-server", "prometheus", "slurmctld", "slurmdbd", "munge"]
    assert order["start"] == ["munge", "slurmdbd", "slurmctld", "prometheus", "grafana-server"]


def test_grafana_is_taken_where_it_runs_on_the_head_unless_the_manifest_says_no(kit: Any) -> None:
    """Its database (users, dashboards made in the web page) is encrypted: it holds password
    hashes and data source secrets."""
    grafana = next(p for p in decide.parts(_lab(kit)) if p["name"] == "grafana")
    assert grafana == {"name": "grafana", "kind": "sqlite", "path": "/var/lib/grafana/grafana.db",
                       "file": "grafana.db.gz", "encrypt": True}
    m = _lab(kit, grafana=False)
    assert "grafana" not in [p["name"] for p in decide.parts(m)] and "grafana-server" not in decide.services(m)["stop"]
    assert decide.problems(m) == []
    data = kit.example("music-lab.yaml")
    data["monitoring"]["grafana"] = False
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "K"}
    assert "grafana" not in [p["name"] for p in decide.parts(kit.load(data).manifest)]  # none to take


@pytest.mark.parametrize(("schedule", "at", "calendar", "limit_h"), [
    ("hourly", "02:30", "*-*-* *:00:00 UTC", 1),
    ("daily", "02:30", "*-*-* 02:30:00 UTC", 24),
    ("weekly", "23:05", "Sun *-*-* 23:05:00 UTC", 168),
    ("off", "02:30", None, None),
])
def test_schedule_and_lateness(schedule: str, at: str, calendar: str | None, limit_h: int | None) -> None:
    b = Backup.model_validate({"destination": {"path": "/b"}, "key_env": "K", "schedule": schedule, "at": at,
                               "timeout_s": 600})
    assert decide.on_calendar(b) == calendar
    limit = decide.max_age(b)
    if limit_h is None:
        assert limit is None
    else:
        assert limit == dt.timedelta(hours=limit_h, minutes=20)  # + a run's 10 min bound + 10 min grace


def test_age_verdicts() -> None:
    b = Backup.model_validate({"destination": {"path": "/b"}, "key_env": "K", "timeout_s": 600})
    fresh = (NOW - dt.timedelta(hours=3)).isoformat()
    late = (NOW - dt.timedelta(hours=25)).isoformat()
    assert decide.age_verdict(b, fresh, NOW) == (True, "newest 2026-11-27 09:00 UTC, 3.0 h old")
    ok, detail = decide.age_verdict(b, late, NOW)
    assert not ok and "late (a daily backup is due within 24.3 h)" in detail
    assert decide.age_verdict(b, "none", NOW) == (False, "no backup at the destination")
    assert decide.age_verdict(b, "soon", NOW)[0] is False
    off = b.model_copy(update={"schedule": "off"})
    assert decide.age_verdict(off, late, NOW)[0] is None
    assert decide.age_verdict(off, "none", NOW) == (None, "no backup yet; no schedule")


def test_the_tool_config_has_the_keys_path_never_a_secret(kit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_BACKUP_KEY", "a passphrase of some length")
    m = _lab(kit, keep=7)
    config = decide.tool_config(m)
    assert (config["cluster"], config["keep"], config["key_file"]) == ("musiclab", 7, decide.KEY_FILE)
    assert "a passphrase" not in json.dumps(config)
    assert decide.tool_config(m, decide.parse_to("/mnt/usb"))["destination"] == {"kind": "local", "path": "/mnt/usb"}


def test_plan_lines_say_where_when_and_what(kit: Any) -> None:
    store2 = _lab(kit).node("store2")
    assert decide.plan_lines(_lab(kit, keep=30, prometheus=True)) == [
        f"backup of labhead daily at 02:30 UTC to root@{store2.ip}:/audio/backup, the newest 30 kept",
        "holds munge, slurmdbd, slurmctld, prometheus, grafana; encrypted: munge, grafana"]


def test_the_slurm_roles_paths_are_the_ones_a_backup_takes(kit: Any) -> None:
    defaults = yaml.safe_load((kit.root / "roles" / "slurm" / "defaults" / "main.yml").read_text())
    assert defaults["slurm_state_save_location"] == decide.STATE_SAVE_LOCATION
    assert defaults["slurm_dbd_storage_loc"] == decide.ACCOUNTING_DB


def test_the_key_goes_to_secrets_only(kit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    data = kit.example("music-lab.yaml")
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "LAB_BACKUP_KEY"}
    loaded = kit.load(data)
    monkeypatch.delenv("LAB_BACKUP_KEY", raising=False)
    with pytest.raises(decide.BackupConfigError, match="LAB_BACKUP_KEY is empty or unset"):
        decide.prepare_key(loaded, state)
    monkeypatch.setenv("LAB_BACKUP_KEY", "short")
    with pytest.raises(decide.BackupConfigError, match="fewer than 16"):
        decide.prepare_key(loaded, state)
    monkeypatch.setenv("LAB_BACKUP_KEY", "correct horse battery staple")
    decide.prepare_key(loaded, state)
    key = state.secrets / decide.KEY_NAME
    assert key.read_text() == "correct horse battery staple\n" and key.stat().st_mode & 0o777 == 0o600
    assert decide.secret_values(state) == ["correct horse battery staple"]
    assert decide.secret_envs(loaded.manifest) == {"LAB_BACKUP_KEY"}
    del data["backup"]
    decide.prepare_key(kit.load(data), state)  # the section went: so does the key
    assert not key.exists() and decide.secret_values(state) == []


def test_a_key_file_readable_by_everyone_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("correct horse battery staple\n")
    os.chmod(path, 0o644)
    b = Backup.model_validate({"destination": {"path": "/b"}, "key_file": str(path)})
    with pytest.raises(decide.BackupConfigError, match="readable by everyone"):
        decide.read_key(b)
    os.chmod(path, 0o600)
    assert decide.read_key(b) == "correct horse battery staple"
