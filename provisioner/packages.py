"""What the roles will install on the nodes of one OS, derived from the roles themselves.

``provision image build`` proves, inside the image it built, that every one of these
packages resolves from the sources those nodes will use (:mod:`provisioner.image.proof`).
The list is not kept by hand: for every play of ``playbooks/site.yml`` and ``baremetal.yml`` and
every node it runs on, the role's own files are evaluated with Ansible's templating, the way the role
evaluates them on that node: its defaults, the node's inventory variables (what
``provision inventory`` writes: the areas' role variables and the manifest's ``role_vars``),
``vars/main.yml`` and ``vars/<OS>.yml``, the facts the image fixes (distribution, release,
architecture, kernel), then its tasks in order: ``set_fact`` values, ``import_tasks`` /
``include_tasks`` and blocks, each task's ``when`` (a condition that needs what only the
running node knows, a registered result or what is computed from one (:class:`Unknown`),
counts as true: the proof then asks about more packages, never fewer), every
``ansible.builtin.apt`` task with a ``name`` (one request: what one task installs together)
and every ``ansible.builtin.deb822_repository`` task (a vendor repository the node will add,
with its key).

Each request names the manifest field that made the role run there (:data:`ROLE_FIELDS`),
so a package that does not resolve is reported against what the operator wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from provisioner import content, inventory, overrides, plan
from provisioner.areas import registry
from provisioner.image import proof
from provisioner.image.proof import AptRequest, ProofInput, Repository
from provisioner.image.recipe import OS_IMAGES, OsImage, recipe
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.platforms import os_vars_path, platform

# The manifest field that makes each role run on a node (the inventory group of its play
# comes from it): what a failed proof names. A test holds it complete for site.yml's roles.
ROLE_FIELDS: dict[str, str] = {
    "common": "nodes (the common role runs on every node)",
    "users": "users, groups (every node)",
    "sssd": "identity (provider sssd: every node)",
    "ofed": "software.ofed (nodes with an infiniband or roce interface)",
    "nvidia_driver": "software.nvidia_driver (nodes with hardware.gpu)",
    "cuda": "software.cuda (nodes with hardware.gpu)",
    "nccl": "software.nccl (nodes with hardware.gpu)",
    "nvidia_container_toolkit": "docker.nvidia_runtime (docker.nodes with hardware.gpu)",
    "docker": "docker (docker.nodes)",
    "node_exporter": "monitoring (every node)",
    "gpu_metrics": "monitoring (nodes with hardware.gpu)",
    "slurm_metrics": "monitoring (the Slurm controller)",
    "prometheus": "monitoring (monitoring.nodes)",
    "alertmanager": "monitoring (monitoring.nodes)",
    "grafana": "monitoring.grafana (monitoring.nodes)",
    "pxe_server": "nodes[role head] (the PXE server)",
    "munge": "slurm (Slurm nodes)",
    "slurm": "slurm (Slurm nodes)",
    "containers": "slurm.containers (compute and login nodes)",
    "zfs": "zfs.pools",
    "nfs_server": "nfs.exports",
    "nfs_client": "nfs.mounts",
    "mergerfs": "mergerfs",
    "scratch": "nodes[].hardware.disks (use: scratch)",
    "backup": "backup (the head node)",
}

# the kernel of an image before it is built (the proof passes the image's own)
DEFAULT_KERNELS: dict[str, str] = {"debian": "6.1.0-0-amd64", "ubuntu": "0.0.0-0-generic"}

# What a role learns on the node itself and the image cannot know, assumed as the manifest
# describes the node: a node with hardware.gpu has its GPUs on PCI and a kernel of its own
# (roles/nvidia_driver/tasks/detect.yml). Set before the role's tasks; a set_fact that
# cannot be evaluated before the node runs keeps the assumed value.
NODE_FACTS: dict[str, dict[str, Any]] = {
    "nvidia_driver": {"__nvidia_driver_full": True},
}


def _playbooks() -> tuple[str, ...]:
    """site.yml, and the install server's playbook (the registry's), which apply runs on the
    head node for the bare-metal installs."""
    installer = registry.install()
    return ("site.yml",) if installer is None else ("site.yml", installer.playbook)


PLAYBOOKS = _playbooks()

APT = ("ansible.builtin.apt", "apt")
REPO = ("ansible.builtin.deb822_repository", "deb822_repository")
SET_FACT = ("ansible.builtin.set_fact", "set_fact")
INCLUDES = ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks", "import_tasks", "include_tasks")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DeriveError(ValueError):
    """A role's package expression cannot be evaluated (the message names role and task)."""


