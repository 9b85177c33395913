"""backup.age: the newest backup at the destination is younger than its schedule allows."""

from __future__ import annotations

import datetime as dt
from typing import Any

from provisioner.areas.backup import verify
from provisioner.nodecheck.check import Output

NOW = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC)


def _checks(kit: Any, **backup: Any) -> Any:
    data = kit.example("music-lab.yaml")
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "K", **backup}
    m = kit.load(data).manifest
    return m, verify.checks(m, now=lambda: NOW)


def test_only_the_head_runs_it(kit: Any) -> None:
    m, checks = _checks(kit)
    assert [c.name for c in checks(m.node("labhead"), "")] == ["backup.age"]
    assert checks(m.node("gpu1"), "") == []
    data = kit.example("music-lab.yaml")
    bare = kit.load(data).manifest
    assert verify.checks(bare)(bare.node("labhead"), "") == []


def test_verdicts(kit: Any) -> None:
    m, checks = _checks(kit)
    check = checks(m.node("labhead"), "")[0]
    assert check.command is not None and check.command.text.endswith("newest /etc/provision-backup/config.json")
    judge = check.judge
    assert judge(Output(stdout="2026-11-27T02:30:05+00:00\n")).status == "PASS"
    late = judge(Output(stdout="2026-11-25T02:30:05+00:00\n"))
    assert late.status == "FAIL" and "late" in late.detail
    assert judge(Output(stdout="none\n")).detail == "no backup at the destination"
    assert judge(Output(stdout="2026-11-27T02:30:05\n")).status == "FAIL"  # no zone: unreadable
    assert judge(Output(rc=1, error="timed out")).status == "FAIL"
    m, checks = _checks(kit, schedule="off")
    assert checks(m.node("labhead"), "")[0].judge(Output(stdout="none\n")).status == "SKIP"
