"""`provision report usage MANIFEST`: GPU-hours held and used, idle share, energy and cost, per
user, account, partition or node (docs/usage.md). Slurm's accounting over SSH on the
controller, Prometheus over HTTP; the joins and arithmetic are the monitoring area's, reached
through the registry."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from rich.console import Console

from provisioner.areas import registry
from provisioner.commands.common import guarded, load
from provisioner.drain import why_failed
from provisioner.errors import ProvisionError
from provisioner.prometheus import query_range
from provisioner.state import StateDir, atomic_write
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor

SACCT_TIMEOUT = 120  # seconds for sacct on the controller
QUERY_TIMEOUT = 60  # seconds per Prometheus range query


def check_html_target(path: Path) -> None:
    """--html FILE: its folder must exist; an existing file is replaced only when it is an
    earlier report (never the manifest or any other file)."""
    if not path.parent.is_dir():
        raise ProvisionError(f"--html {path}: no folder {path.parent}; create it first")
    if path.is_dir():
        raise ProvisionError(f"--html {path}: is a directory")
    if path.exists():
        try:
            head = path.read_bytes()[:1024].decode("utf-8", errors="replace")
        except OSError as exc:
            raise ProvisionError(f"--html {path}: {exc.strerror or exc}") from None
        if "<title>GPU usage of " not in head:
            raise ProvisionError(f"--html {path}: the file exists and is not a usage report; refusing to "
                                 "overwrite it (remove it, or name another file)")


def write_html(path: Path, page: str) -> None:
    """The whole report or nothing: an earlier one at ``path`` stays as it was when the disk
    is full or read-only, and the error names the option and the file, as --junit's does."""
    try:
        atomic_write(path, page)
    except OSError as exc:
        raise ProvisionError(f"--html {path}: {exc.strerror or exc}") from None


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with children_end_with_the_command():  # a signal ends the ssh first
        return _run(args, out, err)


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.html is not None:
        check_html_target(args.html)
    usage = registry.usage_report()
    now = time.time()
    win = usage.window(args.since, args.until, now)
    loaded = load(err, args.manifest)
    m = loaded.manifest
    if not m.slurm.enabled:
        raise ProvisionError("slurm.enabled is false in the manifest: there is no Slurm accounting to report from")
    if not m.slurm.accounting:
        raise ProvisionError("slurm.accounting is false in the manifest: the report reads the GPUs jobs held from "
                             "Slurm's accounting (slurmdbd); set it and apply")
    state = StateDir.beside(args.manifest, args.state_dir)
    state.load_for(m.cluster.name)  # refused when it is another cluster's
    state.ensure()  # known_hosts
    head = usage.controller(m)
    execute = ssh_executor(node_targets(m, [head.name]), state.known_hosts, grace=5)

    def run_sacct(command: str) -> str:
        result = execute(head.name, command, SACCT_TIMEOUT)
        if result.error or result.rc != 0:
            raise ProvisionError(f"sacct on {head.name}: {why_failed(result)}")
        return result.stdout

    url = args.prometheus or usage.prometheus_url(m)
    query = query_range(url, QUERY_TIMEOUT) if url else None
    report = usage.gather(m, win, args.by, now, run_sacct, query, url or "", args.top)
    report = dataclasses.replace(report, sources={"slurm": f"sacct on {head.name}", "prometheus": url or "none"})
    if args.html is not None:
        write_html(args.html, usage.render["html"](report))
    kind = "json" if args.json else "csv" if args.csv else "table"
    print(usage.render[kind](report), end="")
    if kind == "csv" and report.notes:  # CSV stays machine-readable: the notes go to stderr
        for note in report.notes:
            err.print(f"note: {note}", style="yellow", markup=False, highlight=False)
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
