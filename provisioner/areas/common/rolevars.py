"""Variables for the ``common`` role: hostname, /etc/hosts, time, users, mirrors, tuning."""

from __future__ import annotations

from typing import Any

from provisioner.areas.common.decide import data_interfaces, enforced_root_keys
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


def hosts_entries(m: Manifest) -> list[dict[str, Any]]:
    """Every address of every node, management first, for /etc/hosts on every node."""
    domain = m.cluster.domain
    entries: list[dict[str, Any]] = []
    for node in m.nodes:
        entries.append({"ip": str(node.ip), "names": [f"{node.name}.{domain}", node.name]})
    for net in ("data", "infiniband", "roce"):
        for node in m.nodes:
            iface = node.interfaces.get(net)
            if iface is not None:
                suffix = "ib" if net == "infiniband" else net
                names = [f"{node.name}-{suffix}.{domain}", f"{node.name}-{suffix}"]
                entries.append({"ip": str(iface.ip), "names": names})
    return entries


def cluster_vars(m: Manifest) -> dict[str, Any]:
    mirrors = m.cluster.mirrors
    return {
        "common_domain": m.cluster.domain,
        "common_hosts": hosts_entries(m),
        "common_timezone": m.cluster.timezone,
        "common_admin_users": [
            {"name": u.name, "ssh_keys": list(u.ssh_keys), "sudo": u.sudo, "shell": u.shell}
            | ({"uid": u.uid} if u.uid is not None else {})
            for u in m.cluster.admin_users
        ],
        # enforced on every apply: a sudo: false admin's key never reaches root
        "common_root_authorized_keys": enforced_root_keys(m),
        "common_apt_mirror": mirrors.apt or "",
        "common_apt_proxy": mirrors.apt_proxy or "",
        "common_pip_index_url": mirrors.pip or "",
    }


def ntp_for(m: Manifest, node: Node) -> tuple[list[str], list[str]]:
    """(servers, networks served): the head follows the manifest's servers and serves the
    cluster; every other node follows the head (or the manifest's servers if no head)."""
    heads = m.with_role("head")
    if heads and node.name == heads[0].name:
        served = [str(m.networks.management.cidr)]
        return (list(m.cluster.ntp_servers), served)
    if heads:
        return ([heads[0].name], [])
    return (list(m.cluster.ntp_servers), [])


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    servers, served = ntp_for(m, node)
    return {
        "common_hostname": node.name,
        "common_ntp_servers": servers,
        "common_ntp_serve_networks": served,
        "common_data_interfaces": data_interfaces(m, node),
    }
