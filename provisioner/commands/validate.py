"""`provision validate MANIFEST`: check a manifest and report every problem with file:line."""

from __future__ import annotations

import argparse

from rich.console import Console

from provisioner.commands.common import guarded, load
from provisioner.manifest.model import Node


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    m = loaded.manifest
    gpus = sum(n.gpu_count for n in m.nodes)
    summary = node_summary(m.nodes)
    out.print(
        f"{args.manifest}: OK: cluster {m.cluster.name}, {len(m.nodes)} nodes ({summary}), {gpus} GPUs, "
        f"{len(m.zfs.pools)} ZFS pools, {len(m.nfs.exports)} NFS exports"
        + (f", {len(loaded.warnings)} warnings" if loaded.warnings else ""),
        highlight=False,
    )
    return 0


def node_summary(nodes: list[Node]) -> str:
    """Nodes counted once each, by their combination of roles: ``1 head+storage, 4 compute``
    (counting per role would count a node with two roles twice)."""
    kinds: dict[str, int] = {}
    for n in nodes:
        kind = "+".join(n.roles)
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{count} {kind}" for kind, count in kinds.items())


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