@dataclass(frozen=True)
class RoleRun:
    """One role (or one of its task files) a play runs on a host pattern."""

    role: str
    hosts: str
    tasks_from: str = "main"
    when: str | None = None


def role_runs(site: Path) -> list[RoleRun]:
    """The roles of ``site.yml`` and the playbooks it imports, in order, with the pattern of
    their play: ``roles:`` entries and ``include_role``/``import_role`` tasks."""
    out: list[RoleRun] = []
    for entry in yaml.safe_load(site.read_text()) or []:
        imported = entry.get("ansible.builtin.import_playbook") or entry.get("import_playbook")
        if imported:
            out.extend(role_runs(site.parent / str(imported)))
            continue
        hosts = str(entry.get("hosts", ""))
        for role in entry.get("roles") or []:
            name = role if isinstance(role, str) else role.get("role") or role.get("name")
            when = None if isinstance(role, str) else role.get("when")
            out.append(RoleRun(str(name), hosts, "main", _condition(when)))
        for task in entry.get("tasks") or []:
            inc = task.get("ansible.builtin.include_role") or task.get("ansible.builtin.import_role")
            if isinstance(inc, dict):
                out.append(RoleRun(str(inc["name"]), hosts, str(inc.get("tasks_from", "main")),
                                   _condition(task.get("when"))))
    return out


def _condition(when: Any) -> str | None:
    if when is None:
        return None
    parts = when if isinstance(when, list) else [when]
    return " and ".join(f"({p})" for p in parts)


def _trust(data: Any) -> Any:
    """Role files as Ansible reads them: their strings may be templates."""
    if isinstance(data, str):
        return trust_as_template(data)
    if isinstance(data, list):
        return [_trust(v) for v in data]
    if isinstance(data, dict):
        return {k: _trust(v) for k, v in data.items()}
    return data


@cache
def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    for task in node or []:
        if isinstance(task, dict):
            yield task


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from _strings(v)


def _idents(node: Any) -> set[str]:
    return {n for s in _strings(node) for n in NAME_RE.findall(s)}


@cache
def _role_names(roles: Path, role: str) -> frozenset[str]:
    """The variables that can change what the role installs or which repositories it adds:
    the names in its apt and deb822_repository tasks and in the conditions of the includes
    and blocks on the way to them, and, through its ``set_fact`` tasks and its defaults and
    vars files, the names those are made of. Only a node's values of these key an
    evaluation, so nodes alike in them share one (a node's addresses do not count)."""
    base = roles / role
    names: set[str] = set()
    definitions: dict[str, set[str]] = {}

    def installs(node: Any, seen: frozenset[str] = frozenset()) -> bool:
        """Whether these tasks (with their blocks and includes) hold an apt or repository task."""
        for task in _tasks(node):
            if any(k in task for k in (*APT, *REPO)) or installs(task.get("block"), seen):
                return True
            target = next((task[k] for k in INCLUDES if k in task), None)
            target = target.get("file") if isinstance(target, dict) else target
            if isinstance(target, str):
                if "{{" in target:
                    return True
                name = target if target.endswith(".yml") else f"{target}.yml"
                if name not in seen and installs(_load(base / "tasks" / name), seen | {name}):
                    return True
        return False

    def walk(node: Any) -> None:
        for task in _tasks(node):
            if any(k in task for k in (*APT, *REPO)) or (any(k in task for k in ("block", *INCLUDES))
                                                         and installs([task])):
                names.update(_idents(task.get("when")) | _idents(task.get("vars")))
                names.update(*(_idents(task.get(k)) for k in (*INCLUDES, *APT, *REPO)))
            for key in SET_FACT:
                if isinstance(task.get(key), dict):
                    guard = _idents(task.get("when")) | _idents(task.get("vars"))
                    for var, expr in task[key].items():
                        definitions.setdefault(str(var), set()).update(_idents(expr) | guard)
            for key in ("block", "rescue", "always"):
                walk(task.get(key))

    for f in base.glob("tasks/*.yml"):
        walk(_load(f))
    for f in [*base.glob("defaults/*.yml"), *base.glob("vars/*.yml")]:
        for var, value in (_load(f) or {}).items():
            definitions.setdefault(str(var), set()).update(_idents(value))
    todo = list(names)
    while todo:
        for n in definitions.get(todo.pop(), ()):
            if n not in names:
                names.add(n)
                todo.append(n)
    return frozenset(names)


