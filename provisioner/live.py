"""What ``provision plan`` reads from running services (the areas' :class:`LiveDrift`, e.g.
slurmdbd's accounts, associations and QOS): the drift apply's reconcile would remove there,
which no fingerprint of the nodes shows (someone ran ``sacctmgr`` by hand).

The commands are read-only and bounded; the transport is given (``execute``: verify's SSH
executor in the command, a fake in tests). A service that cannot be read is said so, with
the reason, and changes nothing else in the plan."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from provisioner.areas import registry
from provisioner.drain import why_failed
from provisioner.manifest.model import Manifest
from provisioner.state import State, StateDir
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor
from provisioner.verify.run import Execute

COMMAND_TIMEOUT = 30  # seconds per read-only command on the service's node
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
