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
