"""Variables for the storage roles: scratch, zfs, nfs_server, nfs_client, mergerfs.

Cluster-wide values go to group_vars/all; everything that belongs to one node (its pools,
exports, mounts, unions) goes to that node's host_vars, and only to nodes
in the role's inventory group (:func:`storage_groups`). Every value is computed from the
manifest alone; the decisions live beside this module, by concern: ``zfs``, ``disks``,
``nfs``, ``mergerfs``, ``units``.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.storage import mergerfs, nfs, replicate, scratch, snapshots, units, zfs
from provisioner.areas.storage.replication_key import KEY_NAME
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import select_nodes


def groups(m: Manifest) -> dict[str, set[str]]:
    """The storage area's inventory groups -> members."""
    return {
        "zfs": {p.node for p in m.zfs.pools},
        "nfs_server": {e.node for e in m.nfs.exports},
        "nfs_client": {name for mnt in m.nfs.mounts for name in select_nodes(m, mnt.nodes)},
        "mergerfs": {name for u in m.mergerfs for name in select_nodes(m, u.nodes)},
        "scratch": {n.name for n in m.nodes if scratch.scratch_disks(n)},
    }


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
        layout = zfs.pool_layout(pool)
        out.append(
            {
                "name": pool.name,
                "purpose": pool.purpose,
                "force": pool.force,
                "create_args": zfs.create_args(pool),
                "layout": layout.to_dict(),
                "summary": layout.summary(),
                "disks": layout.disks(),
                "properties": {k: zfs.property_text(v) for k, v in sorted(pool.properties.items())},
                "datasets": [
                    {
                        "name": f"{pool.name}/{ds.name}",
                        "properties": {k: zfs.property_text(v) for k, v in sorted(ds.properties.items())},
                    }
                    for ds in pool.datasets
                ],
            }
        )
    return out


def storage_groups(m: Manifest, node: Node) -> list[str]:
    """zfs / nfs_server / nfs_client / mergerfs membership of one node."""
    groups: list[str] = []
    if any(p.node == node.name for p in m.zfs.pools):
        groups.append("zfs")
    if nfs.exports_for(m, node):
        groups.append("nfs_server")
    if nfs.mounts_for(m, node):
        groups.append("nfs_client")
    if mergerfs.unions_for(m, node):
        groups.append("mergerfs")
    return groups


REPLICATION_KEY_FILE = "{{ provision_state_dir }}/secrets/" + KEY_NAME


def zfs_replication_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """What the node sends (``zfs_replications``, with the timer's calendar) and receives
    (``zfs_replicas``, the sources' addresses): {} on a node that does neither, so that its
    fingerprint stays what it was before replication existed."""
    reps = zfs.replications(m)
    sends = [r for r in reps if r.node == node.name]
    receives = [r for r in reps if r.to == node.name]
    out: dict[str, Any] = {}
    if sends:
        kept = [f for f in snapshots.PERIODS if any(r.policy.get(f, 0) > 0 for r in sends)]
        out["zfs_replications"] = [r.to_vars() for r in sends]
        out["zfs_replication_calendar"] = replicate.calendar(kept[0] if kept else "daily")
    if receives:
        out["zfs_replicas"] = {r.target: {"parent": r.target.rsplit("/", 1)[0], "policy": dict(r.policy)}
                               for r in receives}
        out["zfs_replica_sources"] = sorted({r.origin for r in receives})
    if out:
        out["zfs_replication_key_file"] = REPLICATION_KEY_FILE
    return out


def zfs_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    return {
        "zfs_pools": zfs_pool_vars(m, node),
        "zfs_arc_max_bytes": zfs.arc_max_bytes(node.hardware.memory_gb, m.zfs.arc_max_percent),
        "zfs_snapshots": {ds: policy for pool in m.zfs.pools if pool.node == node.name
                          for ds, policy in zfs.snapshot_policies(pool).items()},
        **zfs_replication_vars(m, node),
    }


# --------------------------------------------------------------------------- nfs
def nfs_server_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    exports = nfs.exports_for(m, node)
    mounts = [mnt for exp in exports for mnt in nfs.mounts_of_export(m, exp)]
    rdma = False
    for mnt in mounts:
        for client_name in select_nodes(m, mnt.nodes):
            if nfs.mount_proto(m, mnt, m.node(client_name)) == "rdma":
                rdma = True
    return {
        "nfs_server_exports": [
            {
                "name": exp.name,
                "path": nfs.export_path(m, exp),
                "clients": nfs.export_clients(m, exp),
                "options": nfs.export_options(exp),
                # a dataset's mountpoint comes from ZFS; only plain paths are created
                "create_path": exp.dataset is None,
            }
            for exp in exports
        ],
        "nfs_server_threads": nfs.nfsd_threads(node.hardware.cpu.cores, m.nfs.threads),
        "nfs_server_vers3": any(mnt.vers == "3" for mnt in mounts),
        "nfs_server_rdma": rdma,
    }


def nfs_client_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    nfs.check_one_path_per_server(m, node)
    mounts: list[dict[str, Any]] = []
    for mnt in nfs.mounts_for(m, node):
        export = nfs.export_by_name(m, mnt.export)
        proto = nfs.mount_proto(m, mnt, node)
        mounts.append(
            {
                "export": export.name,
                "what": f"{nfs.server_address(m, export, node, proto)}:{nfs.export_path(m, export)}",
                "where": mnt.path,
                "unit": units.mount_unit(mnt.path),
                "automount": mnt.automount,
                "automount_unit": units.automount_unit(mnt.path),
                "proto": proto,
                "options": nfs.mount_options(mnt, proto),
            }
        )
    return {
        "nfs_client_mounts": mounts,
        "nfs_client_rdma": any(x["proto"] == "rdma" for x in mounts),
    }


# --------------------------------------------------------------------------- mergerfs
def mergerfs_node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    unions: list[dict[str, Any]] = []
    for union in mergerfs.unions_for(m, node):
        requires = mergerfs.union_mount_units(m, union, node)
        unions.append(
            {
                "path": union.path,
                "unit": units.mount_unit(union.path),
                "branches": list(union.branches),
                "options": mergerfs.mergerfs_options(union, network=bool(requires)),
                "requires": requires,
            }
        )
    return {"mergerfs_unions": unions}


# --------------------------------------------------------------------------- contract
def cluster_vars(m: Manifest) -> dict[str, Any]:
    return {"zfs_scrub": m.zfs.scrub}


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    groups = storage_groups(m, node)
    out: dict[str, Any] = scratch_node_vars(node)
    if "zfs" in groups:
        out |= zfs_node_vars(m, node)
    if "nfs_server" in groups:
        out |= nfs_server_node_vars(m, node)
    if "nfs_client" in groups:
        out |= nfs_client_node_vars(m, node)
    if "mergerfs" in groups:
        out |= mergerfs_node_vars(m, node)
    return out
