"""`provision validate MANIFEST`: check a manifest and report every problem with file:line."""

from __future__ import annotations

import argparse

from rich.console import Console

from provisioner.commands.common import guarded, load


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    m = loaded.manifest
    roles: dict[str, int] = {}
    for n in m.nodes:
        for r in n.roles:
            roles[r] = roles.get(r, 0) + 1
    gpus = sum(n.gpu_count for n in m.nodes)
    summary = ", ".join(f"{v} {k}" for k, v in roles.items())
    out.print(
        f"{args.manifest}: OK: cluster {m.cluster.name}, {len(m.nodes)} nodes ({summary}), {gpus} GPUs, "
        f"{len(m.zfs.pools)} ZFS pools, {len(m.nfs.exports)} NFS exports"
        + (f", {len(loaded.warnings)} warnings" if loaded.warnings else ""),
        highlight=False,
    )
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
