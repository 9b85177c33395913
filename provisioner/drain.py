"""Draining and resuming nodes in Slurm on the controller, each command bounded.

Pure apart from the injected ``Execute`` (provisioner/verify/remote.py over SSH in the
commands, fakes in the tests): ``provision drain``/``resume`` and ``provision remove``.
Jobs are never killed: a drain waits for them, at most its timeout.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.nodecheck.check import Output
from provisioner.verify.run import Execute

COMMAND_TIMEOUT = 15  # seconds per scontrol/squeue call
POLL = 5.0  # seconds between looks at a draining node's jobs


def show_command(node: str) -> str:
    return f"scontrol show node {shlex.quote(node)} --oneliner"


def drain_command(node: str, reason: str) -> str:
    return f"scontrol update NodeName={shlex.quote(node)} State=DRAIN Reason={shlex.quote(reason)}"


def jobs_command(node: str) -> str:
    return f"squeue --noheader --nodelist={shlex.quote(node)} --format=%i"


def parse_jobs(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def why_failed(out: Output) -> str:
    """A failed command's reason in one line: the transport's error, else its last line."""
    if out.error:
        return out.error
    lines = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {out.rc}"


@dataclass(frozen=True)
class Drained:
    node: str
    ok: bool
    detail: str


def drain_node(head: str, node: str, execute: Execute, timeout_s: float, reason: str,
               sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Drained:
    """Drain ``node`` on the controller ``head`` and wait until it runs no job, at most
    ``timeout_s`` (0: do not wait). A node Slurm does not know needs no drain. Jobs are never killed: on
    timeout the node stays drained and the caller stops."""
    shown = execute(head, show_command(node), COMMAND_TIMEOUT)
    if not shown.error and shown.rc != 0 and "not found" in (shown.stdout + shown.stderr):
        return Drained(node, True, "not in Slurm: nothing to drain")
    if shown.error or shown.rc != 0:
        return Drained(node, False, f"scontrol on {head}: {why_failed(shown)}")
    drained = execute(head, drain_command(node, reason), COMMAND_TIMEOUT)
    if drained.error or drained.rc != 0:
        return Drained(node, False, f"drain on {head}: {why_failed(drained)}")
    deadline = clock() + timeout_s
    while True:
        jobs = execute(head, jobs_command(node), COMMAND_TIMEOUT)
        if jobs.error or jobs.rc != 0:
            return Drained(node, False, f"squeue on {head}: {why_failed(jobs)}")
        running = parse_jobs(jobs.stdout)
        if not running:
            return Drained(node, True, "drained, no jobs")
        if timeout_s <= 0:  # asked not to wait: drained, its jobs run on to their end
            return Drained(node, True, f"drained; jobs {', '.join(running)} run on (not waited for)")
        if clock() >= deadline:
            return Drained(node, False, f"still running jobs {', '.join(running)} after {timeout_s:g} s; the node "
                                        "stays drained (no job was killed)")
        sleep(POLL)


def parse_reason(text: str) -> str:
    """The Reason of ``scontrol show node NAME --oneliner`` ("" when none), without the
    ``[user@time]`` Slurm appends."""
    found = re.search(r"\bReason=(.*?)(?= [A-Za-z]+=|$)", text.strip())
    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", found.group(1)) if found else ""


def node_reason(head: str, node: str, execute: Execute) -> tuple[str, str]:
    """(the node's drain reason, "") or ("", why it could not be read)."""
    shown = execute(head, show_command(node), COMMAND_TIMEOUT)
    if shown.error or shown.rc != 0:
        return "", f"scontrol on {head}: {why_failed(shown)}"
    return parse_reason(shown.stdout), ""


def resume_command(node: str) -> str:
    return f"scontrol update NodeName={shlex.quote(node)} State=RESUME"


def resume_node(head: str, node: str, execute: Execute) -> Drained:
    """Resume ``node`` (a node that is not drained is left as it is: scontrol says so)."""
    out = execute(head, resume_command(node), COMMAND_TIMEOUT)
    if out.error or out.rc != 0:
        why = why_failed(out)
        if "Invalid node state transition" in why:
            return Drained(node, True, "not drained: left as it is")
        return Drained(node, False, f"resume on {head}: {why}")
    return Drained(node, True, "resumed")
