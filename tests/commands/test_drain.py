"""`provision drain` / `provision resume`: scontrol on the controller (a fake), exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import drain as drain_cmd
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]


def fake(monkeypatch: pytest.MonkeyPatch, refuse: str = "") -> list[str]:
    sent: list[str] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        assert set(targets) == {"head01"}

        def execute(host: str, text: str, timeout: int) -> Output:
            sent.append(text)
            if refuse and refuse in text:
                return Output(rc=1, stderr="slurm_update error: Access/permission denied")
            return Output(stdout="NodeName=x State=IDLE" if text.startswith("scontrol show") else "")
        return execute

    monkeypatch.setattr(drain_cmd, "ssh_executor", executor)
    return sent


def test_drain_and_resume(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    path = write_manifest(kit.base())
    sent = fake(monkeypatch)
    assert main(["drain", str(path), "@compute", "--reason", "driver upgrade"]) == 0
    assert "scontrol update NodeName=node01 State=DRAIN Reason='driver upgrade'" in sent
    assert "scontrol update NodeName=node02 State=DRAIN Reason='driver upgrade'" in sent
    assert "node01: drained, no jobs" in capsys.readouterr().out
    sent.clear()
    assert main(["resume", str(path), "node02"]) == 0
    assert sent == ["scontrol show node node02 --oneliner", "scontrol update NodeName=node02 State=RESUME"]


def test_a_refusal_fails_the_command(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                     capsys: Capsys) -> None:
    path = write_manifest(kit.base())
    fake(monkeypatch, refuse="NodeName=node02")
    assert main(["drain", str(path), "node01,node02"]) == 1
    captured = capsys.readouterr()
    assert "node01: drained, no jobs" in captured.out and "drain failed on node02" in captured.err


def test_without_slurm_or_with_an_unknown_node(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                               capsys: Capsys) -> None:
    sent = fake(monkeypatch)
    data = kit.base()
    assert main(["resume", str(write_manifest(data)), "node09"]) == 1
    assert "NODES:" in capsys.readouterr().err
    data["slurm"] = {"enabled": False}
    assert main(["drain", str(write_manifest(data, "other.yaml")), "node01"]) == 1
    assert "slurm.enabled is false" in capsys.readouterr().err
    assert sent == []


def test_drain_and_resume_json(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                               capsys: Capsys) -> None:
    """--json on every verb that reports (issue 27 item 13): one object per node."""
    path = write_manifest(kit.base())
    fake(monkeypatch, refuse="NodeName=node02")
    assert main(["drain", str(path), "node[01-02]", "--json"]) == 1
    first, second = json.loads(capsys.readouterr().out)
    assert first == {"node": "node01", "ok": True, "detail": "drained, no jobs"}
    assert second["node"] == "node02" and second["ok"] is False and second["detail"].startswith("drain on head01: ")
    assert main(["resume", str(path), "node01", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"node": "node01", "ok": True, "detail": "resumed"}]


def test_resume_refuses_a_node_the_gate_holds_unless_forced(write_manifest: Any, kit: Any,
                                                           monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    path = write_manifest(kit.base())
    held = ("NodeName=node01 Arch=x86_64 CoresPerSocket=8 State=IDLE+DRAIN ThreadsPerCore=1 "
            "Reason=provision gate: gpu.dcgm failed: level 1: software on GPU 0: Persistence mode for GPU 0 is "
            "disabled. [root@2026-11-26T20:10:04]")
    sent: list[str] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            sent.append(text)
            if text.startswith("scontrol show node node01"):
                return Output(stdout=held)
            return Output(stdout="NodeName=node02 State=IDLE+DRAIN Reason=provision drain [root@2026-11-26T20:00:00]"
                          if text.startswith("scontrol show") else "")
        return execute

    monkeypatch.setattr(drain_cmd, "ssh_executor", executor)
    assert main(["resume", str(path), "node01,node02"]) == 1
    out, err = capsys.readouterr()
    assert ("node01: node01 is held by the acceptance gate (provision gate: gpu.dcgm failed: level 1: software on "
            "GPU 0: Persistence mode for GPU 0 is disabled.)") in out.replace("\n", " ")
    assert "node02: resumed" in out and "resume failed on node01" in err
    assert "scontrol update NodeName=node01 State=RESUME" not in sent
    sent.clear()
    assert main(["resume", str(path), "node01", "--force"]) == 0
    assert sent == ["scontrol update NodeName=node01 State=RESUME"]


@pytest.mark.parametrize("verb", ["drain", "resume"])
def test_an_unreachable_controller_is_tried_once_not_per_node(write_manifest: Any, kit: Any, verb: str,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: Capsys) -> None:
    """With the controller unreachable, drain (and resume) of N nodes tried it once per node,
    each try waiting out SSH's connect timeout, and printed the same error N times (issue 27
    build item 4: repeated errors capped)."""
    data = kit.base()
    more = {key: value for key, value in data["nodes"][-1].items() if key not in ("bmc", "interfaces")}
    data["nodes"].append({**more, "name": "node[03-40]", "interfaces": {"management": {"ip": "10.0.0.103"}}})
    path = write_manifest(data)
    sent: list[str] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            sent.append(text)
            return Output(rc=255, error="ssh: connect to host 10.0.0.10 port 22: Connection timed out")
        return execute

    monkeypatch.setattr(drain_cmd, "ssh_executor", executor)
    assert main([verb, str(path), "@compute"]) == 1
    out, err = capsys.readouterr()
    assert len(sent) == 1, (sent, out, err)
    lines = out.replace("\n ", " ").splitlines()
    assert len(lines) == 2 and lines[0].startswith("node01: ") and "Connection timed out" in lines[0], out
    assert lines[1] == "node[02-40]: not tried: the controller head01 could not be reached or did not answer", out
    assert err.strip() == f"{verb} failed on node[01-40]"
    assert main([verb, str(path), "@compute", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 40 and [r["ok"] for r in rows] == [False] * 40
    assert rows[-1] == {"node": "node40", "ok": False,
                        "detail": "not tried: the controller head01 could not be reached or did not answer"}
