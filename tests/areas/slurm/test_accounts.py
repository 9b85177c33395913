"""provisioner.areas.slurm.accounts: sacctmgr's output parsed (recorded from the molecule
slurm scenario's slurmdbd, Slurm 22.05), the drift against the manifest and its commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.slurm import accounts
from provisioner.areas.slurm.accounts import Account, Assoc, Holdings, Qos

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(("text", "minutes"), [
    ("", ""), ("UNLIMITED", ""), ("90", "90"), ("10:30", "11"), ("02:00:00", "120"), ("1-00:00:00", "1440"),
    ("3-12", "5040"), ("1-01:30", "1530"),
])
def test_wall_minutes(text: str, minutes: str) -> None:
    assert accounts.wall_minutes(text) == minutes


def test_parsers_read_what_slurmdbd_printed() -> None:
    have = accounts.held(recorded("sacctmgr-qos.txt"), recorded("sacctmgr-assoc.txt"), recorded("sacctmgr-user.txt"))
    assert have.qos["long"] == Qos("long", 0, "gres/gpu=1", "2", "4320", "")
    assert have.qos["urgent"] == Qos("urgent", 100, "", "", "", "long")
    assert have.qos["normal"].priority == 0
    assert have.accounts["vision"] == Account("vision", "research", 1, "long,normal", "normal")
    assert have.accounts["research"] == Account("research", "root", 10, "normal", "")
    assert {Assoc("alice", "vision"), Assoc("alice", "research"), Assoc("root", "root")} <= have.assocs
    assert have.default_account["alice"] == "vision"


def test_a_line_of_the_wrong_shape_is_an_error() -> None:
    with pytest.raises(accounts.ParseError, match="show qos, line 2: 6 fields expected, got 2"):
        accounts.parse_qos("normal|0||||\nbroken|1\n")


def _want(kit: Any) -> Holdings:
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    data["slurm"]["qos"] = [{"name": "long", "max_gpus_per_user": 1, "max_jobs_per_user": 2, "max_wall": "3-00:00:00"},
                            {"name": "urgent", "priority": 100, "preempt": ["long"]}]
    data["slurm"]["accounts"] = [{"name": "vision", "parent": "research", "qos": ["normal", "long"],
                                  "default_qos": "normal"}, {"name": "research", "fairshare": 10}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "vision", "accounts": ["research"]}]
    return accounts.wanted(kit.load(data).manifest)


def test_no_drift_when_slurmdbd_holds_the_manifest(kit: Any) -> None:
    have = accounts.held(recorded("sacctmgr-qos.txt"), recorded("sacctmgr-assoc.txt"), recorded("sacctmgr-user.txt"))
    assert accounts.drift(_want(kit), have, set()) == []


def test_an_empty_slurmdbd_gets_everything_parents_first(kit: Any) -> None:
    have = accounts.held(recorded("sacctmgr-qos-empty.txt"), recorded("sacctmgr-assoc-empty.txt"),
                         recorded("sacctmgr-user-empty.txt"))
    changes = accounts.drift(_want(kit), have, set())
    assert [c.line() for c in changes] == [
        "+ qos long: new", "+ qos urgent: new", "+ account research: under root", "+ account vision: under research",
        "+ user alice/vision: new association", "+ user alice/research: new association"]
    argv = accounts.commands(changes)
    assert argv[0] == ["sacctmgr", "--immediate", "add", "qos", "long", "Priority=0",
                       "MaxTRESPerUser=gres/gpu=1", "MaxJobsPerUser=2", "MaxWall=4320"]
    assert argv[3] == ["sacctmgr", "--immediate", "add", "account", "vision", "Parent=research", "Fairshare=1",
                       "QOS=long,normal", "DefaultQOS=normal"]
    assert argv[4][-2:] == ["Account=vision", "DefaultAccount=vision"]  # her default first, named
    assert argv[5][-1] == "Account=research"


def test_changes_and_removals_but_never_an_association_with_jobs(kit: Any) -> None:
    want = _want(kit)
    have = Holdings(
        qos={"long": Qos("long", 0, "gres/gpu=8", "2", "4320", ""), "urgent": want.qos["urgent"],
             "old": Qos("old"), "normal": Qos("normal")},
        accounts={"research": Account("research", "root", 5, "normal", ""), "vision": want.accounts["vision"],
                  "audio": Account("audio", "root", 1, "normal", ""), "root": Account("root", "", 1, "normal", "")},
        assocs={Assoc("alice", "vision"), Assoc("alice", "research"), Assoc("bob", "audio"), Assoc("carol", "vision"),
                Assoc("root", "root")},
        default_account={"alice": "research", "bob": "audio", "carol": "vision", "root": "root"},
    )
    lines = [c.line() for c in accounts.drift(want, have, busy={Assoc("bob", "audio")})]
    assert lines == [
        "~ qos long: max_tres_per_user gres/gpu=8 -> gres/gpu=1",
        "~ account research: fairshare 5 -> 10",
        "~ user alice: default account research -> vision",
        "! user bob/audio: has running or pending jobs: not removed",
        "- user carol/vision: not in the manifest",
        "! account audio: holds associations with jobs: not removed",
        "- qos old: not in the manifest",
    ]
    # without bob's job, audio goes after its user
    lines = [c.line() for c in accounts.drift(want, have, busy=set())]
    assert lines[3:6] == ["- user bob/audio: not in the manifest", "- user carol/vision: not in the manifest",
                          "- account audio: not in the manifest"]


def test_the_role_data_round_trips_and_the_filter_reads_the_queue(kit: Any) -> None:
    want = _want(kit)
    assert accounts.from_vars(accounts.to_vars(want)) == want
    have = (recorded("sacctmgr-qos.txt"), recorded("sacctmgr-assoc.txt"), recorded("sacctmgr-user.txt"))
    data = accounts.to_vars(want)
    data["assocs"] = [a for a in data["assocs"] if a != ["alice", "research"]]
    assert accounts.fairshare_drift(data, *have, "alice|research\n") == [
        {"line": "! user alice/research: has running or pending jobs: not removed", "kind": "kept", "argv": []}]
    assert accounts.fairshare_drift(data, *have, "")[0]["argv"] == [
        "sacctmgr", "--immediate", "delete", "user", "where", "name=alice", "account=research"]



ROLE_TASKS = Path(__file__).resolve().parents[3] / "roles" / "slurm" / "tasks" / "fairshare.yml"


def test_plan_reads_slurmdbd_with_the_commands_the_role_runs() -> None:
    """One list of read commands: the role's first fairshare task loops over exactly these."""
    task = yaml.safe_load(ROLE_TASKS.read_text())[0]
    role = [[str(arg).replace("{{ slurm_cluster_name }}", "lab") for arg in argv] for argv in task["loop"]]
    assert role == [list(argv) for argv in accounts.read_commands("lab")]


def test_live_changes_read_the_outputs_in_order(kit: Any) -> None:
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    data["slurm"]["accounts"] = [{"name": "research", "fairshare": 10}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "research"}]
    m = kit.load(data).manifest
    outputs = [recorded("sacctmgr-qos.txt"), recorded("sacctmgr-assoc.txt"), recorded("sacctmgr-user.txt"),
               "alice|vision\n"]
    # slurmdbd holds the tree of the recorded run; the manifest drops vision and both QOS, and
    # alice has a job under vision (the queue's line): her association and vision stay
    assert accounts.live_changes(m, outputs) == [
        ("change", "~ user alice: default account vision -> research"),
        ("kept", "! user alice/vision: has running or pending jobs: not removed"),
        ("kept", "! account vision: holds associations with jobs: not removed"),
        ("remove", "- qos long: not in the manifest"),
        ("remove", "- qos urgent: not in the manifest"),
    ]
