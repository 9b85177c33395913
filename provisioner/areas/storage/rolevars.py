"""Variables for the storage and fabric roles: scratch, zfs, nfs_server, nfs_client, mergerfs, ofed.

Cluster-wide values go to group_vars/all; everything that belongs to one node (its pools,
exports, mounts, unions, IPoIB interface) goes to that node's host_vars, and only to nodes
in the role's inventory group (:func:`provisioner.areas.storage.decide.storage_groups`). Every
value is computed from the manifest alone; the decisions live in
:mod:`provisioner.areas.storage.decide`.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.storage import decide as st
from provisioner.areas.storage import scratch
from provisioner.manifest.model import Manifest, Node
from provisioner.manifest.select import select_nodes


# --------------------------------------------------------------------------- scratch
def scratch_node_vars(node: Node) -> dict[str, Any]:
    """The node's scratch volume ({} without ``use: scratch`` disks: the node is in no
    scratch group, and its fingerprint stays what it was before scratch existed)."""
    volume = scratch.scratch_volume(node)
    return {} if volume is None else {"scratch_volume": volume.to_vars()}


# --------------------------------------------------------------------------- zfs
def zfs_pool_vars(m: Manifest, node: Node) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for pool in m.zfs.pools:
        if pool.node != node.name:
            continue
        layout = st.pool_layout(pool)
        out.append(
            {
                "name": pool.name,
                "purpose": pool.purpose,
                "force": pool.force,
                "create_args": st.create_args(pool),
                "layout": layout.to_dict(),
                "summary": layout.summary(),
                "disks": layout.disks(),
                "properties": {k: st.property_text(v) for k, v in sorted(pool.properties.items())},
                "datasets": [
                    {
                        "name": f"{pool.name}/{ds.name}",
                        "properties": {k: st.property_text(v) for k, v in sorted(ds.properties.items())},
                    }
                    for ds in pool.datasets
                ],
            }
        )
    return out


def zfs_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    return {
        "zfs_pools": zfs_pool_vars(m, node),
        "zfs_arc_max_bytes": st.arc_max_bytes(node.hardware.memory_gb, m.zfs.arc_max_percent),
    }


# --------------------------------------------------------------------------- nfs
def nfs_server_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    exports = st.exports_for(m, node)
    mounts = [mnt for exp in exports for mnt in st.mounts_of_export(m, exp)]
    rdma = False
    for mnt in mounts:
        for client_name in select_nodes(m, mnt.nodes):
            if st.mount_proto(m, mnt, m.node(client_name)) == "rdma":
                rdma = True
    return {
        "nfs_server_exports": [
            {
                "name": exp.name,
                "path": st.export_path(m, exp),
                "clients": st.export_clients(m, exp),
                "options": st.export_options(exp),
                # a dataset's mountpoint comes from ZFS; only plain paths are created
                "create_path": exp.dataset is None,
            }
            for exp in exports
        ],
        "nfs_server_threads": st.nfsd_threads(node.hardware.cpu.cores, m.nfs.threads),
        "nfs_server_vers3": any(mnt.vers == "3" for mnt in mounts),
        "nfs_server_rdma": rdma,
    }


def nfs_client_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    st.check_one_path_per_server(m, node)
    mounts: list[dict[str, Any]] = []
    for mnt in st.mounts_for(m, node):
        export = st.export_by_name(m, mnt.export)
        proto = st.mount_proto(m, mnt, node)
        mounts.append(
            {
                "export": export.name,
                "what": f"{st.server_address(m, export, node, proto)}:{st.export_path(m, export)}",
                "where": mnt.path,
                "unit": st.mount_unit(mnt.path),
                "automount": mnt.automount,
                "automount_unit": st.automount_unit(mnt.path),
                "proto": proto,
                "options": st.mount_options(mnt, proto),
            }
        )
    return {
        "nfs_client_mounts": mounts,
        "nfs_client_rdma": any(x["proto"] == "rdma" for x in mounts),
    }


# --------------------------------------------------------------------------- mergerfs
def mergerfs_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    unions: list[dict[str, Any]] = []
    for union in st.unions_for(m, node):
        requires = st.union_mount_units(m, union, node)
        unions.append(
            {
                "path": union.path,
                "unit": st.mount_unit(union.path),
                "branches": list(union.branches),
                "options": st.mergerfs_options(union, network=bool(requires)),
                "requires": requires,
            }
        )
    return {"mergerfs_unions": unions}


# --------------------------------------------------------------------------- ofed
def ofed_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    return {
        "ofed_ipoib": st.ipoib_config(m, node),
        "ofed_opensm": st.opensm_node(m) == node.name,
        "ofed_peermem": st.wants_peermem(m, node),
    }


# --------------------------------------------------------------------------- contract
def cluster_vars(m: Manifest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "zfs_scrub": m.zfs.scrub,
        "ofed_source": m.software.ofed.source,
    }
    if m.software.ofed.doca_version:
        out["ofed_doca_version"] = m.software.ofed.doca_version
    return out


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    groups = st.storage_groups(m, node)
    out: dict[str, Any] = scratch_node_vars(node)
    if "zfs" in groups:
        out |= zfs_node_vars(m, node)
    if "nfs_server" in groups:
        out |= nfs_server_node_vars(m, node)
    if "nfs_client" in groups:
        out |= nfs_client_node_vars(m, node)
    if "mergerfs" in groups:
        out |= mergerfs_node_vars(m, node)
    if "infiniband" in groups:
        out |= ofed_node_vars(m, node)
    return out
