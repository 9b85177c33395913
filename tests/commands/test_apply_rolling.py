"""`provision apply --rolling`: which nodes roll, and the roll composed from apply, scontrol
and verify (apply and the nodes replaced by fakes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.apply import ApplyOptions, Ran
from provisioner.cli import main
from provisioner.commands import apply as apply_cmd
from provisioner.manifest.load import Loaded
from provisioner.nodecheck import parsers
from provisioner.nodecheck.check import Output
from provisioner.plan import cluster_fingerprint, node_sections
from provisioner.runner import SshTarget
from provisioner.state import NodeState, RunRecord, State, StateDir
from provisioner.validate import load_manifest
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]
RECORDED = Path(__file__).parents[1] / "areas" / "gpu" / "recorded"
DCGM_PASS = (RECORDED / "dcgmi-diag-r1-pass.json").read_text()
DCGM_FAIL = (RECORDED / "dcgmi-diag-r1-dcgm3-persistence.json").read_text()
TRACKING = "System time     : 0.000100000 seconds slow of NTP time\nLeap status     : Normal\n"
HOSTS = ("10.0.0.10 head01.test.internal head01\n10.0.0.21 node01.test.internal node01\n"
         "10.0.0.22 node02.test.internal node02\n")


def settle(path: Path) -> None:
    m = load_manifest(path).manifest
    StateDir.beside(path).save(State(cluster=m.cluster.name, cluster_fingerprint=cluster_fingerprint(m), nodes={
        n.name: NodeState(lifecycle="configured", fingerprints=node_sections(m, n)) for n in m.nodes}))


@pytest.fixture
def changed(write_manifest: Any, kit: Any) -> Path:
    """A settled cluster whose compute nodes then get a node-local change (no GPUs, no docker:
    verify needs only hosts and clock)."""
    data = kit.base()
    data["docker"] = {"enabled": False}
    del data["nodes"][1]["hardware"]["gpu"]
    data["slurm"] = {"partitions": [{"name": "batch", "nodes": ["@compute"], "default": True}]}
    path: Path = write_manifest(data)
    settle(path)
    data["nodes"][1]["hardware"]["memory_gb"] = 256
    path.write_text(kit.text(data))
    return path


def test_only_compute_nodes_with_node_local_changes_roll(changed: Path) -> None:
    loaded = load_manifest(changed)
    assert apply_cmd.rolling_nodes(loaded, StateDir.beside(changed), None, full=False) == ["node01", "node02"]
    assert apply_cmd.rolling_nodes(loaded, StateDir.beside(changed), ["node02"], full=False) == ["node02"]
    assert apply_cmd.rolling_nodes(loaded, StateDir.beside(changed), None, full=True) == ["node01", "node02"]


def fakes(monkeypatch: pytest.MonkeyPatch, broken: str = "", dcgm: dict[str, str] | None = None,
          record: bool = False) -> list[str]:
    """Fake apply and nodes; ``broken``: a node whose clock fails verify; ``dcgm``: per node
    what dcgmi diag prints (else a pass); ``record``: apply records its run, every node ok."""
    log: list[str] = []
    drained: dict[str, str] = {}  # node -> reason, as the controller has it

    def fake_apply(loaded: Loaded, state: StateDir, opts: ApplyOptions, console: Any,
                   ran: list[Ran] | None = None) -> int:
        log.append(f"apply {','.join(opts.limit or ['all'])}")
        if ran is not None:
            names = opts.limit or loaded.manifest.node_names()
            ran.append(Ran(f"run{len(ran)}", False, "ok", f"/runs/run{len(ran)}/stdout", dict.fromkeys(names, "ok")))
        if record:
            st = state.load()
            names = opts.limit or loaded.manifest.node_names()
            st.runs.append(RunRecord(id=f"run{len(st.runs)}", started="now", result="ok",
                                     results=dict.fromkeys(names, "ok")))
            state.save(st)
        return 0

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            if text.startswith("scontrol update"):
                log.append(text.replace("scontrol update NodeName=", "scontrol "))
                node, _, rest = text.removeprefix("scontrol update NodeName=").partition(" ")
                if "State=DRAIN" in rest:
                    drained[node] = rest.partition("Reason=")[2].strip("'")
                else:
                    drained.pop(node, None)
            if text == parsers.CONTEXT_COMMAND:
                return Output(stdout="container=none\ngpu_devices=0\n")
            if text.startswith("cat /etc/hosts"):
                return Output(stdout=HOSTS)
            if text.startswith("chronyc"):
                return Output(rc=1, stderr="506 Cannot talk to daemon") if host == broken else Output(stdout=TRACKING)
            if text.startswith("test -e /var/run/reboot-required"):
                return Output(rc=1)
            if text.startswith("scontrol show"):  # as Slurm shows a drained node: verify runs before the resume
                node = text.split()[3]
                if node in drained:
                    return Output(stdout=f"NodeName={node} State=IDLE+DRAIN Reason={drained[node]} [root@2026-11-23]")
                return Output(stdout=f"NodeName={node} State=IDLE")
            if "dcgmi diag" in text:
                log.append(f"dcgmi {host}")
                return Output(rc=226 if host in (dcgm or {}) else 0, stdout=(dcgm or {}).get(host, DCGM_PASS))
            if text.startswith("ping"):
                return Output(stdout="3 packets transmitted, 3 received, 0% packet loss")
            if text.startswith("findmnt"):  # the compute nodes' scratch (tests/conftest.py)
                return Output(stdout='{"filesystems": [{"source": "/dev/nvme1n1p1", "fstype": "xfs", '
                                     '"options": "rw,noatime"}]}')
            if text.startswith("dd "):
                return Output(stdout="write rc=0\nread rc=0\n")
            return Output()
        return execute

    monkeypatch.setattr(apply_cmd, "apply", fake_apply)
    monkeypatch.setattr(apply_cmd, "ssh_executor", executor)
    return log


def test_a_roll_one_at_a_time(changed: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    log = fakes(monkeypatch)
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 0
    assert log == ["apply head01",
                   "scontrol node01 State=DRAIN Reason='provision apply --rolling'", "apply node01",
                   "scontrol node01 State=RESUME",
                   "scontrol node02 State=DRAIN Reason='provision apply --rolling'", "apply node02",
                   "scontrol node02 State=RESUME"]
    assert "rolling node01, node02 in batches of 1" in capsys.readouterr().out


def test_a_failed_verify_stops_the_roll(changed: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    log = fakes(monkeypatch, broken="node01")
    assert main(["apply", str(changed), "--rolling", "--yes", "--batch", "2"]) == 1
    assert log[:4] == ["apply head01", "scontrol node01 State=DRAIN Reason='provision apply --rolling'",
                       "scontrol node02 State=DRAIN Reason='provision apply --rolling'", "apply node01,node02"]
    assert not any("RESUME" in line for line in log)
    reasons = [line for line in log[4:] if "Reason=" in line]
    assert any(line.startswith("scontrol node01 State=DRAIN Reason='provision apply --rolling: verify failed: "
                               "clock:") for line in reasons), reasons
    assert any(line.startswith("scontrol node02") and "verify failed on node01" in line for line in reasons)
    assert ("rolling stopped at node01; left drained with the reason in Slurm: node01, node02"
            in capsys.readouterr().out)


def test_a_roll_with_the_controller_unreachable_does_not_claim_a_drain(changed: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: Capsys) -> None:
    """It said 'left drained with the reason in Slurm' although no drain had worked (issue 27
    item 5)."""
    fakes(monkeypatch)
    down = Output(rc=255, error="ssh: connect to host 10.0.0.10 port 22: Connection refused")
    inner = apply_cmd.ssh_executor

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        execute = inner(targets, known_hosts, grace)
        return lambda host, text, timeout: down if host == "head01" else execute(host, text, timeout)

    monkeypatch.setattr(apply_cmd, "ssh_executor", executor)
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 1
    out = capsys.readouterr().out
    assert "left drained" not in out
    assert ("rolling stopped at node01; node01 could not be drained (scontrol on head01: ssh: connect to host "
            "10.0.0.10 port 22: Connection refused): check its state in Slurm; not rolled: node02") in out


def test_a_stopped_roll_in_json(changed: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    """apply had no --json (issue 27 item 13): one object on stdout, the tables on stderr, the
    exit code as without it, null for what did not happen."""
    fakes(monkeypatch, broken="node01")
    assert main(["apply", str(changed), "--rolling", "--yes", "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert "rolling stopped at node01" in captured.err and "rolling" in captured.err
    assert (doc["ok"], doc["cluster"], doc["check"], doc["gate"]) == (False, "testc", False, None)
    assert doc["nodes"] == [{"node": "head01", "result": "ok"}, {"node": "node01", "result": "ok"},
                            {"node": "node02", "result": None}]
    assert [r["nodes"] for r in doc["runs"]] == [{"head01": "ok"}, {"node01": "ok"}]
    roll = doc["rolling"]
    assert (roll["ok"], roll["stopped_at"], roll["done"], roll["untouched"]) == (False, "node01", [], ["node02"])
    assert roll["steps"][0] == {"node": "node01", "step": "drain", "ok": True, "detail": "drained, no jobs"}
    assert any(s["step"] == "verify" and not s["ok"] for s in roll["steps"])


def test_json_and_verbose_are_refused_together(changed: Path, capsys: Capsys) -> None:
    assert main(["apply", str(changed), "--json", "-v"]) == 1
    assert capsys.readouterr() == ("", "error: --json and -v cannot be combined: Ansible's own output would mix "
                                       "with the JSON on stdout (it is in the run's log)\n")


def test_rolling_needs_slurm(write_manifest: Any, kit: Any, capsys: Capsys) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False}
    assert main(["apply", str(write_manifest(data)), "--rolling", "--yes"]) == 1
    assert "--rolling drains nodes in Slurm" in capsys.readouterr().err


def test_a_whole_roll_settles_the_cluster_files(changed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each apply of the roll has a --limit; once the whole roll ended well every node has the
    manifest's cluster-wide files, and the plan says so (as after a whole apply)."""
    fakes(monkeypatch)
    m = load_manifest(changed).manifest
    state = StateDir.beside(changed)
    assert state.load().cluster_fingerprint != cluster_fingerprint(m)  # the memory change is in slurm.conf
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 0
    assert state.load().cluster_fingerprint == cluster_fingerprint(m)


