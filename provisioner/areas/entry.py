"""What an entry of the area registry is (:class:`Area`) and the kinds of work an area may
offer the engine beyond its role variables (installs, reports, backups, builds, upgrades).
The entries themselves are in ``provisioner.areas.registry``.

An entry names, each optional but the role variables:

* ``cluster_vars(m)`` / ``node_vars(m, node)``: the area's role variables, written to
  group_vars/all/<area>.yml and merged into host_vars/<node>.yml (``rolevars.py``);
  ``light_keys``: the cluster-wide ones that only light cluster-wide plays consume
  (/etc/hosts, slurm.conf, exports): a change there re-renders files everywhere but does
  not re-run heavy plays;
* ``groups(m)``: the area's inventory groups and their members (``rolevars.py``);
* ``checks``: whole-manifest checks (``checks.py``), run by ``provisioner.validate`` on a
  structurally clean manifest;
* ``verify(m)``: the area's checks of a running node (``verify.py``), gathered by
  ``provisioner.verify.catalog``;
* ``prepare``: makes control-machine material before an apply (e.g. the munge key);
  ``secret_envs(m)`` / ``secret_values(state)``: the secrets a run must keep out of what it
  records, and scan its artifacts for;
* ``image_packages(m)``: OS packages every node gets from the area's roles, which a node
  image built for the manifest carries (``provision image build``);
* ``image_roles``: the area's roles whose OS-archive packages a node image may also carry
  where every node deployed from it gets them (``provisioner.packages.image_extras``);
* ``install``: the area installs nodes' operating systems before they are configured
  (:class:`Install`; bare metal);
* ``usage``: the pure side of ``provision report usage`` (:class:`UsageReport`; monitoring);
* ``backup``: ``provision backup`` and ``restore`` of the head node (:class:`HeadBackup`; backup);
* ``live``: what ``provision plan`` reads from a running service to show the drift apply's
  reconcile would remove there (:class:`LiveDrift`; slurm: slurmdbd's accounts);
* ``package_build``: software the area builds into .deb packages per OS release ahead of an
  apply (:class:`PackageBuild`; slurm: one Slurm for the cluster, ``provision slurm build``);
* ``upgrade``: what a good apply records of a node in the state, and the in-place upgrade
  from those records to the manifest, in order, or why it is refused (:class:`Upgrade`;
  slurm: its release);
* ``destructive(m, node)``: what the area's plays may destroy on a node, in plan's words;
  ``disk_read``: what apply reads on such a node before it runs anything, and the refusal
  it makes of it (:class:`DiskRead`; storage: disks of new scratch volumes and pools that
  hold data);
* ``split_from``: the area this one was split out of, under whose name older states
  recorded both (``provisioner.plan.recorded_sections``; fabric: storage).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from provisioner.areas.baremetal import preflight as baremetal_preflight
from provisioner.areas.monitoring import usage as monitoring_usage
from provisioner.areas.monitoring import usage_sources as monitoring_usage_sources
from provisioner.manifest.checks import Check
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import NodeChecks
from provisioner.state import StateDir

PrepareHook = Callable[[Loaded, StateDir], None]


class InstallOutcome(Protocol):
    """One node's install, as the engine records and shows it."""

    @property
    def node(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def stage(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def warnings(self) -> tuple[str, ...]: ...
    @property
    def seconds(self) -> float: ...


# Extra variables of the install server's playbook for installing nodes: (m, nodes, the state
# directory's image cache) -> variables.
ServerVars = Callable[[Manifest, Sequence[str], Path], dict[str, object]]


class InstallRun(Protocol):
    """Install ``nodes``: ``total`` bounds one node (None: the area's default); ``wait(s)``
    sleeps and says whether the run is being stopped."""

    def __call__(self, m: Manifest, nodes: Sequence[str], *, known_hosts: Path, total: float | None,
                 wait: Callable[[float], bool]) -> Sequence[InstallOutcome]: ...


@dataclass(frozen=True)
class InstallSteps:
    """The side of an install that reaches machines (from the module ``Install.runner``)."""

    server_vars: ServerVars
    install: InstallRun


PreflightCheck = baremetal_preflight.Check
PreflightInputs = baremetal_preflight.Inputs


@dataclass(frozen=True)
class Preflight:
    """The installs' preflight decisions (pure); the engine's ``provisioner/preflight.py``
    finds their inputs (the image cache and the images' proofs, the deploy ramdisk, the BMCs)."""

    image_file: Callable[[Manifest, str], str]  # the file an OS's image is published as
    method: Callable[[Manifest, Node], str]  # "image" (deployed) or "installer"
    module_names: Callable[[Iterable[str]], set[str]]  # a ramdisk's file names -> its kernel modules
    checks: Callable[[Manifest, Sequence[str], PreflightInputs], list[PreflightCheck]]
    failed: Callable[[Sequence[PreflightCheck]], list[PreflightCheck]]
    refusal: Callable[[Sequence[PreflightCheck]], str]  # the error apply stops with


@dataclass(frozen=True)
class Install:
    """How an area installs nodes' operating systems before they are configured. What plan
    and image build ask is pure; the installs themselves are ``runner``, a module
    (:class:`InstallSteps`) loaded by name only when an apply installs, since it brings
    paramiko, the BMC drivers and the image cache that validate and plan must not load."""

    targets: Callable[[Manifest, Mapping[str, str], Iterable[str]], list[str]]  # (m, lifecycles, reinstall)
    summary: Callable[[Manifest, Node, bool], str]  # the plan's words for one install (again: a reinstall)
    needs_ramdisk: Callable[[Manifest], bool]  # provision image build makes the deploy ramdisk too
    image_nodes: Callable[[Manifest, str], tuple[str, ...]]  # the nodes an OS's image is deployed onto
    playbook: str  # prepares the install server (on the head node) before the installs
    runner: str
    # what only an install builds on a node (its management bond), in the plan's words, for
    # nodes this apply does not install ("": nothing)
    install_only: Callable[[Manifest, Node], str]
    preflight: Preflight | None = None  # checked before anything is armed or powered

    def steps(self) -> InstallSteps:
        module = importlib.import_module(self.runner)
        return InstallSteps(module.server_vars, module.install)


@dataclass(frozen=True)
class UsageReport:
    """``provision report usage``: the window, the joins and arithmetic (``gather``, given the
    command's SSH and HTTP edges), the renderers; where Slurm and Prometheus are."""

    window: Callable[[str, str, float], monitoring_usage_sources.Window]  # (--since, --until, now)
    gather: Callable[..., monitoring_usage.Report]
    controller: Callable[[Manifest], Node]  # where sacct runs
    prometheus_url: Callable[[Manifest], str | None]
    render: Mapping[str, Callable[[monitoring_usage.Report], str]]  # json, csv, table, html
    groupings: tuple[str, ...]


@dataclass(frozen=True)
class LiveDrift:
    """What ``provision plan`` reads from a running service, beyond the nodes' fingerprints:
    the drift between the manifest and what the service holds, which apply's reconcile would
    remove. ``commands`` run read-only on ``node`` (once it is configured); ``changes`` turns
    their output, in order, into (kind, line): add, change, remove, or kept (never removed)."""

    name: str  # the service, in plan's words
    wanted: Callable[[Manifest], bool]
    node: Callable[[Manifest], Node]
    commands: Callable[[Manifest], tuple[tuple[str, ...], ...]]
    changes: Callable[[Manifest, list[str]], list[tuple[str, str]]]


@dataclass(frozen=True)
class DiskRead:
    """What apply reads on a configured node before it changes anything, to refuse at once
    what a role would refuse halfway through the run: ``commands`` (m, node) are read-only
    ([]: nothing to read there); ``refusals`` (m, node, each command's exit status and
    output) say why the apply may not go on (lines; [] when it may) and what was left to
    the roles (notes)."""

    commands: Callable[[Manifest, Node], list[tuple[str, ...]]]
    refusals: Callable[[Manifest, Node, Mapping[tuple[str, ...], tuple[int, str]]], tuple[list[str], list[str]]]


Records = Mapping[str, Mapping[str, str] | None]  # per node: its state record (None: never configured)


@dataclass(frozen=True)
class Upgrade:
    """An in-place upgrade of software the nodes run: ``recorded`` (m, node) is what a good
    apply records of the node; ``order`` (m, records) the upgrade's steps in plan's words,
    in order, and why it is refused ("" when it is not)."""

    recorded: Callable[[Manifest, Node], dict[str, str]]
    order: Callable[[Manifest, Records], tuple[list[str], str]]


class BuildSource(Protocol):
    @property
    def version(self) -> str: ...
    @property
    def file(self) -> str: ...
    @property
    def sha256(self) -> str: ...


class BuildJob(Protocol):
    """One OS release's build of an area's :class:`PackageBuild`."""

    @property
    def os(self) -> str: ...
    @property
    def source(self) -> BuildSource: ...
    @property
    def url(self) -> str: ...
    @property
    def name(self) -> str: ...  # its folder in the cache
    @property
    def debs(self) -> tuple[str, ...]: ...  # the packages it must leave

    def mmdebstrap(self, workdir: str, outdir: str, proxy: str | None = None, mirror: str | None = None,
                   jobs: int = 2) -> list[str]: ...


@dataclass(frozen=True)
class PackageBuild:
    """``jobs`` (m, only OS or None): one build per OS release, each with its sources, its
    mmdebstrap command line and the packages it must leave; ``missing`` (file paths of the
    built packages): the build options a build left out; ``timeout_s``: one build's bound."""

    jobs: Callable[[Manifest, str | None], Sequence[BuildJob]]
    missing: Callable[[Iterable[str]], list[str]]
    timeout_s: int
    repo: PackageRepo


@dataclass(frozen=True)
class PackageRepo:
    """The signed flat apt repository per OS release the builds are published in (on the
    control machine; the key a GnuPG home ``signing_home`` in the state's secrets/)."""

    signing_home: str
    public_key: str  # the exported public key's file name in signing_home
    key_commands: Callable[[str, str], list[list[str]]]  # (home, cluster): make the key, export it
    stanza: Callable[[str, str, bytes], str]  # (dpkg-deb --field output, file name, its bytes): a Packages entry
    release: Callable[[str, Mapping[str, bytes], str], str]  # (os, {index: bytes}, date)
    sign_command: Callable[[str], list[str]]  # (home): Release -> InRelease


@dataclass(frozen=True)
class HeadBackup:
    """``provision backup`` and ``provision restore``: the shell lines run on ``node`` (the
    area's tool, installed by its role), the admin host's part packed and encrypted locally,
    and the destinations in words."""

    wanted: Callable[[Manifest], bool]
    node: Callable[[Manifest], Node]
    parse_to: Callable[[str], dict[str, Any]]  # --to: a path on the head or [user@]host[:port]:/path
    destination: Callable[[Manifest], dict[str, Any]]
    describe: Callable[[Mapping[str, Any]], str]
    make_command: Callable[[Mapping[str, Any] | None, bool], str]  # (--to, with the admin part)
    upload_command: Callable[[], str]  # reads the admin part from stdin on the node
    restore_command: Callable[[str, bool, Mapping[str, Any] | None], str]  # (name, --yes, --to)
    pack_admin: Callable[[Manifest, Path, Path], None]  # (m, state dir, out): the encrypted admin part
    timeout: Callable[[Manifest], int]
    plan_lines: Callable[[Manifest], list[str]]


@dataclass(frozen=True)
class Area:
    name: str
    cluster_vars: Callable[[Manifest], dict[str, Any]]
    node_vars: Callable[[Manifest, Node], dict[str, Any]]
    light_keys: frozenset[str] = frozenset()
    groups: Callable[[Manifest], dict[str, set[str]]] | None = None
    checks: tuple[Check, ...] = ()
    verify: Callable[[Manifest], NodeChecks] | None = None
    prepare: PrepareHook | None = None
    secret_envs: Callable[[Manifest], set[str]] | None = None
    secret_values: Callable[[StateDir], list[str]] | None = None
    image_packages: Callable[[Manifest], tuple[str, ...]] | None = None
    # roles whose packages come from the OS's own archive (no vendor repository, no kernel
    # module build): a node image carries the ones every node deployed from it gets
    image_roles: tuple[str, ...] = ()
    install: Install | None = None
    # what the area's plays may destroy on a node (formatting disks), in plan's words ("": nothing)
    destructive: Callable[[Manifest, Node], str] | None = None
    disk_read: DiskRead | None = None
    usage: UsageReport | None = None
    live: LiveDrift | None = None
    backup: HeadBackup | None = None
    upgrade: Upgrade | None = None
    package_build: PackageBuild | None = None
    # the area this one was split out of: states recorded before then hold both areas'
    # fingerprints under that one's name (provisioner.plan reads them so; fabric: storage)
    split_from: str = ""