@cache
def _registered(roles: Path, role: str) -> frozenset[str]:
    """Names the role's tasks ``register``: results of the running node."""
    out: set[str] = set()

    def walk(node: Any) -> None:
        for task in _tasks(node):
            if isinstance(task.get("register"), str):
                out.add(task["register"])
            for key in ("block", "rescue", "always"):
                walk(task.get(key))

    for f in (roles / role / "tasks").glob("*.yml"):
        walk(_load(f))
    return frozenset(out)


class Unknown:
    """What a variable holds that only the running node knows (a registered result, and
    what is computed from one): any use of it fails the expression, so an expression that
    needs it cannot be decided, while one that does not (``a == 'x' and <unknown>`` with
    ``a`` not ``'x'``) still can."""

    def _unknown(self, *args: Any, **kw: Any) -> Any:
        raise DeriveError("known only on the running node")

    __getattr__ = __getitem__ = __eq__ = __ne__ = __lt__ = __gt__ = __bool__ = __len__ = __iter__ = _unknown
    __str__ = __int__ = __float__ = __contains__ = _unknown
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<known only on the running node>"


UNKNOWN = Unknown()


@dataclass
class _Eval:
    roles: Path
    role: str
    variables: dict[str, Any]
    requests: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    repos: list[Repository] = field(default_factory=list)
    assumed: frozenset[str] = frozenset()
    unknown: set[str] = field(default_factory=set)  # results of the running node, and what follows from them

    def __post_init__(self) -> None:
        for name in self.unknown:
            self.variables[name] = UNKNOWN

    def forget(self, var: str) -> None:
        """``var`` is known only on the running node (unless the manifest's picture of the
        node assumes it, :data:`NODE_FACTS`)."""
        if var not in self.assumed:
            self.unknown.add(var)
            self.variables[var] = UNKNOWN

    def templar(self, extra: Mapping[str, Any] | None = None) -> Templar:
        return Templar(loader=DataLoader(), variables={**self.variables, **(extra or {})})

    def render(self, expr: Any, where: str, extra: Mapping[str, Any] | None = None) -> Any:
        try:
            return self.templar(extra).template(_trust(expr))
        except Exception as exc:  # Ansible's template errors, and what Unknown raises inside them
            raise DeriveError(f"role {self.role}, {where}: cannot evaluate {expr!r}: "
                              f"{str(exc).splitlines()[0]}") from None

    def decide(self, when: Any, extra: Mapping[str, Any] | None = None) -> bool | None:
        """A task's ``when``: None when it cannot be decided before the node runs."""
        cond = _condition(when)
        if cond is None:
            return True
        try:
            return bool(self.templar(extra).template(trust_as_template("{{ " + cond + " }}")))
        except Exception:  # undefined, or it needs what only the running node knows
            return None

    def holds(self, when: Any, extra: Mapping[str, Any] | None = None) -> bool:
        """False only when decidable and false (an undecidable task may run: it counts)."""
        return self.decide(when, extra) is not False

    def run_file(self, name: str, decided: bool = True) -> None:
        path = self.roles / self.role / "tasks" / (name if name.endswith(".yml") else f"{name}.yml")
        for task in _tasks(_load(path)):
            self.run_task(task, path.name, decided)

    def run_task(self, task: dict[str, Any], file: str, decided: bool = True) -> None:
        extra = _trust(task.get("vars") or {})
        verdict = self.decide(task.get("when"), extra)
        if verdict is False:
            return
        decided = decided and verdict is True
        where = f"tasks/{file}: {task.get('name', '(unnamed)')}"
        if "block" in task:
            for sub in _tasks(task["block"]):
                self.run_task(sub, file, decided)
            return
        for key in INCLUDES:
            if key in task:
                target = task[key]
                target = target.get("file") if isinstance(target, dict) else target
                self.run_file(str(self.render(target, where, extra)), decided)
                return
        for key in SET_FACT:
            if isinstance(task.get(key), dict):
                for var, expr in task[key].items():
                    try:
                        self.variables[var] = self.render(expr, where, extra)
                    except DeriveError:
                        self.forget(var)  # it needs a result of the running node
                return
        for key in APT:
            args = task.get(key)
            if isinstance(args, dict) and "name" in args and "deb" not in args and args.get("state") != "absent":
                try:
                    names = self.render(args["name"], where, extra)
                except DeriveError:
                    if decided:
                        raise
                    return  # a step for what the node finds itself (its installed kernels)
                names = [names] if isinstance(names, str) else list(names)
                wanted = tuple(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))
                if wanted:
                    self.requests.append((where, wanted))
                return
        for key in REPO:
            args = task.get(key)
            if isinstance(args, dict) and args.get("state", "present") != "absent":
                self.repos.append(self.repository(args, where, extra))
                return

    def repository(self, args: dict[str, Any], where: str, extra: Mapping[str, Any]) -> Repository:
        def listed(value: Any) -> tuple[str, ...]:
            value = self.render(value, where, extra) if value is not None else []
            items = value.split() if isinstance(value, str) else list(value)
            return tuple(str(v) for v in items)

        signed_by = self.render(args.get("signed_by", ""), where, extra)
        return Repository(str(args.get("name", self.role)), listed(args.get("uris")), listed(args.get("suites")),
                          listed(args.get("components")), str(signed_by or "").strip(), self.role)


