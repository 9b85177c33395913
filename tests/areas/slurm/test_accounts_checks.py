"""provisioner.areas.slurm.accounts.problems through validate: accounts, QOS and users'
accounts that do not fit, at file:line."""

from __future__ import annotations

from typing import Any


def _fairshare(kit: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    data["slurm"]["accounting"] = True
    data["slurm"]["qos"] = [{"name": "long", "max_gpus_per_user": 4, "max_wall": "3-00:00:00"},
                            {"name": "urgent", "priority": 100, "preempt": ["long"]}]
    data["slurm"]["accounts"] = [{"name": "research", "fairshare": 10},
                                 {"name": "vision", "parent": "research", "qos": ["normal", "long"]}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "vision", "accounts": ["research"]}]
    return data


def test_a_fitting_tree_loads(kit: Any) -> None:
    assert not kit.load(_fairshare(kit)).warnings


def test_a_user_charging_an_undeclared_account_is_an_error_at_it(kit: Any) -> None:
    data = _fairshare(kit)
    data["users"][0]["accounts"] = ["research", "audio"]
    text = kit.dump(data)
    diag = kit.error(text, "'alice': Slurm account 'audio' is not in slurm.accounts")
    assert (diag.path, diag.line) == ("users[0].accounts[1]", kit.line_of(text, "- audio"))
    data["users"][0]["account"] = None
    assert kit.error(data, "accounts without a default account").path == "users[0].accounts"


def test_an_unknown_parent_a_cycle_and_root_are_errors(kit: Any) -> None:
    data = _fairshare(kit)
    data["slurm"]["accounts"][1]["parent"] = "labs"
    assert kit.error(data, "parent 'labs' is not in slurm.accounts").path == "slurm.accounts[1].parent"
    data = _fairshare(kit)
    data["slurm"]["accounts"][0]["parent"] = "vision"
    assert {d.path for d in kit.errors(data) if "lead back" in d.message} == {
        "slurm.accounts[0].parent", "slurm.accounts[1].parent"}
    data = _fairshare(kit)
    data["slurm"]["accounts"].append({"name": "root"})
    assert kit.error(data, "Slurm's own top account").path == "slurm.accounts[2].name"


def test_unknown_qos_default_qos_and_preemption_are_errors(kit: Any) -> None:
    data = _fairshare(kit)
    data["slurm"]["accounts"][1]["qos"] = ["normal", "short"]
    assert kit.error(data, "QOS 'short' is not in slurm.qos").path == "slurm.accounts[1].qos[1]"
    data = _fairshare(kit)
    data["slurm"]["accounts"][1]["default_qos"] = "urgent"
    assert "is not one of its qos" in kit.error(data, "default QOS 'urgent'").message
    data = _fairshare(kit)
    data["slurm"]["qos"][1]["preempt"] = ["urgent"]
    assert kit.error(data, "cannot preempt 'urgent'").path == "slurm.qos[1].preempt[0]"


def test_accounts_need_accounting(kit: Any) -> None:
    data = _fairshare(kit)
    data["slurm"]["accounting"] = False
    assert kit.error(data, "need slurm.accounting: true").path == "slurm.accounts"


def test_a_bad_qos_name_or_wall_time_is_a_schema_error(kit: Any) -> None:
    data = _fairshare(kit)
    data["slurm"]["qos"][0]["max_wall"] = "three days"
    assert kit.error(data, "'three days' is not a Slurm time").path == "slurm.qos[0].max_wall"
    data = _fairshare(kit)
    data["slurm"]["qos"][0]["name"] = "Long Jobs"
    assert "not a Slurm account or QOS name" in kit.errors(data)[0].message
