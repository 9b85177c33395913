"""`provision apply MANIFEST`: make the cluster match the manifest (provisioner.apply)."""

from __future__ import annotations

import argparse

from rich.console import Console

from provisioner.apply import ApplyOptions, apply
from provisioner.commands.common import guarded, limit, load
from provisioner.state import StateDir


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    opts = ApplyOptions(limit=limit(loaded, args.limit), check=args.check, yes=args.yes, full=args.full,
                        reinstall=limit(loaded, args.reinstall) or [], install_timeout=args.install_timeout,
                        stall_timeout=args.stall_timeout, strategy=args.strategy,
                        verbosity=args.verbose)
    return apply(loaded, StateDir.beside(args.manifest, args.state_dir), opts, out)


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
