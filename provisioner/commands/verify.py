"""`provision verify MANIFEST`: check the running cluster against the manifest (docs/verify.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from provisioner.commands.common import guarded, limit, load
from provisioner.errors import ProvisionError
from provisioner.manifest.model import Manifest
from provisioner.state import StateDir, atomic_write
from provisioner.verify import catalog, report
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor
from provisioner.verify.run import verify

JUNIT_MARK = '<testsuites name="provision verify '  # what report.junit writes first after the declaration


def check_junit_target(path: Path) -> None:
    """Refuse a --junit FILE that is not ours to write, before any node is contacted: its
    folder must exist (it is not created), and an existing file is replaced only when it is
    an earlier report of provision verify (never the manifest, or any other file)."""
    if not path.parent.is_dir():
        raise ProvisionError(f"--junit {path}: no folder {path.parent}; create it first")
    if path.is_dir():
        raise ProvisionError(f"--junit {path}: is a directory")
    if path.exists():
        try:
            with path.open("rb") as fh:
                head = fh.read(512).decode("utf-8", errors="replace")
        except OSError as exc:
            raise ProvisionError(f"--junit {path}: {exc.strerror or exc}") from None
        if JUNIT_MARK not in head:
            raise ProvisionError(f"--junit {path}: the file exists and is not a report of provision verify; "
                                 "refusing to overwrite it (remove it, or name another file)")


def with_options(m: Manifest, seconds: int | None, level: int | None = None) -> Manifest:
    """``m`` with ``--burn-in SECONDS`` in place of its verify.burn_in_s and ``--level N`` in
    place of its verify.dcgm_level (unchanged without)."""
    update: dict[str, int] = {}
    if seconds:
        update["burn_in_s"] = seconds
    if level:
        update["dcgm_level"] = level
    if not update:
        return m
    return m.model_copy(update={"verify": m.verify.model_copy(update=update)})


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with children_end_with_the_command():  # a signal ends every ssh first
        return _run(args, out, err)


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.junit is not None:
        check_junit_target(args.junit)
    loaded = load(err, args.manifest)
    m = loaded.manifest
    state = StateDir.beside(args.manifest, args.state_dir)
    state.load_for(m.cluster.name)  # refused when it is another cluster's
    state.ensure()  # known_hosts: first contact is recorded as apply records it
    names = limit(loaded, args.limit) or m.node_names()
    checks = catalog.plan(with_options(m, getattr(args, "burn_in", None), getattr(args, "level", None)), names)
    hosts = sorted(set(names) | {c.command.host for c in checks if c.command} |
                   {c.command.setup[0] for c in checks if c.command and c.command.setup})
    execute = ssh_executor(node_targets(m, hosts), state.known_hosts)
    results = verify(checks, names, execute, m.verify.command_timeout)
    if args.junit is not None:
        try:
            atomic_write(args.junit, report.junit(results, m.cluster.name))
        except OSError as exc:
            raise ProvisionError(f"--junit {args.junit}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(report.to_json(results), indent=2))
    else:
        report.print_results(out, results, m.cluster.name)
    return report.exit_code(results)


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
