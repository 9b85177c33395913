"""provisioner.areas.common.rolevars: /etc/hosts, NTP, users, mirrors and MTU for the common role."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.areas import registry as rolevars
from provisioner.areas.common import rolevars as common
from provisioner.validate import load_manifest


def test_hosts_entries_management_then_data(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert common.hosts_entries(m) == [
        {"ip": "10.0.0.10", "names": ["head01.test.internal", "head01"]},
        {"ip": "10.0.0.21", "names": ["node01.test.internal", "node01"]},
        {"ip": "10.0.0.22", "names": ["node02.test.internal", "node02"]},
        {"ip": "10.0.2.10", "names": ["head01-data.test.internal", "head01-data"]},
        {"ip": "10.0.2.21", "names": ["node01-data.test.internal", "node01-data"]},
        {"ip": "10.0.2.22", "names": ["node02-data.test.internal", "node02-data"]},
    ]


def test_hosts_entries_infiniband_names(kit: Any) -> None:
    m = load_manifest(kit.examples / "llm-200k.yaml").manifest
    entries = common.hosts_entries(m)
    assert len(entries) == 10
    assert entries[0] == {"ip": "10.10.0.10", "names": ["head01.llm.internal", "head01"]}
    assert entries[5] == {"ip": "10.10.2.10", "names": ["head01-ib.llm.internal", "head01-ib"]}
    assert entries[-1] == {"ip": "10.10.2.24", "names": ["gpu04-ib.llm.internal", "gpu04-ib"]}
    ips = [e["ip"] for e in entries]
    assert len(set(ips)) == len(ips)
    assert not any(e["ip"].startswith("10.10.1.") for e in entries)  # BMC addresses stay out


def test_hosts_entries_only_for_nodes_on_the_network(kit: Any) -> None:
    m = load_manifest(kit.examples / "music-lab.yaml").manifest
    names = [e["names"][1] for e in common.hosts_entries(m)]
    assert names == [
        "labhead", "store1", "store2", "gpu1", "gpu2", "gpu3",
        "store1-data", "store2-data", "gpu1-data", "gpu2-data", "gpu3-data",
    ]  # fmt: skip


def test_cluster_vars(kit: Any) -> None:
    data = kit.base()
    data["cluster"]["admin_users"].append({"name": "bob", "ssh_keys": [kit.ssh_key], "sudo": False, "uid": 2001})
    data["cluster"]["mirrors"] = {"apt": "http://mirror/ubuntu", "pip": "https://mirror/pypi/simple"}
    m = kit.load(data).manifest
    cv = common.cluster_vars(m)
    assert cv["common_domain"] == "test.internal"
    assert cv["common_timezone"] == "Etc/UTC"
    assert cv["common_hosts"] == common.hosts_entries(m)
    assert cv["common_admin_users"] == [
        {"name": "ops", "ssh_keys": [kit.ssh_key], "sudo": True, "shell": "/bin/bash"},
        {"name": "bob", "ssh_keys": [kit.ssh_key], "sudo": False, "shell": "/bin/bash", "uid": 2001},
    ]
    assert cv["common_root_authorized_keys"] == [kit.ssh_key]  # ops's (sudo); bob's only as bob's own
    assert cv["common_apt_mirror"] == "http://mirror/ubuntu"
    assert cv["common_apt_proxy"] == ""
    assert cv["common_pip_index_url"] == "https://mirror/pypi/simple"
    assert all(k.startswith("common_") for k in cv)


# --------------------------------------------------------------------------- NTP
def test_head_follows_the_manifest_servers_and_serves_management(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    nv = common.node_vars(m, m.node("head01"))
    assert nv["common_ntp_servers"] == ["ntp1.example.org", "ntp2.example.org"]
    assert nv["common_ntp_serve_networks"] == ["10.0.0.0/24"]


def test_other_nodes_follow_the_head(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    for name in ("node01", "node02"):
        nv = common.node_vars(m, m.node(name))
        assert nv["common_ntp_servers"] == ["head01"]
        assert nv["common_ntp_serve_networks"] == []


def test_head_without_manifest_servers(kit: Any) -> None:
    m = load_manifest(kit.examples / "music-lab.yaml").manifest
    assert common.ntp_for(m, m.node("labhead")) == ([], ["192.168.50.0/24"])
    assert common.ntp_for(m, m.node("gpu2")) == (["labhead"], [])


def test_without_a_head_everyone_follows_the_manifest_servers(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    headless = m.model_copy(update={"nodes": [n for n in m.nodes if not n.has_role("head")]})
    assert common.ntp_for(headless, headless.node("node01")) == (["ntp1.example.org", "ntp2.example.org"], [])


# --------------------------------------------------------------------------- node vars
def test_data_interface_address_and_mtu(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert common.node_vars(m, m.node("node02"))["common_data_interfaces"] == [
        {"interface": "ens1", "address": "10.0.2.22/24", "mtu": 9000}
    ]


def test_data_interface_needs_a_name(kit: Any) -> None:
    data = kit.base()
    del data["nodes"][0]["interfaces"]["data"]["interface"]
    m = kit.load(data).manifest
    assert common.node_vars(m, m.node("head01"))["common_data_interfaces"] == []
    assert common.node_vars(m, m.node("node01"))["common_data_interfaces"] == [
        {"interface": "ens1", "address": "10.0.2.21/24", "mtu": 9000}
    ]


def test_data_interface_default_mtu(kit: Any) -> None:
    data = kit.base()
    del data["networks"]["data"]["mtu"]
    m = kit.load(data).manifest
    assert common.node_vars(m, m.node("node01"))["common_data_interfaces"] == [
        {"interface": "ens1", "address": "10.0.2.21/24", "mtu": 1500}
    ]


def test_no_data_interfaces_on_infiniband_only_nodes(kit: Any) -> None:
    m = load_manifest(kit.examples / "llm-200k.yaml").manifest
    assert common.node_vars(m, m.node("gpu01"))["common_data_interfaces"] == []
    music = load_manifest(kit.examples / "music-lab.yaml").manifest
    assert common.node_vars(music, music.node("store2"))["common_data_interfaces"] == [
        {"interface": "enp65s0f0", "address": "192.168.60.12/24", "mtu": 9000}
    ]
    assert common.node_vars(music, music.node("labhead"))["common_data_interfaces"] == []


def test_root_keys_exclude_a_non_sudo_admin(kit: Any) -> None:
    """Issue 19 item 20: the role enforces root's authorized_keys from the installers' decision."""
    data = kit.base()
    bob = kit.ssh_key.replace("ops@test", "bob@test")
    data["cluster"]["admin_users"].append({"name": "bob", "ssh_keys": [bob], "sudo": False})
    cv = common.cluster_vars(kit.load(data).manifest)
    assert bob not in cv["common_root_authorized_keys"]
    assert cv["common_root_authorized_keys"] == [kit.ssh_key]
    data["cluster"]["admin_users"][1]["sudo"] = True
    assert common.cluster_vars(kit.load(data).manifest)["common_root_authorized_keys"] == [kit.ssh_key, bob]
    data["cluster"]["ssh"] = {"user": "ansible"}  # Ansible's own account has the keys; root none
    assert common.cluster_vars(kit.load(data).manifest)["common_root_authorized_keys"] == []
    data["cluster"]["ssh"] = {}
    data["cluster"]["admin_users"][0]["sudo"] = data["cluster"]["admin_users"][1]["sudo"] = False
    assert common.cluster_vars(kit.load(data).manifest)["common_root_authorized_keys"] is None  # left alone


def test_node_vars_keys(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    nv = common.node_vars(m, m.node("node01"))
    assert nv["common_hostname"] == "node01"
    assert set(nv) == {
        "common_hostname",
        "common_ntp_servers",
        "common_ntp_serve_networks",
        "common_data_interfaces",
    }


# --------------------------------------------------------------------------- aggregator
def test_common_is_registered_with_hosts_as_a_light_key() -> None:
    area = next(a for a in rolevars.AREAS if a.name == "common")
    assert area.cluster_vars is common.cluster_vars
    assert area.node_vars is common.node_vars
    assert "common_hosts" in area.light_keys


def test_aggregator(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert rolevars.cluster_vars(m)["common"] == common.cluster_vars(m)
    merged = rolevars.node_vars(m, m.node("node01"))
    assert {k: merged[k] for k in common.node_vars(m, m.node("node01"))} == common.node_vars(m, m.node("node01"))


def test_aggregator_refuses_a_variable_from_two_areas(kit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    m = kit.load(kit.base()).manifest
    twice = rolevars.Area("other", lambda m: {}, lambda m, n: {"common_hostname": "x"})
    monkeypatch.setattr(rolevars, "AREAS", (*rolevars.AREAS, twice))
    with pytest.raises(ValueError, match="common_hostname"):
        rolevars.node_vars(m, m.node("node01"))
