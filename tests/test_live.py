"""provisioner.live: what plan reads from running services (slurmdbd's accounts), through a
given executor: here a fake one answering with sacctmgr's recorded output (the parsers meet
the real slurmdbd's text in tests/areas/slurm, and the executor is verify's, proven by the
e2e). And what apply reads before it runs anything (the disks of new pools and scratch
volumes): the node-side runner for real on this machine, the storage area's judgement in
tests/areas/storage/test_precheck.py, real disks in the VM lab."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from provisioner import live
from provisioner.nodecheck.check import Output
from provisioner.state import NodeState, State

DATA = Path(__file__).parent / "areas" / "slurm" / "data"


def accounts_manifest(kit: Any) -> Any:
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    data["slurm"]["accounts"] = [{"name": "research", "fairshare": 10}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "research"}]
    return kit.load(data).manifest


def configured(m: Any) -> State:
    return State(cluster=m.cluster.name, nodes={n.name: NodeState(lifecycle="configured") for n in m.nodes})


class Slurmdbd:
    """Answers the read commands as the recorded slurmdbd did; records what it was asked."""

    def __init__(self, queue: str = "", fail: str = "") -> None:
        self.asked: list[tuple[str, list[str], int]] = []
        self.queue, self.fail = queue, fail

    def __call__(self, host: str, text: str, timeout: int) -> Output:
        argv = shlex.split(text)
        self.asked.append((host, argv, timeout))
        if self.fail and argv[0] == self.fail:
            return Output(rc=1, stderr="sacctmgr: error: Problem talking to the database: Connection refused\n")
        if argv[0] == "squeue":
            return Output(stdout=self.queue)
        what = argv[4]
        return Output(stdout=(DATA / f"sacctmgr-{what}.txt").read_text())


def test_reads_slurmdbd_on_the_controller_and_says_what_apply_would_change(kit: Any) -> None:
    m = accounts_manifest(kit)
    answer = Slurmdbd(queue="alice|vision\n")
    [read] = live.read(m, configured(m), answer)
    assert [(host, argv[:5]) for host, argv, _ in answer.asked] == [
        ("head01", ["sacctmgr", "--noheader", "--parsable2", "show", "qos"]),
        ("head01", ["sacctmgr", "--noheader", "--parsable2", "show", "assoc"]),
        ("head01", ["sacctmgr", "--noheader", "--parsable2", "show", "user"]),
        ("head01", ["squeue", "--noheader", "--states=PENDING,RUNNING,SUSPENDED,CONFIGURING,COMPLETING",
                    "--format=%u|%a"]),
    ]
    assert all(timeout == live.COMMAND_TIMEOUT for *_, timeout in answer.asked)
    assert (read.service, read.node, read.error) == ("slurmdbd", "head01", "")
    assert read.pending == 3  # alice's default account, two QOS; vision and alice/vision kept (a job)
    first = {"kind": "change", "line": "~ user alice: default account vision -> research"}
    assert read.to_json()["changes"][0] == first


def test_a_controller_not_yet_configured_is_not_asked(kit: Any) -> None:
    m = accounts_manifest(kit)
    answer = Slurmdbd()
    [read] = live.read(m, State(cluster=m.cluster.name), answer)
    assert answer.asked == []
    assert read.error == "head01 is not configured yet: apply sets slurmdbd up"
    assert read.pending == 0 and read.to_json()["read"] is False


def test_a_failed_command_is_said_with_its_reason(kit: Any) -> None:
    m = accounts_manifest(kit)
    [read] = live.read(m, configured(m), Slurmdbd(fail="sacctmgr"))
    assert read.error == ("sacctmgr on head01: sacctmgr: error: Problem talking to the database: "
                          "Connection refused")
    assert read.changes == []


def test_output_the_parsers_do_not_know_is_said(kit: Any) -> None:
    m = accounts_manifest(kit)

    def garbled(host: str, text: str, timeout: int) -> Output:
        return Output(stdout="" if text.startswith("squeue") else "what|is\n")

    [read] = live.read(m, configured(m), garbled)
    assert read.error == "slurmdbd on head01: sacctmgr show assoc, line 1: 6 fields expected, got 2: 'what|is'"


def test_nothing_is_read_where_the_manifest_manages_no_accounts(kit: Any) -> None:
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    m = kit.load(data).manifest
    answer = Slurmdbd()
    assert live.read(m, configured(m), answer) == [] and answer.asked == []


def local(host: str, text: str, timeout: int) -> Output:
    """An executor that runs the node's side here, as ssh runs it there (``sh -c``); the
    node's python3 is this interpreter."""
    r = subprocess.run(["sh", "-c", text.replace("python3 -c", shlex.quote(sys.executable) + " -c", 1)],
                       capture_output=True, text=True, timeout=timeout)
    return Output(rc=r.returncode, stdout=r.stdout, stderr=r.stderr)


def test_the_node_runs_each_command_without_a_shell_and_answers_in_one_round() -> None:
    argvs = [("echo", "a b", "$HOME"), ("sh", "-c", "exit 3"), ("no-such-command-here",), ("true",)]
    answers, error = live.run_each(local, "n1", argvs)
    assert error == ""
    assert answers == {argvs[0]: (0, "a b $HOME\n"), argvs[1]: (3, ""), argvs[2]: (127, ""), argvs[3]: (0, "")}


def test_a_node_that_does_not_answer_is_said() -> None:
    def down(host: str, text: str, timeout: int) -> Output:
        return Output(rc=255, error="ssh: connect to host 127.0.0.9 port 22: Connection refused")

    def garbled(host: str, text: str, timeout: int) -> Output:
        return Output(stdout="Welcome!\n" + json.dumps([[0, ""]]))

    assert live.run_each(down, "n1", [("true",)]) == ({}, "ssh: connect to host 127.0.0.9 port 22: Connection refused")
    answers, error = live.run_each(garbled, "n1", [("true",)])
    assert answers == {} and error.startswith("unreadable answer from n1")


def test_disks_are_read_on_configured_nodes_only(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    st = State(cluster=m.cluster.name, nodes={"head01": NodeState(lifecycle="configured"),
                                              "node01": NodeState(lifecycle="new")})
    asked: list[str] = []

    def blank(host: str, text: str, timeout: int) -> Output:
        asked.append(host)
        argvs = json.loads(shlex.split(text)[3])
        rows = [[1, ""] if a[0] in ("systemd-detect-virt", "zpool") else
                [0, json.dumps({"blockdevices": [{"name": "sda", "type": "disk"}]})] if a[0] == "lsblk" else [0, ""]
                for a in argvs]
        return Output(stdout=json.dumps(rows))

    verdicts = live.read_disks(m, st, ["head01", "node01", "node02"], blank)
    assert asked == ["head01"]
    assert verdicts == [live.DiskVerdict("head01")]