def test_a_stopped_or_limited_roll_leaves_the_cluster_files_unsettled(changed: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fakes(monkeypatch, broken="node02")
    state = StateDir.beside(changed)
    before = state.load().cluster_fingerprint
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 1
    assert state.load().cluster_fingerprint == before
    fakes(monkeypatch)
    assert main(["apply", str(changed), "--rolling", "--yes", "--limit", "node01"]) == 0
    assert state.load().cluster_fingerprint == before


def test_nothing_to_roll_is_a_whole_apply(changed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without compute nodes to roll, --rolling is a plain apply of every node (no --limit)."""
    log = fakes(monkeypatch)
    assert main(["apply", str(changed), "--rolling", "--yes", "--limit", "head01"]) == 0
    assert log == ["apply head01"]
    settle(changed)
    log.clear()
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 0
    assert log == ["apply all"]


def test_a_whole_roll_records_nodes_the_manifest_no_longer_lists_as_removed(changed: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateDir.beside(changed)
    st = state.load()
    st.nodes["node09"] = NodeState(lifecycle="configured", fingerprints={"node": "x"})
    state.save(st)
    fakes(monkeypatch)
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 0
    gone = state.load().nodes["node09"]
    assert gone.lifecycle == "removed" and gone.fingerprints == {} and gone.removed_at


def gated(path: Path) -> None:
    """The manifest at ``path`` with an acceptance gate of gpu.dcgm (it has no verify section)."""
    assert "\nverify:" not in path.read_text()
    path.write_text(path.read_text() + "verify:\n  gate: [gpu.dcgm]\n")


def test_a_roll_holds_a_node_whose_gate_check_fails_with_the_gates_reason(
        changed: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    gated(changed)
    log = fakes(monkeypatch, dcgm={"node02": DCGM_FAIL})
    assert main(["apply", str(changed), "--rolling", "--yes"]) == 1
    assert "dcgmi node01" in log and "scontrol node01 State=RESUME" in log
    assert "scontrol node02 State=RESUME" not in log
    assert log[-1] == ("scontrol node02 State=DRAIN Reason='provision gate: gpu.dcgm failed: level 1: Persistence "
                       "Mode: Persistence mode for GPU 0 is disabled. Enable persistence mode by running \"nvidia-smi "
                       "-i <gpuId> -pm 1 \" as root.'")
    assert "rolling stopped at node02; left drained with the reason in Slurm: node02" in capsys.readouterr().out


def test_a_plain_apply_gates_its_new_compute_nodes(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: Capsys) -> None:
    """node02 is new: held with our reason, diagnosed, held with the failure; a second new node
    that passes is resumed; settled nodes are not touched; the exit code says one is held."""
    data = kit.base()
    data["docker"] = {"enabled": False}
    del data["nodes"][1]["hardware"]["gpu"]
    data["verify"] = {"gate": ["gpu.dcgm"]}
    path: Path = write_manifest(data)
    state = StateDir.beside(path)
    m = load_manifest(path).manifest
    state.save(State(cluster=m.cluster.name, nodes={"head01": NodeState(
        lifecycle="configured", fingerprints=node_sections(m, m.node("head01")))}))
    log = fakes(monkeypatch, dcgm={"node02": DCGM_FAIL}, record=True)
    assert main(["apply", str(path), "--yes"]) == 1
    assert log[0] == "apply all"
    gate = [line for line in log[1:] if not line.startswith("dcgmi")]
    assert gate == ["scontrol node01 State=DRAIN Reason='provision gate: awaiting gpu.dcgm'",
                    "scontrol node01 State=RESUME",
                    "scontrol node02 State=DRAIN Reason='provision gate: awaiting gpu.dcgm'",
                    "scontrol node02 State=DRAIN Reason='provision gate: gpu.dcgm failed: level 1: Persistence Mode: "
                    "Persistence mode for GPU 0 is disabled. Enable persistence mode by running \"nvidia-smi -i "
                    "<gpuId> -pm 1 \" as root.'"]
    assert [line for line in log if line.startswith("dcgmi")] == ["dcgmi node01", "dcgmi node02"]
    out = capsys.readouterr().out
    assert "acceptance gate (gpu.dcgm) on node01, node02" in out
    # nothing new: no gate
    log.clear()
    settle(path)
    assert main(["apply", str(path), "--yes"]) == 0 and log == ["apply all"]
