"""The `provision` command: validate, inventory, plan, apply."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from provisioner import inventory
from provisioner.apply import ApplyOptions, apply, default_inventory_dir
from provisioner.display import print_diagnostics, print_plan
from provisioner.errors import ManifestError, ProvisionError
from provisioner.manifest import Loaded, SelectorError, load_manifest, select_nodes
from provisioner.plan import compute, load_plays
from provisioner.runner import DEFAULT_STALL_TIMEOUT, STRATEGIES, project_root
from provisioner.state import StateDir


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="provision", description="Turn one cluster manifest into a GPU cluster.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument("manifest", type=Path, help="the cluster manifest (YAML)")
        return sp

    add("validate", "check a manifest and report every problem with file:line")

    inv = add("inventory", "write the Ansible inventory generated from the manifest")
    inv.add_argument("--out", type=Path, help="output folder (default: inventory/<cluster>/)")

    plan = add("plan", "show what apply would change, per node")
    plan.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    plan.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--detailed-exitcode", action="store_true", help="exit 0: no changes, 1: error, 2: changes")
    plan.add_argument("--full", action="store_true", help="plan node-local plays on every node")

    ap = add("apply", "make the cluster match the manifest")
    ap.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    ap.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    ap.add_argument("--check", action="store_true", help="dry run: Ansible check mode, state not updated")
    ap.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    ap.add_argument("--full", action="store_true", help="run node-local plays on every node (drift repair)")
    ap.add_argument("--reinstall", metavar="NODES",
                    help="reinstall the OS on these nodes over BMC + PXE (wipes their install disks)")
    ap.add_argument("--install-timeout", type=float, metavar="SECONDS", default=None,
                    help="give up on a node's OS install after this long (default 5400)")
    ap.add_argument("--stall-timeout", type=_positive_int, metavar="SECONDS", default=DEFAULT_STALL_TIMEOUT,
                    help="fail a node whose current task has not finished after this long; the other nodes "
                         f"go on (default {DEFAULT_STALL_TIMEOUT}; long package and build steps have their own)")
    ap.add_argument("--strategy", choices=STRATEGIES, default=os.environ.get("PROVISION_STRATEGY", "linear"),
                    help="Ansible execution strategy: linear (Ansible's own) or mitogen (one persistent Python "
                         "per node: fewer round trips per task); default $PROVISION_STRATEGY or linear")

    bmc = add("bmc", "BMC power and boot control over the manifest's nodes")
    bmc.add_argument("action", choices=["status", "on", "off", "cycle", "pxe", "disk"],
                     help="status; power on/off/cycle; next boot (only) from pxe or disk")
    bmc.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    bmc.add_argument("--no-wait", action="store_true", help="do not wait for the power state to settle")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 second: {text!r}")
    return value


def _limit(loaded: Loaded, text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in _split_selectors(text) if t.strip()]
    if not items:  # an empty limit would run the light plays everywhere
        raise ProvisionError("--limit: no nodes given")
    try:
        return select_nodes(loaded.manifest, items)
    except SelectorError as exc:
        raise ProvisionError(f"--limit: {exc}") from None


def _split_selectors(text: str) -> list[str]:
    """Split on commas outside brackets: 'gpu[01-04],head' -> ['gpu[01-04]', 'head']."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def _load(console: Console, path: Path) -> Loaded:
    loaded = load_manifest(path)
    print_diagnostics(console, loaded.warnings)
    return loaded


def cmd_validate(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = _load(err, args.manifest)
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


def cmd_inventory(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = _load(err, args.manifest)
    target = args.out or default_inventory_dir(loaded.manifest.cluster.name)
    files = inventory.build(loaded.manifest, source=str(args.manifest))
    written = inventory.write(files, target)
    out.print(f"wrote {len(written)} files to {target}", highlight=False)
    return 0


def cmd_plan(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = _load(err, args.manifest)
    state_dir = StateDir.beside(args.manifest, args.state_dir)
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    plan = compute(loaded.manifest, state_dir.load(), plays, limit=_limit(loaded, args.limit), full=args.full)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print_plan(out, plan, loaded.manifest.cluster.name)
    if args.detailed_exitcode and plan.has_changes:
        return 2
    return 0


def cmd_apply(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = _load(err, args.manifest)
    opts = ApplyOptions(limit=_limit(loaded, args.limit), check=args.check, yes=args.yes, full=args.full,
                        reinstall=_limit(loaded, args.reinstall) or [], install_timeout=args.install_timeout,
                        stall_timeout=args.stall_timeout, strategy=args.strategy)
    return apply(loaded, StateDir.beside(args.manifest, args.state_dir), opts, out)


def cmd_bmc(args: argparse.Namespace, out: Console, err: Console) -> int:
    from provisioner.bmc import bmc_power, bmc_pxe, bmc_status
    from provisioner.display import bmc_table

    loaded = _load(err, args.manifest)
    names = _limit(loaded, args.limit)
    nodes = [n for n in loaded.manifest.nodes if names is None or n.name in names]
    if args.action == "status":
        rows = bmc_status(nodes)
    elif args.action in ("on", "off", "cycle"):
        rows = bmc_power(nodes, args.action, wait=not args.no_wait)
    else:
        rows = bmc_pxe(nodes, target=args.action)
    out.print(bmc_table(rows, f"bmc {args.action}"))
    return 0 if all(r.ok for r in rows) else 1


COMMANDS = {"validate": cmd_validate, "inventory": cmd_inventory, "plan": cmd_plan, "apply": cmd_apply,
            "bmc": cmd_bmc}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)
    try:
        return COMMANDS[args.command](args, out, err)
    except ManifestError as exc:
        print_diagnostics(err, exc.diagnostics)
        return 1
    except ProvisionError as exc:
        err.print(f"error: {exc}", style="red", markup=False, highlight=False)
        return 1
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        err.print("interrupted", style="red")
        return 130
    except Exception as exc:  # never a traceback for the operator, unless asked for
        if os.environ.get("PROVISION_DEBUG"):
            raise
        err.print(f"internal error: {type(exc).__name__}: {exc} (set PROVISION_DEBUG=1 for a traceback)",
                  style="red", markup=False, highlight=False)
        return 70


if __name__ == "__main__":
    sys.exit(main())
