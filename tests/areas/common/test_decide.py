"""provisioner.areas.common.decide: the keys that reach root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas import registry
from provisioner.areas.common import decide as common
from provisioner.areas.common.rolevars import hosts_entries
from provisioner.areas.monitoring.decide import NODE_AGENT_PACKAGES

AUTOMATION_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8s9t0u1v automation"


def _admins(kit: Any) -> dict[str, Any]:
    data: dict[str, Any] = kit.base()
    data["cluster"]["admin_users"] = [
        {"name": "alice", "ssh_keys": [kit.ssh_key.replace("ops@test", "alice")]},
        {"name": "bob", "sudo": False, "ssh_keys": [kit.ssh_key.replace("ops@test", "bob")]},
        {"name": "carol", "ssh_keys": [kit.ssh_key.replace("ops@test", "alice")]},  # alice's key again
    ]
    return data


def test_root_gets_the_keys_of_sudo_admins_and_the_automation_key(kit: Any) -> None:
    data = _admins(kit)
    m = kit.load(data).manifest
    assert common.root_authorized_keys(m) == [kit.ssh_key.replace("ops@test", "alice")]  # once, no bob
    data["cluster"]["ssh"] = {"public_key": AUTOMATION_KEY}
    m = kit.load(data).manifest
    assert common.root_authorized_keys(m) == [kit.ssh_key.replace("ops@test", "alice"), AUTOMATION_KEY]
    data["cluster"]["ssh"] = {"user": "ansible", "public_key": AUTOMATION_KEY}
    m = kit.load(data).manifest
    assert common.root_authorized_keys(m) == []  # root logs in with no key
    assert common.privileged_keys(m)[-1] == AUTOMATION_KEY  # the ansible account's


def test_ansible_account_problems(kit: Any) -> None:
    data = _admins(kit)
    assert common.ansible_account_problem(kit.load(data).manifest) is None
    data["cluster"]["ssh"] = {"user": "bob"}
    assert "sudo: false" in str(common.ansible_account_problem(kit.load(data).manifest))
    data["cluster"]["admin_users"] = [data["cluster"]["admin_users"][1]]
    data["cluster"]["ssh"] = {}
    assert "there are none" in str(common.ansible_account_problem(kit.load(data).manifest))


def test_public_key_must_be_an_openssh_key(kit: Any) -> None:
    data = kit.base()
    data["cluster"]["ssh"] = {"public_key": "not a key"}
    assert kit.error(data, "not an OpenSSH public key").path == "cluster.ssh.public_key"


def test_a_roce_nic_is_configured_like_a_data_nic(kit: Any) -> None:
    """RoCE rides on the NIC's IP address: the common role sets it and the MTU (9000) with the
    data network's careful reconfigure; /etc/hosts names it <node>-roce."""
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0"}
    m = kit.load(data).manifest
    assert common.data_interfaces(m, m.node("node02")) == [
        {"interface": "ens1", "address": "10.0.2.22/24", "mtu": 9000},
        {"interface": "ens2f0np0", "address": "10.0.4.22/24", "mtu": 9000},
    ]
    assert {"ip": "10.0.4.22", "names": ["node02-roce.test.internal", "node02-roce"]} in hosts_entries(m)
    # a second RoCE port: its own address, the same careful configuration
    data["nodes"][1]["interfaces"]["roce"] = [data["nodes"][1]["interfaces"]["roce"],
                                              {"ip": "10.0.4.121", "interface": "ens2f1np1"}]
    m = kit.load(data).manifest
    hosts = hosts_entries(m)  # every port resolves: the network's as <node>-roce, the second as <node>-roce2
    assert {"ip": "10.0.4.22", "names": ["node02-roce.test.internal", "node02-roce"]} in hosts
    assert {"ip": "10.0.4.122", "names": ["node02-roce2.test.internal", "node02-roce2"]} in hosts
    assert common.data_interfaces(m, m.node("node02"))[1:] == [  # sharing a prefix: a table each
        {"interface": "ens2f0np0", "address": "10.0.4.22/24", "mtu": 9000, "table": 102, "network": "10.0.4.0/24"},
        {"interface": "ens2f1np1", "address": "10.0.4.122/24", "mtu": 9000, "table": 103, "network": "10.0.4.0/24"},
    ]


def test_data_interfaces_get_their_address_and_mtu_without_a_route(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    ifaces = common.data_interfaces(m, m.node("node02"))
    assert ifaces == [{"interface": "ens1", "address": "10.0.2.22/24", "mtu": 9000}]
    netplan = common.netplan_data_config(ifaces)["network"]
    assert netplan["ethernets"]["ens1"]["addresses"] == ["10.0.2.22/24"]
    assert netplan["ethernets"]["ens1"]["mtu"] == 9000
    assert "routes" not in netplan["ethernets"]["ens1"] and "gateway4" not in netplan["ethernets"]["ens1"]
    unit = common.networkd_data_unit(ifaces[0])
    assert "Name=ens1\n" in unit and "Address=10.0.2.22/24\n" in unit and "MTUBytes=9000\n" in unit
    assert "Gateway=" not in unit


def test_a_data_interface_without_a_name_is_left_out(kit: Any) -> None:
    data = kit.base()
    del data["nodes"][1]["interfaces"]["data"]["interface"]
    m = kit.load(data).manifest
    assert common.data_interfaces(m, m.node("node01")) == []


def test_root_keys_are_enforced_unless_none_is_allowed_root(kit: Any) -> None:
    """Issue 19 item 20: the common role writes exactly these keys to root's authorized_keys."""
    data = _admins(kit)
    alice = kit.ssh_key.replace("ops@test", "alice")
    assert common.enforced_root_keys(kit.load(data).manifest) == [alice]
    assert common.unmanaged_root_keys_problem(kit.load(data).manifest) is None
    data["cluster"]["admin_users"] = [data["cluster"]["admin_users"][1]]  # bob only: sudo false
    m = kit.load(data).manifest
    assert common.enforced_root_keys(m) is None  # [] would lock Ansible (root) out
    assert "sudo: false included" in str(common.unmanaged_root_keys_problem(m))
    data["cluster"]["ssh"] = {"public_key": AUTOMATION_KEY}
    assert common.enforced_root_keys(kit.load(data).manifest) == [AUTOMATION_KEY]  # bob's key goes
    data["cluster"]["ssh"] = {"user": "ansible", "public_key": AUTOMATION_KEY}
    assert common.enforced_root_keys(kit.load(data).manifest) == []  # root: no key at all


# --------------------------------------------------------------------------- node images
ROLE = Path(__file__).resolve().parents[3] / "roles" / "common"


@pytest.mark.parametrize("os_vars", sorted((ROLE / "vars").glob("*.yml")), ids=lambda p: p.stem)
def test_image_packages_are_what_the_common_role_installs(os_vars: Path) -> None:
    """A node image carries the common role's packages, so they must be the role's own: the
    OS's required ones and the defaults' common_packages, on every OS."""
    required = yaml.safe_load(os_vars.read_text())["__common_required_packages"]
    extra = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["common_packages"]
    assert sorted(common.BASE_PACKAGES) == sorted({*required, *extra})


def test_every_image_carries_the_base_packages_and_a_monitored_one_the_agent(kit: Any) -> None:
    plain = registry.image_packages(kit.load(kit.base()).manifest)
    assert plain == tuple(sorted(common.BASE_PACKAGES))
    data = kit.base()
    data["monitoring"] = {}
    monitored = registry.image_packages(kit.load(data).manifest)
    assert monitored == tuple(sorted({*common.BASE_PACKAGES, *NODE_AGENT_PACKAGES}))
