"""provisioner.live: what plan reads from running services (slurmdbd's accounts), through a
given executor: here a fake one answering with sacctmgr's recorded output (the parsers meet
the real slurmdbd's text in tests/areas/slurm, and the executor is verify's, proven by the
e2e)."""

from __future__ import annotations

import shlex
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
