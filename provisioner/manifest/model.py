"""The manifest schema (version 1): the single source of truth for a cluster. This module is
the whole document (:class:`Manifest`) and its node index; each section is a module of its
own (cluster, people, networks, nodes, storage, software, slurm, monitoring, verify, backup) built
on the shared field types of :mod:`provisioner.manifest.fields`.

Field-level rules live in the sections (types, ranges, formats). Rules that need the whole
manifest (unique addresses, references between sections) live in :mod:`provisioner.manifest.checks`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr

from provisioner.manifest.backup import Backup
from provisioner.manifest.cluster import Cluster
from provisioner.manifest.fields import Strict
from provisioner.manifest.monitoring import Cost, Monitoring
from provisioner.manifest.networks import Networks
from provisioner.manifest.nodes import Node
from provisioner.manifest.people import Group, Homes, Identity, User
from provisioner.manifest.slurm import Slurm
from provisioner.manifest.software import Docker, Software
from provisioner.manifest.storage import MergerfsUnion, Nfs, Zfs
from provisioner.manifest.verify import Verify

SCHEMA_VERSION = 1


class NodeIndex:
    """Lookups over one expanded node list: by name, by role, and resolved node selectors
    (filled by :mod:`provisioner.manifest.select`). Built once per list, so per-node code
    (role variables, checks, the plan) looks a node up in constant time instead of scanning
    the list: on a 2,000-node manifest the scans made validate and plan quadratic.

    A cache, not part of the manifest's value: any two indexes compare equal, so manifests
    compare as before whether or not theirs was built yet.
    """

    __slots__ = ("by_name", "by_role", "count", "names", "names_by_role", "nodes", "selections")

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.count = len(nodes)
        self.names: tuple[str, ...] = tuple(n.name for n in nodes)
        self.by_name: dict[str, Node] = {}
        self.by_role: dict[str, list[Node]] = {}
        for node in nodes:
            self.by_name.setdefault(node.name, node)  # the first of duplicates, as a scan finds it
            for role in node.roles:
                self.by_role.setdefault(role, []).append(node)
        self.names_by_role: dict[str, frozenset[str]] = {
            role: frozenset(n.name for n in members) for role, members in self.by_role.items()}
        # selector items -> (names in manifest order, the same as a set)
        self.selections: dict[tuple[str, ...], tuple[tuple[str, ...], frozenset[str]]] = {}

    def __eq__(self, other: object) -> bool:
        return other is None or isinstance(other, NodeIndex)


class Manifest(Strict):
    version: Literal[1]
    cluster: Cluster
    networks: Networks
    nodes: list[Node] = Field(min_length=1)
    zfs: Zfs = Field(default_factory=Zfs)
    nfs: Nfs = Field(default_factory=Nfs)
    mergerfs: list[MergerfsUnion] = Field(default_factory=list)
    docker: Docker = Field(default_factory=Docker)
    slurm: Slurm = Field(default_factory=Slurm)
    software: Software = Field(default_factory=Software)
    monitoring: Monitoring | None = Field(default=None, description="absent: no monitoring")
    cost: Cost | None = Field(default=None, description="prices per GPU model for `provision report usage`")
    verify: Verify = Field(default_factory=Verify)
    backup: Backup | None = Field(default=None, description="absent: no backups")
    groups: list[Group] = Field(default_factory=list, description="the people's groups, the same gid everywhere")
    users: list[User] = Field(default_factory=list, description="the people who use the cluster (not admins)")
    homes: Homes = Field(default_factory=Homes)
    identity: Identity = Field(default_factory=Identity, description="where accounts come from: local or sssd (LDAP)")
    role_vars: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="role variables the manifest does not generate, per cluster ('all'), role ('@compute') "
        "or node (names, ranges); checked against each role's meta/argument_specs.yml (provisioner/overrides.py)",
    )

    _index: NodeIndex | None = PrivateAttr(default=None)

    # ----- helpers over the expanded node list (see provisioner.manifest.load)
    def index(self) -> NodeIndex:
        """The node index of the current node list, built on first use. Nodes are treated as
        values: change a manifest's nodes by giving it a new list (``model_copy(update=...)``),
        which builds a new index, not by editing a node in place."""
        private = self.__pydantic_private__  # read directly: the attribute path costs more than the lookup
        index: NodeIndex | None = private.get("_index") if private is not None else None
        if index is None or index.nodes is not self.nodes or index.count != len(self.nodes):
            index = NodeIndex(self.nodes)
            self._index = index
        return index

    def node(self, name: str) -> Node:
        try:
            return self.index().by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def node_names(self) -> list[str]:
        return list(self.index().names)

    def with_role(self, role: str) -> list[Node]:
        return list(self.index().by_role.get(role, ()))

    def role_names(self, role: str) -> frozenset[str]:
        """The names of the nodes with ``role`` (a set: for "is this node one of them?")."""
        return self.index().names_by_role.get(role, frozenset())

    @property
    def head(self) -> Node:
        heads = self.with_role("head")
        if not heads:
            raise KeyError("head")
        return heads[0]

    @property
    def fqdn_suffix(self) -> str:
        return self.cluster.domain
