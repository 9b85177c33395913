"""`provision plan`: slurmdbd's drift read on the controller (a fake executor answering with
the recorded slurmdbd's output), said in the table and the JSON, in the detailed exit code;
nothing read with --offline or before the controller is configured."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from provisioner import live as live_mod
from provisioner.cli import main
from provisioner.nodecheck.check import Output
from provisioner.plan import cluster_fingerprint, node_sections
from provisioner.runner import SshTarget
from provisioner.state import NodeState, State, StateDir
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]
DATA = Path(__file__).resolve().parents[1] / "areas" / "slurm" / "data"


@pytest.fixture
def manifest(write_manifest: Any, kit: Any) -> Path:
    """Accounts in the manifest, the cluster recorded as applied (no node change)."""
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    data["slurm"]["accounts"] = [{"name": "research", "fairshare": 10}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "research"}]
    path: Path = write_manifest(data)
    m = kit.load(data).manifest
    StateDir.beside(path).save(State(
        cluster=m.cluster.name, cluster_fingerprint=cluster_fingerprint(m),
        nodes={n.name: NodeState(lifecycle="configured", fingerprints=node_sections(m, n)) for n in m.nodes}))
    return path


def slurmdbd(monkeypatch: pytest.MonkeyPatch, assoc: str = "sacctmgr-assoc.txt") -> list[tuple[str, str]]:
    asked: list[tuple[str, str]] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        assert list(targets) == ["head01"] and targets["head01"].address == "10.0.0.10"

        def execute(host: str, text: str, timeout: int) -> Output:
            asked.append((host, text))
            argv = shlex.split(text)
            if argv[0] == "squeue":
                return Output(stdout="")
            name = assoc if argv[4] == "assoc" else f"sacctmgr-{argv[4]}.txt"
            return Output(stdout=(DATA / name).read_text())
        return execute

    monkeypatch.setattr(live_mod, "ssh_executor", executor)
    return asked


def test_plan_shows_slurmdbd_drift_and_exits_2(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: Capsys) -> None:
    asked = slurmdbd(monkeypatch)
    assert main(["plan", str(manifest), "--detailed-exitcode"]) == 2  # no node changed: the drift alone
    out = capsys.readouterr().out
    assert len(asked) == 4
    assert "slurmdbd (read on head01): apply would make 5 change(s):" in out, out
    assert "  - account vision: not in the manifest" in out, out
    assert "  ~ user alice: default account vision -> research" in out, out


def test_plan_json_carries_the_drift(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    slurmdbd(monkeypatch)
    assert main(["plan", str(manifest), "--json"]) == 0
    [read] = json.loads(capsys.readouterr().out)["live"]
    assert (read["service"], read["node"], read["read"], read["error"]) == ("slurmdbd", "head01", True, None)
    assert {"kind": "remove", "line": "- qos urgent: not in the manifest"} in read["changes"]


def test_plan_says_when_slurmdbd_matches(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys,
                                         kit: Any) -> None:
    """The recorded slurmdbd holds exactly this manifest's tree (tests/areas/slurm)."""
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    data["slurm"]["qos"] = [{"name": "long", "max_gpus_per_user": 1, "max_jobs_per_user": 2, "max_wall": "3-00:00:00"},
                            {"name": "urgent", "priority": 100, "preempt": ["long"]}]
    data["slurm"]["accounts"] = [{"name": "vision", "parent": "research", "qos": ["normal", "long"],
                                  "default_qos": "normal"}, {"name": "research", "fairshare": 10}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "vision", "accounts": ["research"]}]
    manifest.write_text(kit.text(data))
    slurmdbd(monkeypatch)
    main(["plan", str(manifest)])
    assert "slurmdbd (read on head01): matches the manifest" in capsys.readouterr().out


def test_plan_offline_reads_nothing(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    asked = slurmdbd(monkeypatch)
    assert main(["plan", str(manifest), "--offline", "--detailed-exitcode", "--json"]) == 0
    assert asked == [] and json.loads(capsys.readouterr().out)["live"] == []


def test_an_unreadable_slurmdbd_is_said_and_changes_nothing_else(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: Capsys) -> None:
    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        return lambda host, text, timeout: Output(rc=-1, error="timed out after 35 s (no answer from head01)")

    monkeypatch.setattr(live_mod, "ssh_executor", executor)
    assert main(["plan", str(manifest), "--detailed-exitcode"]) == 0
    out = capsys.readouterr().out
    assert "slurmdbd: not read: sacctmgr on head01: timed out after 35 s (no answer from head01)" in out, out
