"""Variables for the ``common`` role: hostname, /etc/hosts, time, users, mirrors, tuning."""

from __future__ import annotations

from typing import Any

from provisioner.areas.common.decide import data_interfaces, data_sysctl, enforced_root_keys
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


def hosts_entries(m: Manifest) -> list[dict[str, Any]]:
    """Every address of every node, management first, for /etc/hosts on every node: a
    network's NIC as ``<node>-<net>`` (``-ib`` on InfiniBand), each further NIC on it as
    ``<node>-<net><n>`` from 2 (gpu01-roce2: the node's second RoCE port)."""
    domain = m.cluster.domain
    entries: list[dict[str, Any]] = []
    for node in m.nodes:
        entries.append({"ip": str(node.ip), "names": [f"{node.name}.{domain}", node.name]})
    for net in ("data", "infiniband", "roce"):
        for node in m.nodes:
            iface = node.interfaces.get(net)
            if iface is None:
                continue
            suffix = "ib" if net == "infiniband" else net
            for k, nic in enumerate(iface.nics()):
                name = f"{node.name}-{suffix}{k + 1 if k else ''}"
                entries.append({"ip": str(nic.ip), "names": [f"{name}.{domain}", name]})
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
    interfaces = data_interfaces(m, node)
    out: dict[str, Any] = {
        "common_hostname": node.name,
        "common_ntp_servers": servers,
        "common_ntp_serve_networks": served,
        "common_data_interfaces": interfaces,
    }
    sysctl = data_sysctl(interfaces)
    if sysctl:  # only then: a node's variables stay what they were before it existed
        out["common_data_sysctl"] = sysctl
    return out
