"""The manifest's escape hatch: role variables per cluster, role or node (``role_vars``).

Most role variables are generated from the manifest (provisioner/areas/*/rolevars.py). The
others keep their role defaults unless the manifest sets them here::

    role_vars:
      all:                      # every node
        nvidia_driver_hold: false
      "@compute":               # the nodes of a role
        docker_log_max_size: 50m
      gpu[01-02]:               # nodes by name or range
        nccl_tests_enabled: true

A variable set for a node by more than one key takes the most specific: a node's own key
over a role's over ``all``; two keys of the same kind setting it for one node are an error.
``provision validate`` checks every name and value against the roles'
``meta/argument_specs.yml``, refuses variables the manifest already generates (change the
manifest instead) and anything secret (the inventory never holds secrets). The inventory
writes each node's resolved variables into its host_vars.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner.areas import registry
from provisioner.errors import Diagnostic
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import SelectorError, select_nodes
from provisioner.manifest.source import Source
from provisioner.platforms import NODE_ROLES

SECTION = "role_vars"
# names that hold secrets; the inventory (and so this section) never does
SECRET_NAME_RE = re.compile(r"(password|passwd|secret|token|credential|private_key|_pass$)", re.IGNORECASE)
LEVELS = ("all", "role", "node")  # least to most specific


@dataclass(frozen=True)
class VarSpec:
    """One variable of a role's argument_specs.yml (the parts checked here)."""

    role: str
    type: str = "str"
    choices: tuple[Any, ...] | None = None
    elements: str | None = None
    no_log: bool = False


@functools.lru_cache(maxsize=4)
def load_specs(roles_dir: Path) -> dict[str, VarSpec]:
    """Every variable declared in ``roles_dir/*/meta/argument_specs.yml`` (all entry points)."""
    specs: dict[str, VarSpec] = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for path in sorted(roles_dir.glob("*/meta/argument_specs.yml")):
        role = path.parent.parent.name
        data = yaml.load(path.read_text(), Loader=loader) or {}
        for entry in (data.get("argument_specs") or {}).values():
            for name, opt in ((entry or {}).get("options") or {}).items():
                opt = opt or {}
                choices = opt.get("choices")
                specs.setdefault(name, VarSpec(
                    role=role, type=str(opt.get("type") or "str"),
                    choices=tuple(choices) if isinstance(choices, list) else None,
                    elements=opt.get("elements"), no_log=bool(opt.get("no_log")),
                ))
    return specs


def level(key: str) -> str:
    if key == "all":
        return "all"
    return "role" if key.startswith("@") else "node"


def selected(m: Manifest, key: str) -> list[str]:
    """The nodes a role_vars key selects (raises SelectorError for a bad key)."""
    return m.node_names() if key == "all" else select_nodes(m, [key])


def node_overrides(m: Manifest, node: Node) -> dict[str, Any]:
    """``node``'s resolved role_vars: the most specific key wins (see the module docstring;
    validate refuses ambiguous ones, so the order among equals is only a tie-break)."""
    if not m.role_vars:
        return {}
    return dict(resolved(m).get(node.name, {}))


_LAST: tuple[Manifest, dict[str, dict[str, Any]]] | None = None  # (manifest, its resolution)


def resolved(m: Manifest) -> dict[str, dict[str, Any]]:
    """Every node's role_vars, resolved once per manifest (the plan and the inventory ask
    per node; selectors over a large cluster are not free)."""
    global _LAST
    if _LAST is not None and _LAST[0] is m:
        return _LAST[1]
    out: dict[str, dict[str, Any]] = {name: {} for name in m.node_names()}
    for lvl in LEVELS:
        for key, values in m.role_vars.items():
            if level(key) != lvl:
                continue
            try:
                names = selected(m, key)
            except SelectorError:
                continue
            for name in names:
                out[name].update(values or {})
    _LAST = (m, out)
    return out


def _type_problem(value: Any, spec: VarSpec) -> str | None:
    kind = spec.type
    ok = {
        "str": isinstance(value, (str, int, float)) and not isinstance(value, bool),
        "path": isinstance(value, str),
        "int": (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, str) and value.strip().lstrip("-").isdigit()),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "list": isinstance(value, list),
        "dict": isinstance(value, dict),
    }.get(kind, True)  # raw, json, bits, bytes: Ansible's own check at run time
    if not ok:
        return f"must be of type {kind} (role {spec.role}), not {type(value).__name__}"
    items = value if kind == "list" else [value]
    if kind == "list" and spec.elements:
        for item in items:
            problem = _type_problem(item, VarSpec(spec.role, spec.elements))
            if problem is not None:
                return f"every element {problem}"
    if spec.choices is not None:
        bad = [item for item in items if item not in spec.choices]
        if bad:
            return f"{bad[0]!r} is not one of {', '.join(map(str, spec.choices))} (role {spec.role})"
    return None


def generated_names(m: Manifest) -> set[str]:
    """Role variables the inventory already writes from the manifest (any node)."""
    names: set[str] = set()
    for values in registry.cluster_vars(m).values():
        names |= set(values)
    for node in m.nodes:
        names |= set(registry.node_vars(m, node))
    return names


def _pairs(m: Manifest) -> Iterator[tuple[str, str, Any]]:
    for key, values in m.role_vars.items():
        for name, value in (values or {}).items():
            yield key, name, value


def check(m: Manifest, src: Source, specs: dict[str, VarSpec]) -> list[Diagnostic]:
    """Every problem of the role_vars section, positioned at the key or variable."""
    if not m.role_vars:
        return []
    out: list[Diagnostic] = []
    members: dict[str, list[str]] = {}
    for key in m.role_vars:
        if key.startswith("@") and key[1:] not in NODE_ROLES:
            out.append(src.diag((SECTION, key), f"{key!r}: not a role; roles are {', '.join(NODE_ROLES)}"))
            continue
        try:
            members[key] = selected(m, key)
        except SelectorError as exc:
            out.append(src.diag((SECTION, key), f"{key!r}: {exc}; keys are 'all', '@<role>' or node names "
                                                 "and ranges"))
    generated = generated_names(m) if any(name in specs for _k, name, _v in _pairs(m)) else set()
    for key, name, value in _pairs(m):
        where = (SECTION, key, name)
        spec = specs.get(name)
        if SECRET_NAME_RE.search(name) or (spec is not None and spec.no_log):
            out.append(src.diag(where, f"{name}: secrets never go into the manifest or the inventory; "
                                       "give the role a file or environment variable reference instead"))
            continue
        if spec is None:
            close = difflib.get_close_matches(name, list(specs), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            out.append(src.diag(where, f"{name}: no role declares this variable in its "
                                       f"meta/argument_specs.yml{hint}"))
            continue
        if name in generated:
            out.append(src.diag(where, f"{name}: generated from the manifest for role {spec.role}; change the "
                                       "manifest's own field for it instead (see docs/design.md, 'Role variables')"))
            continue
        problem = _type_problem(value, spec)
        if problem is not None:
            out.append(src.diag(where, f"{name}: {problem}"))
    # the same variable for one node from two keys of the same kind
    setters: dict[tuple[str, str, str], str] = {}
    reported: set[tuple[str, str]] = set()
    for key, name, _value in _pairs(m):
        for node in members.get(key, []):
            slot = (node, name, level(key))
            first = setters.setdefault(slot, key)
            if first != key and (key, name) not in reported:
                reported.add((key, name))
                out.append(src.diag((SECTION, key, name), f"{name}: set for {node} by both {first!r} and "
                                                          f"{key!r}; set it on a more specific key (the node)"))
    return out
