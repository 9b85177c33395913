"""`provision apply --json` (and --check --json): one object on stdout, what ran on each node,
the live display on stderr. Ansible and the reach probe are replaced by fakes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioner import apply as apply_mod
from provisioner.cli import main
from provisioner.runner import HostProgress, RunResult
from provisioner.state import StateDir

Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def ansible(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """site.yml 'runs': head01 ok, node01 failed; node02's SSH port refuses (the probe)."""
    ran: list[list[str]] = []

    def run_playbook(**kwargs: Any) -> RunResult:
        ran.append(list(kwargs["hosts"]))
        tracker = kwargs["tracker"]
        for h in kwargs["hosts"]:
            tracker.hosts[h] = HostProgress(h, ok=1, events=1, failed=int(h == "node01"))
        tracker.finished = True
        return RunResult(2, "failed", tracker.hosts, kwargs["state"].runs / kwargs["run_id"] / "artifacts")

    monkeypatch.setattr(apply_mod, "run_playbook", run_playbook)
    monkeypatch.setattr(apply_mod, "unreachable_now", lambda loaded, names: {
        n: "connection refused (10.0.0.22:22)" for n in names if n == "node02"})
    return ran


def test_apply_in_json(write_manifest: Any, kit: Any, ansible: list[list[str]], capsys: Capsys) -> None:
    """apply had no --json (issue 27 item 13). Exit 1 as without it (a node failed)."""
    path = write_manifest(kit.base())
    assert main(["apply", str(path), "--yes", "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "recap" in captured.err and "failed nodes: node[01-02]; re-run" in captured.err
    run = doc["runs"][0]
    assert run["check"] is False and run["result"] == "failed" and run["log"].endswith("/artifacts/stdout")
    assert run["nodes"] == {"head01": "ok", "node01": "failed", "node02": "unreachable"}
    assert (doc["ok"], doc["check"], doc["rolling"], doc["gate"]) == (False, False, None, None)
    assert doc["nodes"] == [{"node": "head01", "result": "ok"}, {"node": "node01", "result": "failed"},
                            {"node": "node02", "result": "unreachable"}]
    assert StateDir.beside(path).load().runs[-1].id == run["id"]  # the run the state records


def test_a_dry_run_in_json(write_manifest: Any, kit: Any, ansible: list[list[str]], capsys: Capsys) -> None:
    path = write_manifest(kit.base())
    assert main(["apply", str(path), "--check", "--json", "--limit", "head01,node01"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["check"] is True and [r["check"] for r in doc["runs"]] == [True]
    assert doc["nodes"] == [{"node": "head01", "result": "ok"}, {"node": "node01", "result": "failed"}]
    assert not (path.parent / ".provision").exists()  # a dry run leaves the state directory alone


def test_a_disk_holding_data_stops_the_apply_before_any_play(write_manifest: Any, kit: Any,
                                                              ansible: list[list[str]], capsys: Capsys,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A role would refuse the disk halfway through the run, after the plays before storage
    ran everywhere; read first (the read: tests/test_live.py, the judgement:
    tests/areas/storage/test_precheck.py), the apply stops with nothing run or recorded."""
    asked: list[list[str]] = []

    def reads(loaded: Any, st: Any, state: Any, names: list[str]) -> list[apply_mod.live.DiskVerdict]:
        asked.append(names)
        return [apply_mod.live.DiskVerdict("head01", ["REFUSED: pool tank is not made; its disks are missing, "
                                                      "in use or hold data (...):",
                                                      "ata-DISK_2: holds a ext4 signature"]),
                apply_mod.live.DiskVerdict("node01", notes=["scratch volume 1 disk: not read before the apply "
                                                            "(mdadm is not installed yet); the role checks its disks"]),
                apply_mod.live.DiskVerdict("node02", error="ssh: connect to host 10.0.0.22 port 22: refused")]

    monkeypatch.setattr(apply_mod, "disk_reads", reads)
    path = write_manifest(kit.base(storage=True))
    assert main(["apply", str(path), "--yes"]) != 0
    captured = capsys.readouterr()
    err = captured.err
    assert asked == [["head01", "node01", "node02"]]  # the nodes whose plays may format
    assert ansible == []
    assert ("nothing was changed; disks the plays would take hold data or are in use:\n"
            "  head01: REFUSED: pool tank is not made") in err
    assert "  head01: ata-DISK_2: holds a ext4 signature" in err
    assert "node01: scratch volume 1 disk: not read before the apply (mdadm is not installed yet)" in captured.out
    assert "node02: disks not read before the apply (ssh: connect to host 10.0.0.22 port 22: refused)" in captured.out
    assert not StateDir.beside(path).state_file.exists()
