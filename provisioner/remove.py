"""`provision remove`: what may be removed, and draining it in Slurm first.

The manifest stays the one truth: a node is removed by deleting it from the manifest and
then running ``provision remove MANIFEST NODE``, which drains it in Slurm (waiting for its
jobs, bounded), runs apply so that /etc/hosts, slurm.conf, exports and mounts render
without it on the remaining nodes, and records it ``removed``. The node itself is never
contacted, so nothing on its disks changes. The decisions and the drain loop are here
(the commands run through an injected ``Execute``); provisioner/commands/remove.py is the
edge.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.manifest.model import Manifest
from provisioner.state import State
from provisioner.verify.catalog import Output
from provisioner.verify.run import Execute

DRAIN_REASON = "provision remove"
COMMAND_TIMEOUT = 15  # seconds per scontrol/squeue call
POLL = 5.0  # seconds between looks at a draining node's jobs


def removal_problems(m: Manifest, state: State, nodes: list[str]) -> list[str]:
    """Why ``nodes`` cannot be removed (empty: they can)."""
    problems = []
    in_manifest = set(m.node_names())
    for name in nodes:
        ns = state.nodes.get(name)
        if name in in_manifest:
            problems.append(f"{name} is still in the manifest: delete it there first (the cluster's files render "
                            "from the manifest; remove then renders them without it)")
        elif ns is None:
            known = sorted(n for n, s in state.nodes.items() if n not in in_manifest and s.lifecycle != "removed")
            problems.append(f"{name} is not in the state: nothing to remove"
                            + (f" (nodes the manifest no longer lists: {', '.join(known)})" if known else ""))
        elif ns.lifecycle == "removed":
            problems.append(f"{name} was removed already ({ns.removed_at})")
    return problems


def show_command(node: str) -> str:
    return f"scontrol show node {shlex.quote(node)} --oneliner"


def drain_command(node: str, reason: str = DRAIN_REASON) -> str:
    return f"scontrol update NodeName={shlex.quote(node)} State=DRAIN Reason={shlex.quote(reason)}"


def jobs_command(node: str) -> str:
    return f"squeue --noheader --nodelist={shlex.quote(node)} --format=%i"


def parse_jobs(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _why(out: Output) -> str:
    if out.error:
        return out.error
    lines = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {out.rc}"


@dataclass(frozen=True)
class Drained:
    node: str
    ok: bool
    detail: str


def drain_node(head: str, node: str, execute: Execute, timeout_s: float,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Drained:
    """Drain ``node`` on the controller ``head`` and wait until it runs no job, at most
    ``timeout_s``. A node Slurm does not know needs no drain. Jobs are never killed: on
    timeout the node stays drained and the caller stops."""
    shown = execute(head, show_command(node), COMMAND_TIMEOUT)
    if not shown.error and shown.rc != 0 and "not found" in (shown.stdout + shown.stderr):
        return Drained(node, True, "not in Slurm: nothing to drain")
    if shown.error or shown.rc != 0:
        return Drained(node, False, f"scontrol on {head}: {_why(shown)}")
    drained = execute(head, drain_command(node), COMMAND_TIMEOUT)
    if drained.error or drained.rc != 0:
        return Drained(node, False, f"drain on {head}: {_why(drained)}")
    deadline = clock() + timeout_s
    while True:
        jobs = execute(head, jobs_command(node), COMMAND_TIMEOUT)
        if jobs.error or jobs.rc != 0:
            return Drained(node, False, f"squeue on {head}: {_why(jobs)}")
        running = parse_jobs(jobs.stdout)
        if not running:
            return Drained(node, True, "drained, no jobs")
        if clock() >= deadline:
            return Drained(node, False, f"still running jobs {', '.join(running)} after {timeout_s:g} s; the node "
                                        "stays drained (no job was killed)")
        sleep(POLL)
