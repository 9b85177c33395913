"""What ``provision plan`` reads from running services (the areas' :class:`LiveDrift`, e.g.
slurmdbd's accounts, associations and QOS): the drift apply's reconcile would remove there,
which no fingerprint of the nodes shows (someone ran ``sacctmgr`` by hand). And what apply
reads on a node before it runs anything (the areas' :class:`DiskRead`, e.g. the disks a new
scratch volume or pool would take): a role's refusal, made before any play.

The commands are read-only and bounded; the transport is given (``execute``: verify's SSH
executor in the command, a fake in tests). A service that cannot be read is said so, with
the reason, and changes nothing else in the plan."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from provisioner.areas import registry
from provisioner.drain import why_failed
from provisioner.manifest.model import Manifest
from provisioner.state import State, StateDir
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor
from provisioner.verify.run import Execute

COMMAND_TIMEOUT = 30  # seconds per read-only command on the service's node
MAX_PARALLEL = 16  # nodes read at once
# The node runs a read's commands itself, in one SSH round trip: each with its own bound,
# none through a shell, a missing command as a shell would say it (127).
_RUN_EACH = (
    "import json,os,subprocess,sys\n"
    "env=dict(os.environ,LC_ALL='C',PATH='/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')\n"
    "out=[]\n"
    "for a in json.loads(sys.argv[1]):\n"
    "    try:\n"
    "        r=subprocess.run(a,capture_output=True,text=True,timeout=int(sys.argv[2]),env=env)\n"
    "        out.append([r.returncode,r.stdout])\n"
    "    except FileNotFoundError:\n"
    "        out.append([127,''])\n"
    "    except subprocess.TimeoutExpired:\n"
    "        out.append([124,''])\n"
    "print(json.dumps(out))\n"
)
PENDING_KINDS = frozenset({"add", "change", "remove"})  # what apply would do ("kept": it would not)


@dataclass(frozen=True)
class LiveRead:
    """One service's drift as read: its changes, or why it was not read (``error``)."""

    service: str
    node: str
    changes: list[tuple[str, str]] = field(default_factory=list)  # (kind, line)
    error: str = ""

    @property
    def pending(self) -> int:
        """Changes apply would make."""
        return sum(1 for kind, _ in self.changes if kind in PENDING_KINDS)

    def to_json(self) -> dict[str, Any]:
        return {"service": self.service, "node": self.node, "read": not self.error, "error": self.error or None,
                "changes": [{"kind": kind, "line": line} for kind, line in self.changes]}


def read(m: Manifest, state: State, execute: Execute) -> list[LiveRead]:
    """Every wanted service's drift, read on its node once that node is configured."""
    out: list[LiveRead] = []
    for live in registry.live_drifts(m):
        node = live.node(m).name
        recorded = state.nodes.get(node)
        if recorded is None or recorded.lifecycle != "configured":
            out.append(LiveRead(live.name, node, error=f"{node} is not configured yet: apply sets {live.name} up"))
            continue
        texts: list[str] = []
        for argv in live.commands(m):
            result = execute(node, shlex.join(argv), COMMAND_TIMEOUT)
            if result.error or result.rc != 0:
                out.append(LiveRead(live.name, node, error=f"{argv[0]} on {node}: {why_failed(result)}"))
                break
            texts.append(result.stdout)
        else:
            try:
                out.append(LiveRead(live.name, node, live.changes(m, texts)))
            except ValueError as exc:  # output the parsers do not know
                out.append(LiveRead(live.name, node, error=f"{live.name} on {node}: {exc}"))
    return out


def over_ssh(m: Manifest, state: State, state_dir: StateDir) -> list[LiveRead]:
    """:func:`read` over SSH, as verify reaches nodes (no SSH at all when the manifest has no
    such service); a signal ends the ssh at once."""
    services = registry.live_drifts(m)
    if not services:
        return []
    targets = node_targets(m, {s.node(m).name for s in services})
    with children_end_with_the_command():
        return read(m, state, ssh_executor(targets, state_dir.known_hosts, grace=5))


@dataclass(frozen=True)
class DiskVerdict:
    """One node's read before an apply: why the apply may not go on (``refused``, lines),
    what was left to the roles (``notes``), or why the node was not read (``error``)."""

    node: str
    refused: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str = ""


def run_each(execute: Execute, node: str, argvs: Sequence[tuple[str, ...]]
             ) -> tuple[dict[tuple[str, ...], tuple[int, str]], str]:
    """Run read-only ``argvs`` on ``node`` in one round trip: (each one's exit status and
    output, "") or ({}, why they were not run)."""
    text = shlex.join(["python3", "-c", _RUN_EACH, json.dumps([list(a) for a in argvs]), str(COMMAND_TIMEOUT)])
    result = execute(node, text, COMMAND_TIMEOUT * len(argvs) + 10)
    if result.error or result.rc != 0:
        return {}, why_failed(result)
    try:
        rows = json.loads(result.stdout)
        answers = {argv: (int(rc), str(out)) for argv, (rc, out) in zip(argvs, rows, strict=True)}
    except (ValueError, TypeError) as exc:
        return {}, f"unreadable answer from {node} ({exc})"
    return answers, ""


Reads = list[tuple[registry.DiskRead, list[tuple[str, ...]]]]


def wanted_disk_reads(m: Manifest, state: State, names: Sequence[str]) -> dict[str, Reads]:
    """Per node of ``names`` that is configured (a node apply meets for the first time is
    left to its roles) and has disks to read: each area's read and its commands."""
    out: dict[str, Reads] = {}
    for name in names:
        recorded = state.nodes.get(name)
        if recorded is None or recorded.lifecycle != "configured":
            continue
        node = m.node(name)
        reads = [(read, argvs) for read in registry.disk_reads() if (argvs := read.commands(m, node))]
        if reads:
            out[name] = reads
    return out


def _read_disks(m: Manifest, wanted: dict[str, Reads], execute: Execute) -> list[DiskVerdict]:
    def one(name: str) -> DiskVerdict:
        node = m.node(name)
        refused: list[str] = []
        notes: list[str] = []
        for read, argvs in wanted[name]:
            answers, error = run_each(execute, name, argvs)
            if error:
                return DiskVerdict(name, error=error)
            lines, said = read.refusals(m, node, answers)
            refused += lines
            notes += said
        return DiskVerdict(name, refused, notes)

    if not wanted:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(wanted))) as pool:
        return list(pool.map(one, wanted))


def read_disks(m: Manifest, state: State, names: Sequence[str], execute: Execute) -> list[DiskVerdict]:
    """The areas' reads before an apply on the nodes :func:`wanted_disk_reads` names, several
    nodes at once."""
    return _read_disks(m, wanted_disk_reads(m, state, names), execute)


def disks_over_ssh(m: Manifest, state: State, state_dir: StateDir, names: Sequence[str]) -> list[DiskVerdict]:
    """:func:`read_disks` over SSH, as verify reaches nodes (no SSH at all where no node has
    disks to read); a signal ends the ssh at once."""
    wanted = wanted_disk_reads(m, state, names)
    if not wanted:
        return []
    with children_end_with_the_command():
        return _read_disks(m, wanted, ssh_executor(node_targets(m, wanted), state_dir.known_hosts, grace=5))
