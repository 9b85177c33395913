"""`provision status`: the table and JSON from the state and a faked probe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import status as status_cmd
from provisioner.runner import SshTarget
from provisioner.state import NodeState, RunRecord, State, StateDir
from provisioner.status import NODE_PROBE, PROBE_TIMEOUT, SLURM_PROBE
from provisioner.verify.check import Output
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
    """Unknowns are null, not "-" or "?/2" (issue 27 item 10); a node that could not be
    probed makes the exit 1, said once on stderr."""
    sent = fake(monkeypatch, Output(stdout="node01|idle\nnode02|down*\n"))
    assert main(["status", str(manifest), "--json"]) == 1
    captured = capsys.readouterr()
    found = {r["node"]: r for r in json.loads(captured.out)}
    assert found["node01"] == {"node": "node01", "lifecycle": "configured", "last_result": "failed",
                               "applied_at": "2026-11-23T05:00:00+00:00", "reachable": True, "reach_detail": None,
                               "uptime_s": 4000.0, "slurm": "idle", "gpus_seen": 2, "gpus_expected": 2,
                               "nvidia_smi": True}
    assert found["node02"]["reachable"] is False and found["node02"]["reach_detail"].startswith("timed out")
    assert found["node02"]["slurm"] == "down*" and found["node02"]["gpus_seen"] is None
    assert found["node02"]["last_result"] is None and found["node02"]["applied_at"] is None
    assert found["head01"]["slurm"] is None and found["head01"]["nvidia_smi"] is False
    assert captured.err == "status: 1 of 3 nodes could not be probed: node02\n"
    assert ("head01", SLURM_PROBE) in sent


def test_status_table_and_a_failed_sinfo(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    """The controller's error was repeated in every node's slurm column, storage nodes too,
    and the exit was 0."""
    fake(monkeypatch, Output(rc=1, stderr="slurm_load_partitions: Unable to contact slurm controller\n"))
    assert main(["status", str(manifest), "--limit", "node01,head01"]) == 1
    captured = capsys.readouterr()
    assert "status testc" in captured.out and "node01" in captured.out and "node02" not in captured.out
    assert "Unable to contact" not in captured.out
    row = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
           for line in captured.out.splitlines() if line.startswith("│")}
    assert row["node01"][5] == "?" and row["head01"][5] == "-"  # unknown for the compute node; head is none
    assert captured.err == ("status: sinfo on head01: slurm_load_partitions: Unable to contact slurm controller\n")


def test_status_without_probe_contacts_nobody(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: Capsys) -> None:
    sent = fake(monkeypatch, Output())
    assert main(["status", str(manifest), "--no-probe", "--json"]) == 0
    assert sent == []
    found = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert found["node02"]["lifecycle"] == "new" and found["node01"]["reachable"] is None


def test_status_waits_for_a_node_as_documented(manifest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README: at most 10 s per node; status said 'timed out after 15 s'."""
    bounds: list[float] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            bounds.append(timeout + grace)
            return Output(stdout="uptime=1\n")
        return execute

    monkeypatch.setattr(status_cmd, "ssh_executor", executor)
    main(["status", str(manifest)])
    assert bounds and set(bounds) == {PROBE_TIMEOUT} and PROBE_TIMEOUT == 10


def test_status_after_a_killed_apply_says_so(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: Capsys) -> None:
    sd = StateDir.beside(manifest)
    st = sd.load()
    st.runs.append(RunRecord(id="r9", started="2026-11-24T05:00:00+00:00"))  # SIGKILLed: still "running"
    sd.save(st)
    fake(monkeypatch, Output())
    main(["status", str(manifest), "--no-probe", "--json"])
    found = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert found["node01"]["last_result"] == "interrupted (run r9 ended without recording its result)"
    with sd.lock("apply"):  # an apply that is running now
        main(["status", str(manifest), "--no-probe", "--json"])
    found = {r["node"]: r for r in json.loads(capsys.readouterr().out)}
    assert found["node01"]["last_result"] == "running (run r9)"
