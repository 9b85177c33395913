"""Variables for the ``pxe_server`` role (bare-metal installs), from the manifest.

All of them are cluster-wide (group_vars/all): the PXE server on the head node publishes
what the whole manifest says about every node, like slurm.conf. They are light keys: a
change (a new node, a new key) is picked up by the light play of playbooks/baremetal.yml
(``tasks_from: config``) and must not re-run heavy plays on the head node. The per-node
install files (iPXE script, autoinstall seed, preseed) are rendered here by
:mod:`provisioner.areas.baremetal.seeds`, so the role only publishes them.

``pxe_server_ubuntu_media`` comes from ``cluster.install_media`` or the release's stable
directory (provisioner/areas/baremetal/media.yaml). Not in the manifest (yet), so left to the
role's defaults: ``pxe_server_dhcp_mode``, ``pxe_server_debian_netboot_*``; ``pxe_server_arm_nodes`` is
passed per run by the install lifecycle.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.baremetal.decide import (
    PXE_HTTP_PORT,
    install_server,
    not_installable,
)
from provisioner.areas.baremetal.deploy import deploy_files, method
from provisioner.areas.baremetal.media import ubuntu_media
from provisioner.areas.baremetal.seeds import install_files
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


def pxe_nodes(m: Manifest) -> list[Node]:
    """Nodes the PXE server installs: all but the head and nodes that cannot be
    installed over PXE (no management MAC or no install_disks)."""
    return [n for n in m.nodes if not_installable(m, n) is None]


def pxe_node_entry(m: Manifest, node: Node) -> dict[str, Any]:
    server = install_server(m, PXE_HTTP_PORT)
    mac = node.interfaces["management"].mac
    assert mac is not None  # pxe_nodes() keeps only nodes with one
    how = method(m, node)
    files = deploy_files(m, node, server) if how == "image" else install_files(m, node, server)
    return {
        "name": node.name,
        "mac": mac,
        "address": str(node.ip),
        "os": node.os,
        "boot_mode": node.bmc.boot_mode if node.bmc is not None else "uefi",
        "method": how,
        "files": [{"name": name, "content": text} for name, text in files.items()],
    }


def pxe_vars(m: Manifest) -> dict[str, Any]:
    head = m.head
    net = m.networks.management
    return {
        "pxe_server_address": str(head.ip),
        "pxe_server_network": str(net.cidr),
        "pxe_server_network_address": str(net.cidr.network_address),
        "pxe_server_netmask": str(net.cidr.netmask),
        "pxe_server_gateway": str(net.gateway) if net.gateway is not None else "",
        "pxe_server_dns": [str(d) for d in net.dns],
        "pxe_server_domain": m.cluster.domain,
        "pxe_server_interface": head.interfaces["management"].interface or "",
        "pxe_server_http_port": PXE_HTTP_PORT,
        "pxe_server_nodes": [pxe_node_entry(m, n) for n in pxe_nodes(m)],
        "pxe_server_ubuntu_media": ubuntu_media(m),
    }


def cluster_vars(m: Manifest) -> dict[str, Any]:
    """The pxe_server variables (empty without a head node, which the checks forbid)."""
    if not m.with_role("head"):
        return {}
    return pxe_vars(m)


# The light play of playbooks/baremetal.yml consumes every variable above.
LIGHT_KEYS = frozenset({
    "pxe_server_address", "pxe_server_network", "pxe_server_network_address", "pxe_server_netmask",
    "pxe_server_gateway", "pxe_server_dns", "pxe_server_domain", "pxe_server_interface",
    "pxe_server_http_port", "pxe_server_nodes", "pxe_server_ubuntu_media",
})


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """Nothing node-specific."""
    return {}
