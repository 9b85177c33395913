"""The common role's data-network templates, rendered with plain Jinja2 from the role
variables the inventory writes, hold to provisioner.areas.common.decide's renderers
(issue 19 item 11): address, MTU, no route, per OS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from provisioner.areas.common import decide
from provisioner.areas.common import rolevars as common
from provisioner.platforms import PLATFORMS, os_vars_path
from provisioner.validate import load_manifest

ROLE = Path(__file__).resolve().parents[3] / "roles" / "common"


def render(template: str, **variables: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, keep_trailing_newline=True)
    return env.get_template(template).render(ansible_managed="Ansible managed", **variables)


def body(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"


def test_netplan_file_is_the_decided_config(kit: Any) -> None:
    m = load_manifest(kit.examples / "music-lab.yaml").manifest
    ifaces = common.node_vars(m, m.node("store2"))["common_data_interfaces"]
    rendered = yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=ifaces))
    assert rendered == decide.netplan_data_config(ifaces)
    nic = rendered["network"]["ethernets"]["enp65s0f0"]
    assert nic["addresses"] == ["192.168.60.12/24"] and nic["mtu"] == 9000
    assert nic["dhcp4"] is False and nic["optional"] is True
    assert not {"routes", "gateway4", "gateway6", "nameservers"} & set(nic)


def test_networkd_file_is_the_decided_unit(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    (iface,) = common.node_vars(m, m.node("node02"))["common_data_interfaces"]
    rendered = render("networkd-data.network.j2", item=iface)
    assert body(rendered) == decide.networkd_data_unit(iface)
    lines = rendered.splitlines()
    assert "Address=10.0.2.22/24" in lines and "MTUBytes=9000" in lines and "Name=ens1" in lines
    assert "RequiredForOnline=no" in lines  # a dead data link does not hold up boot
    assert not [line for line in lines if line.startswith(("Gateway=", "DHCP=", "[Route]"))]


def test_os_vars_choose_netplan_on_ubuntu_and_networkd_on_debian() -> None:
    methods = {}
    for name, platform in PLATFORMS.items():
        found = os_vars_path(ROLE / "vars", platform)
        assert found is not None, name
        methods[name] = yaml.safe_load(found.read_text())["__common_data_network_method"]
    assert methods == {"debian-12": "networkd", "ubuntu-22.04": "netplan", "ubuntu-24.04": "netplan"}


# --------------------------------------------------------------------------- bonds (issue 28 item 2)
def bonded_interfaces(kit: Any, mode: str = "802.3ad") -> list[dict[str, Any]]:
    data = kit.base()
    del data["nodes"][1]["interfaces"]["management"]["mac"]
    data["nodes"][1]["interfaces"]["data"]["interface"] = "bond0"
    data["nodes"][1]["bonds"] = {"bond0": {"mode": mode, "members": ["ens1f0", "52:54:00:aa:00:02"]}}
    data["nodes"][1]["name"] = "node01"  # one node: a MAC member belongs to one machine
    m = kit.load(data).manifest
    ifaces: list[dict[str, Any]] = common.node_vars(m, m.node("node01"))["common_data_interfaces"]
    return ifaces


def test_data_interface_on_a_bond(kit: Any) -> None:
    (iface,) = bonded_interfaces(kit)
    assert iface == {"interface": "bond0", "address": "10.0.2.21/24", "mtu": 9000,
                     "bond": {"mode": "802.3ad", "members": [{"name": "ens1f0"}, {"mac": "52:54:00:aa:00:02"}]}}


@pytest.mark.parametrize("mode", ["802.3ad", "active-backup"])
def test_netplan_bond_is_the_decided_config(kit: Any, mode: str) -> None:
    ifaces = bonded_interfaces(kit, mode)
    rendered = yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=ifaces))
    assert rendered == decide.netplan_data_config(ifaces)
    net = rendered["network"]
    bond = net["bonds"]["bond0"]
    assert bond["interfaces"] == ["ens1f0", "bond0-m1"] and bond["addresses"] == ["10.0.2.21/24"]
    assert bond["mtu"] == 9000 and bond["parameters"]["mode"] == mode
    assert ("lacp-rate" in bond["parameters"]) == (mode == "802.3ad")
    assert net["ethernets"]["bond0-m1"]["match"] == {"macaddress": "52:54:00:aa:00:02"}
    assert "addresses" not in net["ethernets"]["ens1f0"]  # members carry no address of their own


def ini(text: str) -> dict[str, dict[str, str]]:
    """A systemd unit's sections and keys (each key once here)."""
    out: dict[str, dict[str, str]] = {}
    section = ""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            assert section not in out, f"[{section}] twice"
            out[section] = {}
            continue
        key, sep, value = line.partition("=")
        assert sep and section and key not in out[section], line
        out[section][key] = value
    return out