def _os_image(os_name: str) -> OsImage:
    found = next((facts for name, facts in OS_IMAGES.items() if name == os_name), None)
    if found is None:
        raise DeriveError(f"no OS {os_name!r}; known: {', '.join(sorted(OS_IMAGES))}")
    return found


def _facts(os_name: str, kernel: str) -> dict[str, Any]:
    p = platform(os_name)
    return {
        "distribution": p.distribution, "distribution_major_version": p.major, "distribution_version": p.version,
        "distribution_release": _os_image(os_name).suite, "os_family": "Debian", "architecture": "x86_64",
        "machine": "x86_64", "kernel": kernel, "virtualization_role": "host", "virtualization_type": "",
        "machine_id": "",
    }


def evaluate(roles: Path, run: RoleRun, os_name: str, host: Mapping[str, Any],
             kernel: str) -> tuple[list[tuple[str, tuple[str, ...]]], list[Repository]]:
    """What ``run`` installs and which repositories it adds on a node of ``os_name`` whose
    inventory variables are ``host``: (task, packages) per apt task, and the repositories."""
    base = roles / run.role
    variables: dict[str, Any] = {}
    variables.update(_trust(_load(base / "defaults" / "main.yml") or {}))
    variables.update(host)  # the inventory's data is not templated again (inventory.literal)
    variables.update(_trust(_load(base / "vars" / "main.yml") or {}))
    os_vars = os_vars_path(base / "vars", platform(os_name))
    if os_vars is not None:
        variables.update(_trust(_load(os_vars) or {}))
    variables |= {"ansible_facts": _facts(os_name, kernel), "role_path": str(base), "role_name": run.role,
                  "inventory_hostname": str(host.get("provision_node_name", "node")), "ansible_connection": "ssh",
                  "ansible_check_mode": False, "ansible_virtualization_type": "", "ansible_virtualization_role": "host"}
    assumed = NODE_FACTS.get(run.role, {})
    variables.update(assumed)
    ev = _Eval(roles, run.role, variables, assumed=frozenset(assumed), unknown=set(_registered(roles, run.role)))
    ev.run_file(run.tasks_from)
    return ev.requests, ev.repos


def cluster_variables(m: Manifest) -> dict[str, Any]:
    """Every node's inventory variables from group_vars/all."""
    out: dict[str, Any] = dict(inventory.provision_vars(m))
    for values in registry.cluster_vars(m).values():
        out.update(values)
    return out


