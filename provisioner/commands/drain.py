"""`provision drain MANIFEST NODES` and `provision resume MANIFEST NODES`: Slurm on the controller."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from provisioner.commands.common import guarded, limit, load
from provisioner.drain import Drained, drain_node, node_reason, resume_node
from provisioner.errors import ProvisionError
from provisioner.gate import resume_refusal
from provisioner.manifest.ranges import listed
from provisioner.nodecheck.check import Output
from provisioner.state import StateDir
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor
from provisioner.verify.run import Execute


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with children_end_with_the_command():  # a signal ends every ssh first
        return _run(args, out, err)


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    m = loaded.manifest
    if not m.slurm.enabled:
        raise ProvisionError("slurm.enabled is false in the manifest: there is no Slurm to drain or resume nodes in")
    nodes = limit(loaded, args.nodes, "NODES") or []
    state = StateDir.beside(args.manifest, args.state_dir)
    state.load_for(m.cluster.name)  # refused when it is another cluster's
    state.ensure()  # known_hosts
    head = m.head
    lost: list[str] = []  # the first transport error: the controller was not reached or did not answer
    execute = watched(ssh_executor(node_targets(m, [head.name]), state.known_hosts, grace=5), lost)
    failed = []
    results = []
    untried: list[str] = []
    for node in nodes:
        if lost:  # every further node would wait for the same controller and fail the same way
            untried.append(node)
            results.append({"node": node, "ok": False, "detail": not_tried(head.name)})
            continue
        if args.command == "drain":
            done = drain_node(head.name, node, execute, args.wait, args.reason)
        else:
            done = resume(head.name, node, execute, args.force)
        results.append({"node": node, "ok": done.ok, "detail": done.detail})
        if not args.json:
            out.print(f"{node}: {done.detail}", highlight=False, markup=False, style=None if done.ok else "red")
        if not done.ok:
            failed.append(node)
    failed += untried
    if args.json:
        print(json.dumps(results, indent=2))
    elif untried:
        out.print(f"{listed(untried)}: {not_tried(head.name)}", highlight=False, markup=False, style="red")
    if failed:
        err.print(f"{args.command} failed on {listed(failed)}", style="red", highlight=False, markup=False)
        return 1
    return 0


def not_tried(head: str) -> str:
    return f"not tried: the controller {head} could not be reached or did not answer"


def watched(execute: Execute, lost: list[str]) -> Execute:
    """``execute`` that notes in ``lost`` each transport error (ssh did not reach the
    controller, or it did not answer in time), as distinct from scontrol's own refusals."""
    def run(host: str, text: str, timeout: int) -> Output:
        result = execute(host, text, timeout)
        if result.error:
            lost.append(result.error)
        return result
    return run


def resume(head: str, node: str, execute: Execute, force: bool) -> Drained:
    """Resume ``node``; without ``force``, not one the acceptance gate holds (its reason says so)."""
    if not force:
        reason, unread = node_reason(head, node, execute)
        if unread and "not found" not in unread:
            return Drained(node, False, f"cannot read its reason, so not resumed: {unread}")
        refusal = resume_refusal(node, reason)
        if refusal:
            return Drained(node, False, refusal)
    return resume_node(head, node, execute)


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
