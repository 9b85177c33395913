"""`provision status MANIFEST`: one table of nodes from the state and a quick live probe."""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provisioner.commands.common import guarded, limit, load
from provisioner.manifest.model import Manifest
from provisioner.manifest.ranges import listed
from provisioner.state import StateDir
from provisioner.status import (
    NODE_PROBE,
    PROBE_COMMAND_TIMEOUT,
    PROBE_TIMEOUT,
    SLURM_PROBE,
    NodeProbe,
    Row,
    gpus_text,
    parse_node_probe,
    parse_sinfo,
    pending_run,
    reach_text,
    rows,
    slurm_text,
)
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor
from provisioner.verify.run import Execute

MAX_PARALLEL = 32


def table(found: list[Row], m: Manifest, slurm_asked: bool) -> Table:
    t = Table(title=f"status {m.cluster.name}", title_justify="left")
    for col in ("node", "lifecycle", "last apply", "result", "reach", "slurm", "GPUs"):
        t.add_column(col, overflow="fold")
    in_manifest = set(m.node_names())
    for r in found:
        reach = reach_text(r)
        slurm_node = r.node in in_manifest and m.slurm.enabled and m.node(r.node).has_role("compute")
        t.add_row(r.node, r.lifecycle, r.applied_at or "-", r.last_result or "-",
                  f"[red]{escape(reach)}[/]" if r.probe_failed else escape(reach),
                  escape(slurm_text(r, slurm_asked, slurm_node)), gpus_text(r))
    return t


def probe(m: Manifest, names: list[str], execute: Execute) -> tuple[dict[str, NodeProbe], dict[str, str] | None, str]:
    """The live probe, bounded per node: each node's uptime and GPUs, and sinfo on the
    controller when Slurm is on. Returns (probes, Slurm states or None, why sinfo failed)."""
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(names) + 1)) as pool:
        sinfo = pool.submit(execute, m.head.name, SLURM_PROBE, PROBE_COMMAND_TIMEOUT) if m.slurm.enabled else None
        found = list(pool.map(lambda n: execute(n, NODE_PROBE, PROBE_COMMAND_TIMEOUT), names))
    probes = {n: parse_node_probe(o) for n, o in zip(names, found, strict=True)}
    if sinfo is None:
        return probes, None, ""
    answer = sinfo.result()
    if answer.error or answer.rc != 0:
        lines = [line for line in answer.stderr.splitlines() if line.strip()]
        return probes, None, f"sinfo on {m.head.name}: {answer.error or (lines[-1] if lines else f'exit {answer.rc}')}"
    return probes, parse_sinfo(answer.stdout), ""


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with children_end_with_the_command():  # a signal ends every ssh first
        return _run(args, out, err)


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    m = loaded.manifest
    state_dir = StateDir.beside(args.manifest, args.state_dir)
    state = state_dir.load_for(m.cluster.name)
    names = limit(loaded, args.limit) or m.node_names()
    probes: dict[str, NodeProbe] = {}
    slurm: dict[str, str] | None = None
    slurm_problem = ""
    if not args.no_probe:
        state_dir.ensure()  # known_hosts
        hosts = sorted(set(names) | ({m.head.name} if m.slurm.enabled else set()))
        execute = ssh_executor(node_targets(m, hosts), state_dir.known_hosts,
                               grace=PROBE_TIMEOUT - PROBE_COMMAND_TIMEOUT)
        probes, slurm, slurm_problem = probe(m, names, execute)
    run_ = pending_run(state)
    pending = None
    if run_ is not None:
        pending = (f"running (run {run_.id})" if state_dir.lock_held()
                   else f"interrupted (run {run_.id} ended without recording its result)")
    found = [r for r in rows(m, state, probes, slurm, pending, run_)
             if r.node in names or (args.limit is None and r.node not in m.node_names())]
    if args.json:
        print(json.dumps([r.to_json() for r in found], indent=2))
    else:
        out.print(table(found, m, m.slurm.enabled and not args.no_probe))
    down = [r.node for r in found if r.probe_failed]
    problems = ([slurm_problem] if slurm_problem else []) + (
        [f"{len(down)} of {len(names)} nodes could not be probed: {listed(down)}"] if down else [])
    for problem in problems:
        err.print(f"status: {problem}", style="red", highlight=False, markup=False)
    return 1 if problems else 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
