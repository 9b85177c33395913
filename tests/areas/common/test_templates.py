"""The common role's data-network templates, rendered with plain Jinja2 from the role
variables the inventory writes, hold to provisioner.areas.common.decide's renderers
(issue 19 item 11): address, MTU, no route, per OS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import yaml

from provisioner.areas.common import decide
from provisioner.areas.common import rolevars as common
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
    methods = {f.stem: yaml.safe_load(f.read_text())["__common_data_network_method"]
               for f in sorted((ROLE / "vars").glob("*.yml"))}
    assert methods == {"Debian-12": "networkd", "Ubuntu-22": "netplan", "Ubuntu-24": "netplan"}
