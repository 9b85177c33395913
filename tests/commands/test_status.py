"""`provision status`: the table and JSON from the state and a faked probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import status as status_cmd
from provisioner.runner import SshTarget
from provisioner.state import NodeState, State, StateDir
from provisioner.status import NODE_PROBE, SLURM_PROBE
from provisioner.verify.catalog import Output
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def manifest(write_manifest: Any, kit: Any) -> Path:
    path: Path = write_manifest(kit.base())
    StateDir.beside(path).save(State(cluster="testc", nodes={
        "head01": NodeState(lifecycle="configured", applied_at="2026-11-23T05:00:00+00:00", last_result="ok"),
        "node01": NodeState(lifecycle="configured", applied_at="2026-11-23T05:00:00+00:00", last_result="failed"),
    }))
    return path


def fake(monkeypatch: pytest.MonkeyPatch, sinfo: Output) -> list[tuple[str, str]]:
    sent: list[tuple[str, str]] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            assert host in targets and timeout <= 10
            sent.append((host, text))
            if text == SLURM_PROBE:
                return sinfo
            assert text == NODE_PROBE
            if host == "node02":
                return Output(rc=-1, error="timed out after 15 s (no answer from node02)")
            return Output(stdout="uptime=4000\ngpus=2\n" if host == "node01" else "uptime=4000\ngpus=none\n")
        return execute

    monkeypatch.setattr(status_cmd, "ssh_executor", executor)
    return sent


def test_status_json(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    sent = fake(monkeypatch, Output(stdout="node01|idle\nnode02|down*\n"))
    assert main(["status", str(manifest), "--json"]) == 0
    found = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert found["node01"] == {"node": "node01", "lifecycle": "configured", "last_result": "failed",
                               "applied_at": "2026-11-23T05:00:00+00:00", "reach": "up 1h 6m", "slurm": "idle",
                               "gpus": "2/2"}
    assert found["node02"]["reach"].startswith("timed out") and found["node02"]["slurm"] == "down*"
    assert ("head01", SLURM_PROBE) in sent


def test_status_table_and_a_failed_sinfo(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    fake(monkeypatch, Output(rc=1, stderr="slurm_load_partitions: Unable to contact slurm controller\n"))
    assert main(["status", str(manifest), "--limit", "node01"]) == 0
    out = capsys.readouterr().out
    assert "status testc" in out and "node01" in out and "head01" not in out
    assert "sinfo: slurm_load_partitions: Unable to contact slurm controller" in out


def test_status_without_probe_contacts_nobody(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: Capsys) -> None:
    sent = fake(monkeypatch, Output())
    assert main(["status", str(manifest), "--no-probe", "--json"]) == 0
    assert sent == []
    found = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert found["node02"]["lifecycle"] == "new" and found["node01"]["reach"] == "-"
