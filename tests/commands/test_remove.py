"""`provision remove`: refusals, drain before apply, the state records it removed (apply and
the controller replaced by fakes)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from provisioner import state as state_mod
from provisioner.apply import ApplyOptions, Ran
from provisioner.cli import main
from provisioner.commands import remove as remove_cmd
from provisioner.drain import Drained
from provisioner.manifest.load import Loaded
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget
from provisioner.state import NodeState, State, StateDir
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def manifest(write_manifest: Any, kit: Any) -> Path:
    """The minimal cluster, whose state still records node03 (deleted from the manifest)."""
    path: Path = write_manifest(kit.base())
    nodes = {n: NodeState(lifecycle="configured", fingerprints={"node": "x"}) for n in ("head01", "node01", "node02",
                                                                                       "node03")}
    StateDir.beside(path).save(State(cluster="testc", nodes=nodes))
    return path


def fakes(monkeypatch: pytest.MonkeyPatch, apply_rc: int = 0, drain_ok: bool = True) -> list[str]:
    events: list[str] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        assert set(targets) == {"head01"}

        def execute(host: str, text: str, timeout: int) -> Output:
            events.append(text.split(" --")[0])
            if text.startswith("scontrol update") and not drain_ok:
                return Output(rc=1, stderr="slurm_update error: Access/permission denied")
            return Output(stdout="NodeName=node03 State=IDLE" if text.startswith("scontrol show") else "")
        return execute

    def fake_apply(loaded: Loaded, state: StateDir, opts: ApplyOptions, console: Any,
                   ran: list[Ran] | None = None) -> int:
        assert opts.yes and opts.limit is None and "node03" not in loaded.manifest.node_names()
        events.append("apply")
        if ran is not None:
            ran.append(Ran("run1", False, "ok" if apply_rc == 0 else "failed", "/runs/run1/stdout",
                           dict.fromkeys(loaded.manifest.node_names(), "ok" if apply_rc == 0 else "failed")))
        return apply_rc

    monkeypatch.setattr(remove_cmd, "ssh_executor", executor)
    monkeypatch.setattr(remove_cmd, "apply", fake_apply)
    return events


def lifecycle(path: Path, node: str) -> str:
    return StateDir.beside(path).load().nodes[node].lifecycle


def test_remove_drains_applies_and_records(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    events = fakes(monkeypatch)
    assert main(["remove", str(manifest), "node03", "--yes"]) == 0
    assert events == ["scontrol show node node03", "scontrol update NodeName=node03 State=DRAIN Reason='provision "
                      "remove'", "squeue", "apply"]
    out = capsys.readouterr().out
    assert "the removed nodes are not contacted" in out and "removed: node03" in out
    state = StateDir.beside(manifest).load().nodes["node03"]
    assert (state.lifecycle, state.fingerprints) == ("removed", {}) and state.removed_at
    assert main(["remove", str(manifest), "node03", "--yes"]) == 1
    assert "node03 was removed already" in capsys.readouterr().err


def test_a_node_still_in_the_manifest_is_refused(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: Capsys) -> None:
    events = fakes(monkeypatch)
    assert main(["remove", str(manifest), "node02", "--yes"]) == 1
    assert "node02 is still in the manifest: delete it there first" in capsys.readouterr().err
    assert events == [] and lifecycle(manifest, "node02") == "configured"


def test_a_failed_drain_changes_nothing(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    events = fakes(monkeypatch, drain_ok=False)
    assert main(["remove", str(manifest), "node03", "--yes"]) == 1
    assert "node03 could not be drained" in capsys.readouterr().err
    assert "apply" not in events and lifecycle(manifest, "node03") == "configured"


def test_a_failed_apply_leaves_it_listed(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    fakes(monkeypatch, apply_rc=1)
    assert main(["remove", str(manifest), "node03", "--yes"]) == 1
    assert "node03 stay listed until it succeeds" in capsys.readouterr().err
    assert lifecycle(manifest, "node03") == "configured"


def test_without_slurm_no_drain_and_no_terminal_no_removal(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: Capsys, kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False}
    manifest.write_text(kit.text(data))
    events = fakes(monkeypatch)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["remove", str(manifest), "node03"]) == 1
    assert "pass --yes" in capsys.readouterr().err and events == []
    assert main(["remove", str(manifest), "node03", "--yes"]) == 0
    assert events == ["apply"]


def test_nodes_take_ranges_as_every_verb_does(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                              capsys: Capsys) -> None:
    """remove took comma-separated names only, drain and resume ranges and @role (issue 27
    item 13): one grammar; @role is refused with why (the nodes are not in the manifest)."""
    path: Path = write_manifest(kit.base())
    nodes = {n: NodeState(lifecycle="configured") for n in ("head01", "node01", "node02", "node03", "node04")}
    StateDir.beside(path).save(State(cluster="testc", nodes=nodes))
    events = fakes(monkeypatch)
    monkeypatch.setattr(remove_cmd, "drain_node", lambda head, node, *rest: Drained(node, True, "drained, no jobs"))
    assert main(["remove", str(path), "node[03-04]", "--yes"]) == 0, capsys.readouterr().err
    assert "removed: node03, node04" in capsys.readouterr().out and events == ["apply"]
    assert main(["remove", str(path), "@compute", "--yes"]) == 1
    assert capsys.readouterr().err == ("error: NODES: @compute selects nodes by their role in the manifest, and the "
                                       "nodes to remove are no longer in it: name them (names, ranges)\n")


def test_remove_in_json(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    """remove had no --json (issue 27 item 13): the drain and the apply per node; exit 1 and
    ok false when the apply failed (the node stays listed)."""
    fakes(monkeypatch)
    assert main(["remove", str(manifest), "node03", "--yes", "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "removed: node03" in captured.err
    assert doc["ok"] is True and doc["cluster"] == "testc"
    assert doc["nodes"] == [{"node": "node03", "removed": True, "drain": {"ok": True, "detail": "drained, no jobs"}}]
    assert doc["run"]["id"] == "run1" and doc["run"]["nodes"]["head01"] == "ok"
    StateDir.beside(manifest).save(State(cluster="testc", nodes={"node03": NodeState(lifecycle="configured")}))
    fakes(monkeypatch, apply_rc=1)
    assert main(["remove", str(manifest), "node03", "--yes", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["nodes"][0]["removed"] is False and doc["run"]["result"] == "failed"


def test_a_full_disk_at_the_record_keeps_the_state_whole_and_says_what_to_do(
        manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    """remove's own write, after its apply: on a full disk the state stays as it was (no
    temporary file, nothing half-recorded), the lock is freed, and the one line says that the
    apply is done and the node still listed (before: only 'cannot write the state', as if
    nothing had happened)."""
    fakes(monkeypatch)
    state = StateDir.beside(manifest)
    before = state.state_file.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_mod.os, "fsync", full)
    assert main(["remove", str(manifest), "node03", "--yes"]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: cannot write the state {state.state_file}: No space left on device; choose another "
                   "state directory with --state-dir (or make this one writable); apply rendered the cluster's "
                   "files without node03, but the state still lists them: run remove again once the state can "
                   "be written\n")
    assert state.state_file.read_bytes() == before
    assert sorted(p.name for p in state.root.iterdir() if p.name.startswith(".")) == []
    monkeypatch.undo()
    with state.lock("test"):  # not left held
        pass