def test_networkd_bond_files_are_the_decided_units(kit: Any) -> None:
    (iface,) = bonded_interfaces(kit)
    files = decide.networkd_data_files([iface])
    assert sorted(files) == ["90-provision-data-bond0-m0.network", "90-provision-data-bond0-m1.network",
                             "90-provision-data-bond0.netdev", "90-provision-data-bond0.network"]
    netdev = render("networkd-bond.netdev.j2", item=iface)
    assert body(netdev) == files["90-provision-data-bond0.netdev"]
    assert ini(netdev) == {"NetDev": {"Name": "bond0", "Kind": "bond", "MTUBytes": "9000"},
                           "Bond": {"Mode": "802.3ad", "MIIMonitorSec": "100ms", "LACPTransmitRate": "fast",
                                    "TransmitHashPolicy": "layer3+4"}}
    for n, member in enumerate(iface["bond"]["members"]):
        unit = render("networkd-bond-member.network.j2", item=(iface, member))
        assert body(unit) == files[f"90-provision-data-bond0-m{n}.network"]
        parsed = ini(unit)
        assert parsed["Network"]["Bond"] == "bond0" and parsed["Match"]["Type"] == "ether"
        assert "Address" not in parsed["Network"]
    by_mac = ini(files["90-provision-data-bond0-m1.network"])["Match"]
    assert by_mac == {"PermanentMACAddress": "52:54:00:aa:00:02", "Type": "ether"}  # never the bond's MAC
    assert ini(files["90-provision-data-bond0.network"])["Network"]["Address"] == "10.0.2.21/24"


@pytest.mark.parametrize("mode", ["802.3ad", "active-backup"])
def test_systemd_networkd_accepts_the_data_units(kit: Any, networkd: Any, mode: str) -> None:
    """The real systemd-networkd reads the data network's files (a bond's .netdev, its
    .network, its members' .network; the tests above hold the role's templates to them)
    and has nothing to say about any of them."""
    (iface,) = bonded_interfaces(kit, mode)
    plain = {"interface": "ens2f0np0", "address": "10.0.4.21/24", "mtu": 9000}
    assert networkd(decide.networkd_data_files([iface, plain])) == []


@pytest.mark.parametrize("mode", ["802.3ad", "active-backup"])
def test_netplan_generates_the_data_units_and_networkd_takes_them(kit: Any, netplan: Any, networkd: Any,
                                                                  mode: str) -> None:
    """Ubuntu: netplan's own generator accepts the role's netplan file (a bond and a plain
    NIC) and writes the bond with its members; systemd-networkd has nothing to say about what
    it wrote."""
    (iface,) = bonded_interfaces(kit, mode)
    plain = {"interface": "ens2f0np0", "address": "10.0.4.21/24", "mtu": 9000}
    config = yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=[iface, plain]))
    units = netplan(config)
    assert "Kind=bond" in units["10-netplan-bond0.netdev"] and f"Mode={mode}" in units["10-netplan-bond0.netdev"]
    assert "Address=10.0.2.21/24" in units["10-netplan-bond0.network"]
    assert "Bond=bond0" in units["10-netplan-bond0-m1.network"]
    assert "PermanentMACAddress=52:54:00:aa:00:02" in units["10-netplan-bond0-m1.network"]
    assert "MTUBytes=9000" in units["10-netplan-ens2f0np0.network"]
    assert networkd(units) == []


