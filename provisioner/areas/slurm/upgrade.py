"""Upgrading the cluster's Slurm in SchedMD's order (pure): from the release each node ran at
its last good apply to the one the manifest asks for.

SchedMD's upgrade guide: back up the database and StateSaveLocation first, then slurmdbd,
then slurmctld, then the slurmd nodes (the clients last); a release upgrades in place only
from its own window (:func:`provisioner.areas.slurm.releases.releases_back`), so a longer
jump goes through an intermediate release, which is refused here naming it.

The release a node runs is recorded in the state at each good apply (:func:`recorded`); a
node applied before that record existed ran its OS's Slurm (the only source there was).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from provisioner.areas.slurm.build import NOT_INSTALLED_YET, wanted
from provisioner.areas.slurm.decide import client_nodes, controller, slurm_nodes
from provisioner.areas.slurm.hostlist import hostlist
from provisioner.areas.slurm.releases import SLURM_RELEASES, SLURM_VERSION_BY_OS, node_release, releases_back
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

RECORD_KEY = "slurm"  # the state's per-node record of the Slurm release it runs


def recorded(m: Manifest, node: Node) -> dict[str, str]:
    """What a good apply records for ``node``: the Slurm release it now runs (none when the
    node runs no Slurm)."""
    names = {controller(m).name, *(n.name for n in slurm_nodes(m)), *(n.name for n in client_nodes(m))}
    if not m.slurm.enabled or node.name not in names:
        return {}
    return {RECORD_KEY: node_release(m, node.os)}


def running_release(node: Node, record: Mapping[str, str] | None) -> str | None:
    """The release ``node`` runs: its record; a configured node without one ran its OS's Slurm
    (``record`` {}); None for a node never configured (nothing to upgrade)."""
    if record is None:
        return None
    return record.get(RECORD_KEY) or SLURM_VERSION_BY_OS[node.os]


def path(running: str, target: str) -> list[str]:
    """The releases an in-place upgrade goes through, ``target`` last: each step within the
    window of the release it goes to, as long as possible. ValueError for a downgrade."""
    at, end = SLURM_RELEASES.index(running), SLURM_RELEASES.index(target)
    if end < at:
        raise ValueError(f"Slurm {target} is older than the running {running}: Slurm cannot downgrade in place")
    steps: list[str] = []
    while at < end:
        at = max(i for i in range(at + 1, end + 1) if i - at <= releases_back(SLURM_RELEASES[i]))
        steps.append(SLURM_RELEASES[at])
    return steps


@dataclass(frozen=True)
class Upgrade:
    """The upgrade the manifest asks for: ``steps`` in order (plan's words), or why it is
    refused; both empty when every configured node runs the wanted release."""

    steps: list[str] = field(default_factory=list)
    refusal: str = ""


def order(m: Manifest, records: Mapping[str, Mapping[str, str] | None]) -> Upgrade:
    """The upgrade from what the nodes run (``records``: per node its state record, None when
    the node was never configured) to what the manifest asks, in SchedMD's order."""
    if not m.slurm.enabled:
        return Upgrade()
    ctl = controller(m)
    target = node_release(m, ctl.os)
    nodes = [ctl, *slurm_nodes(m), *client_nodes(m)]
    running = {n.name: r for n in nodes if (r := running_release(n, records.get(n.name))) is not None}
    behind = [n for n in nodes if n.name in running and running[n.name] != node_release(m, n.os)]
    if not behind:
        return Upgrade()
    oldest = min((running[n.name] for n in behind), key=SLURM_RELEASES.index)
    try:
        steps = path(oldest, target)
    except ValueError as err:
        return Upgrade(refusal=str(err))
    if len(steps) > 1:
        names = hostlist(n.name for n in behind if running[n.name] == oldest)
        return Upgrade(refusal=(
            f"{names} run Slurm {oldest}, which Slurm {target} cannot upgrade in place (it takes its own and "
            f"the {releases_back(target)} previous releases): upgrade to Slurm {steps[0]} first "
            f"(slurm.version of that release), then to {target} ({' -> '.join([oldest, *steps])})"))
    upgraded = {n.name for n in behind}
    slurmd = [n.name for n in slurm_nodes(m) if n.name in upgraded and n.name != ctl.name]
    clients = [n.name for n in client_nodes(m) if n.name in upgraded]
    out: list[str] = []
    if ctl.name in upgraded:  # (a roll stopped half-way has its controller upgraded already)
        out.append(f"back up slurmdbd's database and slurmctld's StateSaveLocation first: provision backup "
                   f"(Slurm {oldest} -> {target})")
        if m.slurm.accounting:
            out.append(f"slurmdbd on {ctl.name} (it converts the database; slurmctld waits for it)")
        out.append(f"slurmctld on {ctl.name}")
    if slurmd:
        out.append(f"slurmd on {hostlist(slurmd)}, a batch at a time, drained first: provision apply --rolling")
    if clients:
        out.append(f"client commands on {hostlist(clients)}")
    return Upgrade(steps=out)


def plan_view(m: Manifest, records: Mapping[str, Mapping[str, str] | None]) -> tuple[list[str], str]:
    """:func:`order` as plan shows it and apply obeys it: with ``slurm.source: build`` apply
    is refused until the slurm role installs the built packages (the steps still show)."""
    up = order(m, records)
    return up.steps, up.refusal or (NOT_INSTALLED_YET if wanted(m) else "")
