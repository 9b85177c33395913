"""`provision bmc MANIFEST ACTION`: BMC power and boot control over the manifest's nodes."""

from __future__ import annotations

import argparse

from rich.console import Console

from provisioner.bmc import bmc_power, bmc_pxe, bmc_status
from provisioner.commands.common import guarded, limit, load
from provisioner.display import bmc_table


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    names = limit(loaded, args.limit)
    nodes = [n for n in loaded.manifest.nodes if names is None or n.name in names]
    if args.action == "status":
        rows = bmc_status(nodes)
    elif args.action in ("on", "off", "cycle"):
        rows = bmc_power(nodes, args.action, wait=not args.no_wait)
    else:
        rows = bmc_pxe(nodes, target=args.action)
    out.print(bmc_table(rows, f"bmc {args.action}"))
    return 0 if all(r.ok for r in rows) else 1


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