# --------------------------------------------------------------------------- NICs sharing a prefix (issue 28)
def two_nic_interfaces(kit: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """node01's data network over two NICs (ens1 10.0.2.21, ens2 10.0.2.121): its data
    interfaces and its common variables."""
    data = kit.base()
    data["nodes"][1]["interfaces"]["data"] = [{"ip": "10.0.2.21", "interface": "ens1"},
                                              {"ip": "10.0.2.121", "interface": "ens2"}]
    m = kit.load(data).manifest
    variables = common.node_vars(m, m.node("node01"))
    return variables["common_data_interfaces"], variables


def test_nics_sharing_a_prefix_each_get_a_table(kit: Any) -> None:
    """Two NICs on one prefix: the main table sends every packet to that prefix out of one
    of them (replies to NFS clients of the second address included), and by default each
    answers ARP for both addresses. Each gets its own table and rule, and ARP is per NIC.
    A node with one NIC per network renders as before (no table, no extra sysctl)."""
    ifaces, variables = two_nic_interfaces(kit)
    assert ifaces == [
        {"interface": "ens1", "address": "10.0.2.21/24", "mtu": 9000, "table": 101, "network": "10.0.2.0/24"},
        {"interface": "ens2", "address": "10.0.2.121/24", "mtu": 9000, "table": 102, "network": "10.0.2.0/24"}]
    assert variables["common_data_sysctl"] == {"net.ipv4.conf.all.arp_ignore": 1,
                                               "net.ipv4.conf.all.arp_announce": 2}
    m = kit.load(kit.base()).manifest
    plain = common.node_vars(m, m.node("node01"))
    assert plain["common_data_interfaces"] == [{"interface": "ens1", "address": "10.0.2.21/24", "mtu": 9000}]
    assert "common_data_sysctl" not in plain
    # the tables are the node's own: a second network's NICs continue the count
    assert [i["table"] for i in decide.source_tables(ifaces, "10.0.4.0/24", first_table=103)] == [103, 104]


def test_the_role_renders_the_tables_as_decided(kit: Any) -> None:
    ifaces, _ = two_nic_interfaces(kit)
    rendered = yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=ifaces))
    assert rendered == decide.netplan_data_config(ifaces)
    ens2 = rendered["network"]["ethernets"]["ens2"]
    assert ens2["routes"] == [{"to": "10.0.2.0/24", "scope": "link", "from": "10.0.2.121", "table": 102}]
    assert ens2["routing-policy"] == [{"from": "10.0.2.121", "table": 102}]
    for iface in ifaces:
        unit = render("networkd-data.network.j2", item=iface)
        assert body(unit) == decide.networkd_data_unit(iface)
    parsed = ini(decide.networkd_data_unit(ifaces[1]))
    assert parsed["Route"] == {"Destination": "10.0.2.0/24", "Scope": "link", "PreferredSource": "10.0.2.121",
                               "Table": "102"}
    assert parsed["RoutingPolicyRule"] == {"From": "10.0.2.121/32", "Table": "102"}
    sysctl = render("sysctl.conf.j2", common_sysctl={"vm.swappiness": 10, "net.ipv4.conf.all.arp_ignore": 0},
                    common_data_sysctl={"net.ipv4.conf.all.arp_ignore": 1, "net.ipv4.conf.all.arp_announce": 2})
    assert body(sysctl).split("\n") == ["vm.swappiness = 10", "net.ipv4.conf.all.arp_announce = 2",
                                        "net.ipv4.conf.all.arp_ignore = 1", ""]


def test_the_sysctl_file_is_as_before_without_shared_prefixes() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    sysctl = render("sysctl.conf.j2", common_sysctl=defaults["common_sysctl"],
                    common_data_sysctl=defaults["common_data_sysctl"])
    assert body(sysctl) == "".join(f"{k} = {v}\n" for k, v in sorted(defaults["common_sysctl"].items()))


def test_netplan_and_networkd_take_the_tables(kit: Any, netplan: Any, networkd: Any) -> None:
    """netplan's own generator turns the role's file into the same [Route] and
    [RoutingPolicyRule] the Debian units carry, and systemd-networkd has nothing to say
    about either."""
    ifaces, _ = two_nic_interfaces(kit)
    assert networkd(decide.networkd_data_files(ifaces)) == []
    units = netplan(yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=ifaces)))
    ens2 = ini(units["10-netplan-ens2.network"])
    assert ens2["Route"]["Table"] == "102" and ens2["Route"]["Destination"] == "10.0.2.0/24"
    assert ens2["RoutingPolicyRule"]["From"].startswith("10.0.2.121") and ens2["RoutingPolicyRule"]["Table"] == "102"
    assert networkd(units) == []


def test_a_bond_sharing_a_prefix_gets_its_table_too(kit: Any, networkd: Any) -> None:
    (bond,) = bonded_interfaces(kit)
    ifaces = decide.source_tables([bond, {"interface": "ens3", "address": "10.0.2.121/24", "mtu": 9000}],
                                  "10.0.2.0/24", first_table=101)
    rendered = yaml.safe_load(render("netplan-data.yaml.j2", common_data_interfaces=ifaces))
    assert rendered == decide.netplan_data_config(ifaces)
    assert rendered["network"]["bonds"]["bond0"]["routing-policy"] == [{"from": "10.0.2.21", "table": 101}]
    assert ini(decide.networkd_data_files(ifaces)["90-provision-data-bond0.network"])["Route"]["Table"] == "101"
    assert networkd(decide.networkd_data_files(ifaces)) == []
