"""`provision remove MANIFEST NODES`: take nodes the manifest no longer lists out of the cluster."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

from provisioner.apply import ApplyOptions, Ran, apply, mark_removed
from provisioner.commands.common import guarded, load, split_selectors
from provisioner.drain import Drained, drain_node
from provisioner.errors import ProvisionError
from provisioner.interrupts import Interrupted
from provisioner.manifest.ranges import RangeError, expand_all
from provisioner.remove import DRAIN_REASON, removal_problems
from provisioner.state import StateDir
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor


def confirm(console: Console, nodes: list[str], yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise ProvisionError("refusing to remove without confirmation: stdin is not a terminal; pass --yes")
    answer = console.input(f"Remove {', '.join(nodes)} from the cluster? [y/N] ", markup=False).strip().lower()
    if answer not in ("y", "yes"):
        raise ProvisionError("aborted: nothing was changed")


def removal_names(text: str) -> list[str]:
    """NODES of remove: names and ranges (gpu[03-04]), comma-separated, as every verb takes
    them. ``@role`` selects nodes of the manifest, and the nodes to remove are not in it."""
    items = [t.strip() for t in split_selectors(text) if t.strip()]
    if not items:
        raise ProvisionError("NODES: no nodes given")
    roles = [t for t in items if t.startswith("@")]
    if roles:
        raise ProvisionError(f"NODES: {roles[0]} selects nodes by their role in the manifest, and the nodes to "
                             "remove are no longer in it: name them (names, ranges)")
    try:
        return list(dict.fromkeys(expand_all(items)))
    except RangeError as exc:
        raise ProvisionError(f"NODES: {exc}") from None


def report(cluster: str, nodes: list[str], drained: dict[str, Drained] | None, ran: list[Ran],
           removed: bool) -> dict[str, Any]:
    """``--json``: what remove did (docs/operations.md, "Output"); ``drained`` None: no Slurm."""
    return {"ok": removed, "cluster": cluster,
            "nodes": [{"node": n, "removed": removed,
                       "drain": None if drained is None or n not in drained else
                       {"ok": drained[n].ok, "detail": drained[n].detail}} for n in nodes],
            "run": ran[-1].to_json() if ran else None}


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """With ``--json`` the messages go to stderr and stdout carries one JSON object, once
    the apply ran (a refusal or a failed drain stops before: no JSON, the error on stderr)."""
    with children_end_with_the_command():  # a signal ends the drain's ssh first
        return _run(args, err if args.json else out, err)


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    m = loaded.manifest
    state = StateDir.beside(args.manifest, args.state_dir)
    nodes = removal_names(args.nodes)
    problems = removal_problems(m, state.load_for(m.cluster.name), nodes)
    if problems:
        raise ProvisionError("nothing was changed: " + "; ".join(problems))
    slurm = f"drained in Slurm on {m.head.name}, then " if m.slurm.enabled else ""
    out.print(f"remove {', '.join(nodes)}: {slurm}/etc/hosts, slurm.conf, exports and mounts render without "
              f"{'them' if len(nodes) > 1 else 'it'} on the remaining nodes (apply); the removed nodes are not "
              "contacted and nothing on their disks changes", highlight=False, markup=False)
    confirm(out, nodes, args.yes)
    drains: dict[str, Drained] | None = None
    if m.slurm.enabled:
        drains = {}
        state.ensure()  # known_hosts
        head = m.head
        execute = ssh_executor(node_targets(m, [head.name]), state.known_hosts, grace=5)
        for node in nodes:
            drained = drains[node] = drain_node(head.name, node, execute, args.drain_timeout, DRAIN_REASON)
            out.print(f"{node}: {drained.detail}", highlight=False, markup=False, style=None if drained.ok else "red")
            if not drained.ok:
                raise ProvisionError(f"{node} could not be drained; the cluster's files were not changed")
    ran: list[Ran] = []
    rc = apply(loaded, state, ApplyOptions(yes=True, strategy=args.strategy), out, ran)
    if rc != 0:
        err.print(f"apply failed: {', '.join(nodes)} stay listed until it succeeds; fix the cause and run remove "
                  "again", style="red", highlight=False, markup=False)
        if args.json:
            print(json.dumps(report(m.cluster.name, nodes, drains, ran, removed=False), indent=2))
        return rc
    try:
        with state.lock("remove"):
            st = state.load_for(m.cluster.name)
            for node in nodes:
                mark_removed(st, node)
            state.save(st)
    except Interrupted:
        raise
    except ProvisionError as exc:  # a full disk, a read-only state: the apply is done, the record is not
        raise ProvisionError(f"{exc}; apply rendered the cluster's files without {', '.join(nodes)}, but the state "
                             "still lists them: run remove again once the state can be written") from None
    out.print(f"removed: {', '.join(nodes)}", highlight=False, markup=False)
    if args.json:
        print(json.dumps(report(m.cluster.name, nodes, drains, ran, removed=True), indent=2))
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
