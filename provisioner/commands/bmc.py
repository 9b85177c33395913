"""`provision bmc MANIFEST ACTION`: BMC power and boot control over the manifest's nodes.

Every action but ``status`` changes a machine (power, or what it boots next), so it follows
apply's intent rule: the nodes are listed and confirmed on a terminal, ``--yes`` skips the
question, and without a terminal it is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from provisioner.bmc import bmc_power, bmc_pxe, bmc_status
from provisioner.bmc.ops import BmcRow
from provisioner.commands.common import guarded, limit, load
from provisioner.display import bmc_table
from provisioner.errors import ProvisionError
from provisioner.manifest.nodes import Node

CHANGES = {
    "on": "power on",
    "off": "power OFF (a hard power-off: running jobs and unsaved data are lost)",
    "cycle": "power CYCLE (a hard restart: running jobs and unsaved data are lost)",
    "pxe": "boot from the network (PXE) at their next boot",
    "disk": "boot from their disk at their next boot",
}


def confirm_change(out: Console, action: str, nodes: list[Node], yes: bool) -> None:
    """List the nodes and the change before touching a BMC; ask unless ``yes``."""
    out.print(f"bmc {action}: {CHANGES[action]}:", markup=False, highlight=False,
              style="bold red" if action in ("off", "cycle") else "bold")
    for node in nodes:
        where = f"{node.bmc.type} {node.bmc.address}" if node.bmc is not None else "no BMC in the manifest"
        out.print(f"  {node.name} ({where})", markup=False, highlight=False)
    if yes:
        return
    if not sys.stdin.isatty():
        raise ProvisionError(f"refusing bmc {action} without confirmation: stdin is not a terminal; pass --yes")
    answer = out.input(f"{action} {len(nodes)} node(s)? [y/N] ", markup=False).strip().lower()
    if answer not in ("y", "yes"):
        raise ProvisionError("aborted: no BMC was touched")


def row_json(row: BmcRow) -> dict[str, Any]:
    """A node's row with null for what is unknown or missing (the table's "-")."""
    return {"node": row.node, "bmc": None if row.type == "-" else row.type,
            "address": None if row.address == "-" else row.address, "ok": row.ok,
            "power": None if row.power in (None, "unknown") else row.power, "next_boot": row.boot,
            "error": None if row.ok else row.message, "warnings": list(row.warnings)}


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """``--json``: the rows as a list on stdout (the confirmation on stderr)."""
    if args.json:
        out = err
    loaded = load(err, args.manifest)
    names = limit(loaded, args.limit)
    nodes = [n for n in loaded.manifest.nodes if names is None or n.name in names]
    if args.action == "status":
        rows = bmc_status(nodes)
    else:
        confirm_change(out, args.action, nodes, args.yes)
        if args.action in ("on", "off", "cycle"):
            rows = bmc_power(nodes, args.action, wait=not args.no_wait)
        else:
            rows = bmc_pxe(nodes, target=args.action)
    if args.json:
        print(json.dumps([row_json(r) for r in rows], indent=2))
    else:
        out.print(bmc_table(rows, f"bmc {args.action}"))
    return 0 if all(r.ok for r in rows) else 1


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
