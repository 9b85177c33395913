"""provisioner.areas.fabric.rolevars, checked against the ofed role's argument specs and
templates (rendered as Ansible's template module does: trim_blocks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from provisioner import inventory
from provisioner.areas import registry
from provisioner.areas.fabric import rolevars as fabric
from provisioner.manifest import Manifest
from tests.areas.roletemplates import body, render

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ["llm-200k.yaml", "music-lab.yaml"]
NODE_KEYS = {"ofed_ipoib", "ofed_opensm", "ofed_peermem"}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def role_vars(m: Manifest, node_name: str, role: str = "ofed") -> dict[str, Any]:
    """Role defaults < cluster vars < node vars."""
    merged: dict[str, Any] = dict(load_yaml(ROOT / "roles" / role / "defaults" / "main.yml") or {})
    return merged | fabric.cluster_vars(m) | fabric.node_vars(m, m.node(node_name))


# =========================================================================== contract
@pytest.mark.parametrize("name", EXAMPLES)
def test_node_vars_only_on_a_fabric_and_they_pass_the_argument_spec(kit: Any, name: str) -> None:
    m = kit.load(kit.example(name)).manifest
    spec = load_yaml(ROOT / "roles" / "ofed" / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    for node in m.nodes:
        keys = set(fabric.node_vars(m, node))
        on_fabric = "infiniband" in node.interfaces or "roce" in node.interfaces
        assert keys == (NODE_KEYS if on_fabric else set()), node.name
        result = ArgumentSpecValidator(spec).validate(role_vars(m, node.name))
        assert not result.error_messages and not result.unsupported_parameters, (node.name, result.error_messages)
    assert set(fabric.cluster_vars(m)) <= set(spec)


def test_variables_are_produced_by_the_aggregator(llm: Manifest) -> None:
    assert registry.cluster_vars(llm)["fabric"] == fabric.cluster_vars(llm) == {"ofed_source": "inbox"}
    merged = registry.node_vars(llm, llm.node("gpu01"))
    assert {k: merged[k] for k in NODE_KEYS} == fabric.node_vars(llm, llm.node("gpu01"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_fabric_groups_match_the_inventory(kit: Any, name: str) -> None:
    m = kit.load(kit.example(name)).manifest
    groups = inventory.groups(m)
    for group, members in fabric.groups(m).items():
        assert set(groups[group]) == members, group


# =========================================================================== llm-200k
def test_llm_fabric(llm: Manifest) -> None:
    head = fabric.node_vars(llm, llm.node("head01"))
    assert head["ofed_ipoib"] == {"interface": "ibp65s0", "address": "10.10.2.10/24", "mtu": 2044,
                                  "mode": "datagram"}
    assert head["ofed_opensm"] is False  # managed switch
    assert head["ofed_peermem"] is False
    gpu = role_vars(llm, "gpu04", "ofed")
    assert gpu["ofed_peermem"] is True
    network = body(render("ofed", "ipoib.networkd.j2", gpu))
    assert network == ["[Match]", "Name=ibp65s0", "[Link]", "MTUBytes=2044", "[Network]",
                       "Address=10.10.2.24/24", "LinkLocalAddressing=no", "IPv6AcceptRA=no"]
    netplan = yaml.safe_load(render("ofed", "ipoib.netplan.j2", gpu))
    assert netplan["network"]["ethernets"]["ibp65s0"]["addresses"] == ["10.10.2.24/24"]
    assert netplan["network"]["ethernets"]["ibp65s0"]["mtu"] == 2044
    rules = body(render("ofed", "ipoib-mode.rules.j2", gpu))
    assert all(r.endswith('ATTR{mode}="datagram"') for r in rules) and len(rules) == 2


def test_opensm_when_no_managed_switch(kit: Any) -> None:
    data = kit.example("llm-200k.yaml")
    data["networks"]["infiniband"]["subnet_manager"] = "opensm"
    data["networks"]["infiniband"]["mode"] = "connected"
    data["networks"]["infiniband"]["mtu"] = 65520
    data["networks"]["infiniband"]["hca_supports_connected"] = True  # ConnectX-3 and older only
    m = kit.load(data).manifest
    assert [n.name for n in m.nodes if fabric.node_vars(m, n).get("ofed_opensm")] == ["head01"]
    assert fabric.node_vars(m, m.node("gpu01"))["ofed_ipoib"]["mode"] == "connected"
