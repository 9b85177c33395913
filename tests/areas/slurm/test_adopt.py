"""provisioner.areas.slurm.adopt: which compute nodes let only users with a job there in over
SSH (pam_slurm_adopt), who always gets in, and what validate says where Slurm cannot adopt."""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm import adopt, rolevars
from provisioner.manifest import Manifest

PEOPLE = [{"name": "alice", "uid": 2001}]


def with_people(kit: Any, **slurm: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    data["users"] = list(PEOPLE)
    data["slurm"].update(slurm)
    return data


def adopting(m: Manifest) -> list[str]:
    return [n.name for n in adopt.adopt_nodes(m)]


def test_off_without_people_and_without_the_switch(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert not adopt.wanted(m) and adopting(m) == []
    assert adopt.cluster_vars(m) == {}  # clusters recorded before the switch keep their fingerprints
    assert "slurm_ssh_only_with_job" not in rolevars.node_vars(m, m.node("node01"))
    assert not {"slurm_ssh_admins", "slurm_prolog_contain"} & set(rolevars.cluster_vars(m))


def test_on_for_the_compute_nodes_once_the_manifest_declares_people(kit: Any) -> None:
    m = kit.load(with_people(kit)).manifest
    assert adopting(m) == ["node01", "node02"]
    assert rolevars.node_vars(m, m.node("node01"))["slurm_ssh_only_with_job"] is True
    assert "slurm_ssh_only_with_job" not in rolevars.node_vars(m, m.node("head01"))
    cluster = rolevars.cluster_vars(m)
    assert (cluster["slurm_ssh_admins"], cluster["slurm_prolog_contain"]) == (["root", "ops"], True)
    # slurm.conf and the admins' file render in the light play: an added admin needs no heavy run
    assert {"slurm_ssh_admins", "slurm_prolog_contain"} <= rolevars.LIGHT_KEYS


def test_the_switch_wins_over_the_default(kit: Any) -> None:
    assert adopting(kit.load(with_people(kit, ssh_only_with_job=False)).manifest) == []
    data = kit.base()
    data["slurm"]["ssh_only_with_job"] = True
    assert adopting(kit.load(data).manifest) == ["node01", "node02"]
    data["slurm"]["enabled"] = False
    assert adopting(kit.load(data).manifest) == []


def test_admins_are_root_the_automation_account_and_the_admin_users_each_once(kit: Any) -> None:
    data = with_people(kit)
    data["cluster"]["ssh"] = {"user": "deploy"}
    data["cluster"]["admin_users"].append({"name": "deploy", "ssh_keys": [kit.ssh_key]})
    data["cluster"]["admin_users"].append({"name": "eve", "ssh_keys": [kit.ssh_key], "sudo": False})
    assert adopt.admins(kit.load(data).manifest) == ["root", "deploy", "ops", "eve"]


def test_never_on_the_head_or_a_login_node_where_people_submit_jobs(kit: Any) -> None:
    data = with_people(kit)
    data["nodes"][0]["roles"] = ["head", "storage", "compute"]
    data["nodes"][0]["hardware"]["cpu"] = {"cores_per_socket": 8}
    data["nodes"].append({**data["nodes"][1], "name": "login01", "roles": ["compute", "login"],
                          "interfaces": {"management": {"ip": "10.0.0.40", "interface": "eno1"}}})
    data["nodes"][-1].pop("bmc")
    m = kit.load(data).manifest
    assert adopting(m) == ["node01", "node02"]
    assert "slurm_ssh_only_with_job" not in rolevars.node_vars(m, m.node("login01"))


def test_asked_where_no_compute_node_can_have_it_is_a_warning_at_the_switch(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["ssh_only_with_job"] = True
    data["nodes"][1]["roles"] = ["compute", "login"]
    text = kit.dump(data)
    (warning,) = [d for d in kit.load(text).warnings if "pam_slurm_adopt" in d.message]
    assert (warning.severity, warning.path, warning.line) == (
        "warning", "slurm.ssh_only_with_job", kit.line_of(text, "ssh_only_with_job"))
    assert warning.message.startswith("no compute node gets pam_slurm_adopt")


def test_ubuntu_22_04_cannot_adopt_an_error_when_asked_a_warning_when_implied(kit: Any) -> None:
    """SchedMD: pam_slurm_adopt must be used with task/cgroup and proctrack/cgroup, which
    Slurm 21.08 on Ubuntu 22.04's cgroup v2 does not have."""
    data = kit.example("llm-200k.yaml")  # ubuntu-22.04
    data["users"] = list(PEOPLE)
    implied = kit.dump(data)
    loaded = kit.load(implied)
    (warning,) = [d for d in loaded.warnings if "pam_slurm_adopt" in d.message]
    users_line = implied.splitlines().index("users:") + 1  # the top-level section, not docker's users
    assert (warning.severity, warning.path, warning.line) == ("warning", "users", users_line)
    assert "Ubuntu 22.04's Slurm 21.08" in warning.message and "(gpu[01-04])" in warning.message
    assert adopting(loaded.manifest) == [] and adopt.cluster_vars(loaded.manifest) == {}
    data["slurm"]["ssh_only_with_job"] = True
    asked = kit.dump(data)
    error = kit.error(asked, "pam_slurm_adopt")
    assert (error.path, error.line) == ("slurm.ssh_only_with_job", kit.line_of(asked, "ssh_only_with_job"))
    assert error.message.endswith("or set slurm.ssh_only_with_job: false")


def test_the_switch_is_a_boolean(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["ssh_only_with_job"] = "sometimes"
    text = kit.dump(data)
    d = kit.error(text, "bool")
    assert (d.path, d.line) == ("slurm.ssh_only_with_job", kit.line_of(text, "ssh_only_with_job"))
