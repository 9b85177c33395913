"""Compare a manifest with the recorded state: what is new, changed, unchanged or removed,
and which plays will run on which node. Pure functions; the playbooks are read by
:func:`load_plays` at the edge and passed in.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from provisioner import overrides
from provisioner.areas import registry
from provisioner.inventory import groups
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.state import State

Status = Literal["new", "changed", "unchanged", "removed"]
TARGETS_MARK = "provision_targets"


def fingerprint(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


ClusterVars = dict[str, dict[str, Any]]


def heavy_cluster_fingerprints(m: Manifest, cluster: ClusterVars | None = None) -> dict[str, str]:
    """Per area, the fingerprint of the cluster-wide variables that heavy plays consume.
    ``cluster``: :func:`provisioner.areas.registry.cluster_vars` of ``m``, when the caller has
    it already (they include every node's install files: worth computing once)."""
    if cluster is None:
        cluster = registry.cluster_vars(m)
    return {
        area.name: fingerprint({k: v for k, v in cluster[area.name].items() if k not in area.light_keys})
        for area in registry.AREAS
    }


# the install intent is no configuration of the node (and older states lack it)
_NOT_CONFIGURATION = frozenset({"bmc", "install", "install_method"})


def _unset_since_v1(node: Node) -> dict[str, Any]:
    """Node fields added after states were first recorded, left out while unset (so those
    states' fingerprints stay valid): ``scratch``, ``bonds``, an interface's ``rdma_device`` and
    ``more``, a disk's ``per_node``. A pydantic ``exclude`` mapping."""
    out: dict[str, Any] = dict.fromkeys(_NOT_CONFIGURATION, True)
    # a disk's per_node is spent on expansion (every node's disk has its id): never set here
    out["hardware"] = {"disks": {"__all__": {"per_node": True}}}
    if node.scratch is None:
        out["scratch"] = True
    if not node.bonds:
        out["bonds"] = True
    unset = {net: keys for net, iface in node.interfaces.items()
             if (keys := {k for k in ("rdma_device", "more") if not getattr(iface, k)})}
    if unset:
        out["interfaces"] = unset
    return out


def node_sections(m: Manifest, node: Node, heavy_cluster: dict[str, str] | None = None) -> dict[str, str]:
    """Fingerprints of everything that drives heavy node-local work on ``node``.

    One section per role-variable area (its node variables plus its cluster-wide variables
    that heavy plays consume), the node's own definition, and its BMC (install only).
    Pass ``heavy_cluster`` (from :func:`heavy_cluster_fingerprints`) when looping over nodes.
    """
    if heavy_cluster is None:
        heavy_cluster = heavy_cluster_fingerprints(m)
    sections: dict[str, str] = {
        "node": fingerprint(node.model_dump(mode="json", exclude=_unset_since_v1(node))),
        "bmc": fingerprint(node.bmc.model_dump(mode="json") if node.bmc else None),
    }
    for area in registry.AREAS:
        sections[area.name] = fingerprint({"cluster": heavy_cluster[area.name], "node": area.node_vars(m, node)})
    extra = overrides.node_overrides(m, node)
    if extra:  # only when set: states recorded before role_vars existed stay unchanged
        sections[overrides.SECTION] = fingerprint(extra)
    return sections


def recorded_sections(recorded: Mapping[str, str], current: Mapping[str, str], m: Manifest, node: Node,
                      cluster: ClusterVars) -> dict[str, str]:
    """A node's recorded fingerprints in today's sections. A state recorded before an area was
    split out of another (:attr:`Area.split_from`: fabric out of storage) holds one fingerprint
    for both under the older name: where both areas' variables together still match it, both
    sections are unchanged; where not, the older section changed (as that state would have
    said) and the split one's change, if any, is shown under it."""
    out = dict(recorded)
    for area in registry.AREAS:
        old = area.split_from
        if not old or area.name in recorded or old not in recorded:
            continue
        parts = [a for a in registry.AREAS if a.name in (old, area.name)]
        heavy = {k: v for a in parts for k, v in cluster[a.name].items() if k not in a.light_keys}
        both = {k: v for a in parts for k, v in a.node_vars(m, node).items()}
        out[area.name] = current[area.name]
        if fingerprint({"cluster": fingerprint(heavy), "node": both}) == recorded[old]:
            out[old] = current[old]
    return out


# An area with nothing for a node (no heavy cluster variables, no node variables): a state
# recorded before the area existed lacks its section, which is no change.
_EMPTY_AREA = fingerprint({"cluster": fingerprint({}), "node": {}})
# Sections whose change does not need node-local plays (the BMC matters only to installs).
PASSIVE_SECTIONS = frozenset({"bmc"})
# Sections present only when the manifest has something for them: gone counts as changed.
OPTIONAL_SECTIONS = frozenset({overrides.SECTION})


def cluster_fingerprint(m: Manifest, cluster: ClusterVars | None = None) -> str:
    """Fingerprint of the cluster-wide files (light plays): /etc/hosts, slurm.conf, exports.
    ``cluster`` as in :func:`heavy_cluster_fingerprints`."""
    if cluster is None:
        cluster = registry.cluster_vars(m)
    light: dict[str, Any] = {}
    for area in registry.AREAS:  # a split area's under the name older states recorded it by
        light.setdefault(area.split_from or area.name, {}).update(
            {k: v for k, v in cluster[area.name].items() if k in area.light_keys})
    if m.role_vars:  # light plays may read them too (only when set: older states stay valid)
        light[overrides.SECTION] = {n.name: overrides.node_overrides(m, n) for n in m.nodes}
    return fingerprint(light)


@dataclass(frozen=True)
class Upgrade:
    """An area's in-place upgrade (Slurm's release): its steps in order, or why it is refused."""

    area: str
    steps: list[str]
    refusal: str


@dataclass(frozen=True)
class PlaySpec:
    name: str
    hosts: str
    playbook: str

    @property
    def heavy(self) -> bool:
        return TARGETS_MARK in self.hosts

    @property
    def label(self) -> str:
        """Short name for tables: the role part of the play name, light plays marked."""
        base = self.name.split(" - ")[0].strip()
        return base if self.heavy else f"{base} (files)"


@dataclass
class NodePlan:
    name: str
    status: Status
    sections: list[str] = field(default_factory=list)
    lifecycle: str = "new"
    heavy: bool = False
    plays: list[str] = field(default_factory=list)
    # a PXE install apply will do first (it wipes the node's install disks), in words; "" if none
    install: str = ""
    # the scratch volume the storage play makes on this node's disks, in words; "" if none runs
    formats: str = ""
    # what only an install builds (a management bond) and this apply leaves as it is, in words:
    # for a node apply configures without installing it, new or with its own section changed
    install_only: str = ""


@dataclass
class Plan:
    nodes: list[NodePlan]
    cluster_files_change: bool
    targets: list[str]
    installs: list[str] = field(default_factory=list)  # nodes apply installs over PXE (wiping them)
    # in-place upgrades from what the nodes ran at their last good apply: area, steps in order, refusal
    upgrades: list[Upgrade] = field(default_factory=list)

    @property
    def formats(self) -> list[str]:
        """Nodes whose scratch disks the storage play may partition and format."""
        return [n.name for n in self.nodes if n.formats]

    @property
    def install_only(self) -> list[str]:
        """Nodes with something only an install builds (a management bond) that this apply,
        configuring them without installing them, does not build."""
        return [n.name for n in self.nodes if n.install_only]

    @property
    def has_changes(self) -> bool:
        return self.cluster_files_change or bool(self.installs) or any(
            n.status != "unchanged" and (n.status, n.lifecycle) != ("removed", "removed")  # a removal done is none
            for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "has_changes": self.has_changes,
            "cluster_files_change": self.cluster_files_change,
            "targets": self.targets,
            "installs": self.installs,
            "formats": self.formats,
            "install_only": self.install_only,
            "upgrades": [asdict(u) for u in self.upgrades],
            # no install or no format on a node: null, as every --json says "none" (docs/operations.md)
            "nodes": [{**asdict(n), "install": n.install or None, "formats": n.formats or None,
                       "install_only": n.install_only or None} for n in self.nodes],
        }


def resolve_pattern(pattern: str, grp: dict[str, list[str]], all_hosts: list[str], targets: list[str]) -> list[str]:
    """Evaluate an Ansible host pattern (groups, names, ``:``/``,``, ``&``, ``!``)."""
    pattern = re.sub(r"\{\{[^}]*" + TARGETS_MARK + r"[^}]*\}\}", "__targets__", pattern)
    selected: list[str] = []
    include: set[str] = set()
    intersections: list[set[str]] = []
    excludes: set[str] = set()

    def members(term: str) -> set[str]:
        if term in ("all", "*"):
            return set(all_hosts)
        if term == "__targets__":
            return set(targets)
        if term in grp:
            return set(grp[term])
        return {term} if term in all_hosts else set()

    for raw in re.split(r"[:,]", pattern):
        term = raw.strip()
        if not term:
            continue
        if term.startswith("&"):
            intersections.append(members(term[1:]))
        elif term.startswith("!"):
            excludes |= members(term[1:])
        else:
            include |= members(term)
    for inter in intersections:
        include &= inter
    include -= excludes
    selected = [h for h in all_hosts if h in include]
    return selected


def compute(
    m: Manifest,
    state: State,
    plays: list[PlaySpec],
    *,
    limit: list[str] | None = None,
    full: bool = False,
    reinstall: list[str] | None = None,
) -> Plan:
    """The plan: per node status, heavy targets, the plays each node will run, the PXE
    installs (nodes marked ``install: pxe`` that are new, and ``reinstall``), and what only an
    install builds on the other nodes that are new or whose own section changed."""
    names = m.node_names()
    # a node added again after its removal starts afresh
    states = {name: "new" if ns.lifecycle == "removed" else ns.lifecycle for name, ns in state.nodes.items()}
    installer = registry.install()
    installs = installer.targets(m, states, reinstall or []) if installer is not None else []
    installs = [n for n in installs if limit is None or n in limit]
    node_plans: list[NodePlan] = []
    targets: list[str] = []
    cluster = registry.cluster_vars(m)
    heavy_cluster = heavy_cluster_fingerprints(m, cluster)
    for node in m.nodes:
        recorded = state.nodes.get(node.name)
        current = node_sections(m, node, heavy_cluster)
        if recorded is None or not recorded.fingerprints:
            plan = NodePlan(node.name, "new", sorted(current), states.get(node.name, "new"))
        else:
            before = recorded_sections(recorded.fingerprints, current, m, node, cluster)
            keys = set(current) | (set(before) & OPTIONAL_SECTIONS)
            changed = sorted(k for k in keys if before.get(k, _EMPTY_AREA) != current.get(k))
            status: Status = "changed" if changed else "unchanged"
            plan = NodePlan(node.name, status, changed, recorded.lifecycle)
        needs_heavy = plan.status == "new" or any(s not in PASSIVE_SECTIONS for s in plan.sections)
        if limit is not None and node.name not in limit:
            needs_heavy = False
        elif full:
            needs_heavy = True
        plan.heavy = needs_heavy
        if needs_heavy:
            targets.append(node.name)
        if installer is not None and node.name in installs:
            plan.install = installer.summary(m, node, node.name in (reinstall or []))
        elif installer is not None and (limit is None or node.name in limit) and (
                plan.status == "new" or "node" in plan.sections):  # where a bond may be new to it
            plan.install_only = installer.install_only(m, node)
        if needs_heavy and (plan.status == "new" or "storage" in plan.sections or full):
            plan.formats = registry.destructive(m, node)
        node_plans.append(plan)
    for name in sorted(set(state.nodes) - set(names)):
        node_plans.append(NodePlan(name, "removed", [], state.nodes[name].lifecycle))
    grp = groups(m)
    run_hosts = set(names if limit is None else [n for n in names if n in limit])
    play_hosts = [(play.label, set(resolve_pattern(play.hosts, grp, names, targets))) for play in plays]
    for plan in node_plans:
        if plan.status == "removed" or plan.name not in run_hosts:
            continue
        for label, hosts in play_hosts:
            if plan.name in hosts and label not in plan.plays:
                plan.plays.append(label)
    cluster_change = state.cluster_fingerprint != cluster_fingerprint(m, cluster)
    records = {name: ns.recorded if ns.lifecycle == "configured" else None for name, ns in state.nodes.items()}
    upgrades = [Upgrade(area, steps, refusal) for area, steps, refusal in registry.upgrades(m, records)]
    return Plan(node_plans, cluster_change, targets, installs, upgrades)


def load_plays(site: Path) -> list[PlaySpec]:
    """Read ``site.yml`` and the playbooks it imports into a flat, ordered list of plays."""
    out: list[PlaySpec] = []
    entries = yaml.safe_load(site.read_text()) or []
    for entry in entries:
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if imported:
            out.extend(load_plays(site.parent / str(imported)))
        elif "hosts" in entry:
            out.append(PlaySpec(str(entry.get("name", entry["hosts"])), str(entry["hosts"]), site.name))
    return out