def host_variables(m: Manifest, node: Node, cluster: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A node's inventory variables, as ``provision inventory`` writes them (``cluster``:
    :func:`cluster_variables`, computed once for many nodes)."""
    out = dict(cluster if cluster is not None else cluster_variables(m))
    out.update(inventory.node_data(m, node))
    out["provision_node_name"] = node.name
    return out


def wanted(m: Manifest, os_name: str, kernel: str | None = None, root: Path | None = None) -> ProofInput:
    """Every package the roles will install on the manifest's nodes of ``os_name`` (one
    request per apt task and distinct package set, with the nodes and the manifest field),
    and the vendor repositories they add. ``kernel``: the image's kernel release."""
    root = root or content.project_root()
    roles = root / "roles"
    kernel = kernel or DEFAULT_KERNELS[_os_image(os_name).distro]
    runs = [r for book in PLAYBOOKS for r in role_runs(root / "playbooks" / book)]
    grp = inventory.groups(m)
    names = m.node_names()
    members = {r.hosts: set(plan.resolve_pattern(r.hosts, grp, names, names)) for r in runs}
    found: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    named_by: dict[tuple[str, str, tuple[str, ...]], dict[str, str]] = {}
    repos: dict[Repository, None] = {}
    memo: dict[str, tuple[list[tuple[str, tuple[str, ...]]], list[Repository]]] = {}
    cluster = cluster_variables(m)
    for node in m.nodes:
        if node.os != os_name:
            continue
        host = host_variables(m, node, cluster)
        for run in runs:
            if node.name not in members[run.hosts]:
                continue
            if run.when is not None and not _Eval(roles, run.role, dict(host)).holds(run.when):
                continue
            relevant = _role_names(roles, run.role)
            key = json.dumps([run.role, run.tasks_from, {k: v for k, v in host.items() if k in relevant}],
                             sort_keys=True, default=str)
            if key not in memo:
                memo[key] = evaluate(roles, run, os_name, host, kernel)
            requests, added = memo[key]
            overridden = overrides.node_overrides(m, node)
            for task, packages in requests:
                key3 = (run.role, task, packages)
                found.setdefault(key3, []).append(node.name)
                for var, value in overridden.items():
                    if var.startswith(f"{run.role}_"):
                        named = set(_strings(value))
                        for p in packages:
                            if p in named or p.split("=", 1)[0] in named:
                                named_by.setdefault(key3, {})[p] = f"role_vars: {var}"
            repos.update(dict.fromkeys(added))
    requests_out = tuple(
        AptRequest(packages, role, f"roles/{role}/{task}", ROLE_FIELDS.get(role, role), tuple(dict.fromkeys(nodes)),
                   tuple(sorted(named_by.get((role, task, packages), {}).items())))
        for (role, task, packages), nodes in found.items())
    return ProofInput(os_name, kernel, requests_out, tuple(repos))


def image_extras(m: Manifest, os_name: str, root: Path | None = None) -> tuple[str, ...]:
    """The packages of the areas' image roles (:func:`registry.image_roles`) that every node
    deployed from the ``os_name`` image gets, sorted: the image carries them, so that a
    deployed node's first apply finds them installed instead of downloading and unpacking
    them on every new node. A role that adds a vendor repository for these nodes contributes
    nothing (the image's sources are the OS's own). Empty when no node is deployed from it."""
    installer = registry.install()
    deployed = set(installer.image_nodes(m, os_name)) if installer is not None else set()
    if not deployed:
        return ()
    found = wanted(m, os_name, root=root)
    roles = registry.image_roles() - {repo.role for repo in found.repositories}
    gets: dict[str, set[str]] = {}
    for request in found.requests:
        if request.role in roles:
            for package in request.packages:
                gets.setdefault(package, set()).update(request.nodes)
    return tuple(sorted(p for p, nodes in gets.items() if deployed <= nodes))


def os_sources(m: Manifest, os_name: str) -> tuple[str, ...]:
    """The OS's sources a node of ``os_name`` uses: every pocket and component, from the
    manifest's mirror (what a built image carries and the common role writes)."""
    return recipe(os_name, m.cluster.mirrors.apt).sources


def proof_state(m: Manifest, os_name: str, image: Path, sha256: str) -> tuple[proof.Record | None, str | None]:
    """The proof record beside ``image`` and why it does not prove the image for this
    manifest now (None: it does): this image, the sources, every package the roles install."""
    record = proof.read_record(image)
    found = wanted(m, os_name, record.kernel if record else None)
    looked_in = proof.sources(os_sources(m, os_name), found.repositories)
    return record, proof.covers(record, sha256, looked_in, found.packages)
