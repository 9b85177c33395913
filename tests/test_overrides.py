"""provisioner.overrides: the manifest's role_vars section (the escape hatch the docs
promise: `nvidia_driver_hold: false`, `pxe_server_dhcp_mode`), checked against the roles'
argument specs, written into the inventory, and part of the plan's fingerprints."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader

from provisioner import inventory
from provisioner.overrides import load_specs, node_overrides
from provisioner.plan import PlaySpec, cluster_fingerprint, compute, node_sections
from provisioner.state import NodeState, State

PLAYS = [PlaySpec("common - base", "all:&{{ provision_targets | default('all') }}", "common.yml")]


def with_vars(kit: Any, role_vars: dict[str, Any]) -> dict[str, Any]:
    data = kit.base()
    data["role_vars"] = role_vars
    return data


def test_the_documented_escape_hatches_validate_and_reach_the_inventory(kit: Any) -> None:
    data = with_vars(kit, {
        "all": {"nvidia_driver_hold": False},
        "@head": {"pxe_server_dhcp_mode": "proxy"},
        "node[01-02]": {"slurm_log_level": "debug"},
        "node02": {"nvidia_driver_hold": True},
    })
    m = kit.load(data).manifest
    files = inventory.build(m, source="m.yaml")
    head = json.loads(files["host_vars/head01.json"])
    node02 = json.loads(files["host_vars/node02.json"])
    assert head["nvidia_driver_hold"] is False and head["pxe_server_dhcp_mode"] == "proxy"
    assert "slurm_log_level" not in head
    assert node02["nvidia_driver_hold"] is True  # the node's own key is more specific than all
    assert node02["slurm_log_level"] == "debug"
    assert '"pxe_server_dhcp_mode": "proxy"' in files["host_vars/head01.json"]


def test_values_reach_ansible_as_written_and_never_as_jinja(kit: Any, tmp_path: Any) -> None:
    """Read back by Ansible's own loader: a "*" (pam limits' domain) loads, "yes" and "1.0"
    stay strings, and a value holding Jinja stays unsafe (data, never templated)."""
    limits = [{"domain": "*", "type": "soft", "item": "core", "value": "unlimited"},
              {"domain": "@ops", "type": "-", "item": "nofile", "value": 4096}]
    data = with_vars(kit, {"node01": {"common_limits": limits, "common_apt_security_mirror": "yes"},
                           "node02": {"common_apt_security_mirror": "{{ lookup('env', 'HOME') }}"},
                           "@head": {"common_apt_security_mirror": "1.0"}})
    files = inventory.build(kit.load(data).manifest, source="m.yaml")
    loader = DataLoader()
    read = {}
    for node in ("head01", "node01", "node02"):
        path = tmp_path / f"{node}.json"
        path.write_text(files[f"host_vars/{node}.json"])
        read[node] = loader.load_from_file(str(path))
    assert read["node01"]["common_limits"] == limits
    assert read["node01"]["common_apt_security_mirror"] == "yes"
    assert read["head01"]["common_apt_security_mirror"] == "1.0"
    assert json.loads(files["host_vars/node02.json"])["common_apt_security_mirror"] == {
        "__ansible_unsafe": "{{ lookup('env', 'HOME') }}"}
    assert read["node02"]["common_apt_security_mirror"] == "{{ lookup('env', 'HOME') }}"


@pytest.mark.parametrize(
    ("role_vars", "path", "words"),
    [
        ({"all": {"nvidia_driver_hodl": False}}, "role_vars.all.nvidia_driver_hodl",
         "no role declares this variable in its meta/argument_specs.yml; did you mean 'nvidia_driver_hold'?"),
        ({"all": {"nvidia_driver_hold": "no"}}, "role_vars.all.nvidia_driver_hold",
         "must be of type bool (role nvidia_driver), not str"),
        ({"all": {"pxe_server_dhcp_mode": "dynamic"}}, "role_vars.all.pxe_server_dhcp_mode",
         "'dynamic' is not one of"),
        ({"all": {"common_timezone": "UTC"}}, "role_vars.all.common_timezone",
         "generated from the manifest for role common"),
        ({"all": {"mariadb_root_password": "x"}}, "role_vars.all.mariadb_root_password",
         "secrets never go into the manifest or the inventory"),
        ({"@gpus": {"nvidia_driver_hold": False}}, "role_vars.@gpus", "not a role"),
        ({"gpu99": {"nvidia_driver_hold": False}}, "role_vars.gpu99", "keys are 'all', '@<role>'"),
        ({"@head": {"nvidia_driver_hold": False}, "@storage": {"nvidia_driver_hold": True}},
         "role_vars.@storage.nvidia_driver_hold", "set for head01 by both '@head' and '@storage'"),
    ],
)
def test_role_vars_are_checked_with_their_position(kit: Any, role_vars: dict[str, Any], path: str,
                                                    words: str) -> None:
    text = kit.dump(with_vars(kit, role_vars))
    diag = kit.error(text, words)
    assert diag.path == path
    assert diag.line > kit.line_of(text, "role_vars:")


def test_every_role_variable_is_known(kit: Any) -> None:
    specs = load_specs(kit.root / "roles")
    assert specs["nvidia_driver_hold"].type == "bool" and specs["nvidia_driver_hold"].role == "nvidia_driver"
    assert specs["pxe_server_dhcp_mode"].choices is not None
    assert len(specs) > 100


def test_role_vars_are_part_of_the_plan(kit: Any) -> None:
    plain = kit.load(kit.base()).manifest
    settled = State(cluster="testc", cluster_fingerprint=cluster_fingerprint(plain), nodes={
        n.name: NodeState(lifecycle="configured", fingerprints=node_sections(plain, n)) for n in plain.nodes})
    assert not compute(plain, settled, PLAYS).has_changes  # no role_vars: older states stay unchanged
    m = kit.load(with_vars(kit, {"node01": {"nvidia_driver_hold": False}})).manifest
    plan = compute(m, settled, PLAYS)
    assert plan.targets == ["node01"]
    assert {n.name: n.sections for n in plan.nodes if n.status == "changed"} == {"node01": ["role_vars"]}
    assert node_overrides(m, m.node("node01")) == {"nvidia_driver_hold": False}
    # taking it out again is a change too
    applied = State(cluster="testc", nodes={n.name: NodeState(lifecycle="configured", fingerprints=node_sections(m, n))
                                            for n in m.nodes}, cluster_fingerprint=cluster_fingerprint(m))
    back = compute(plain, applied, PLAYS)
    assert back.targets == ["node01"] and back.cluster_files_change
