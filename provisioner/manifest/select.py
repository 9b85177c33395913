"""Node selectors: names, ranges like ``gpu[01-04]`` and ``@role``, resolved to node names.

A selector list is resolved once per manifest node list and kept in the manifest's
:class:`~provisioner.manifest.model.NodeIndex`: per-node code asks "is this node selected?"
(:func:`selects`) in constant time.
"""

from __future__ import annotations

from collections.abc import Iterable

from provisioner.manifest.model import Manifest, NodeIndex
from provisioner.manifest.ranges import RangeError, expand


class SelectorError(ValueError):
    pass


def _resolve(index: NodeIndex, items: tuple[str, ...]) -> tuple[str, ...]:
    known = index.by_name
    wanted: set[str] = set()
    for item in items:
        if item.startswith("@"):
            role = item[1:]
            members = [n.name for n in index.by_role.get(role, ())]
            if not members:
                raise SelectorError(f"{item!r} matches no node (no node has role {role!r})")
            wanted.update(members)
            continue
        try:
            names = expand(item)
        except RangeError as exc:
            raise SelectorError(str(exc)) from None
        unknown = [n for n in names if n not in known]
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise SelectorError(f"unknown node {unknown[0]!r}{more}")
        wanted.update(names)
    return tuple(n for n in index.names if n in wanted)


def _selection(manifest: Manifest, items: Iterable[str]) -> tuple[tuple[str, ...], frozenset[str]]:
    key = tuple(items)
    index = manifest.index()
    found = index.selections.get(key)
    if found is None:
        names = _resolve(index, key)  # errors are not kept: they raise again on the next call
        found = (names, frozenset(names))
        index.selections[key] = found
    return found


def select_nodes(manifest: Manifest, items: Iterable[str]) -> list[str]:
    """Resolve node selectors (names, ranges like gpu[01-04], or @role) to node names.

    Order follows the manifest's node order; unknown names raise SelectorError.
    """
    return list(_selection(manifest, items)[0])


def selects(manifest: Manifest, items: Iterable[str], name: str) -> bool:
    """Whether the selectors pick the node ``name`` (SelectorError as select_nodes)."""
    return name in _selection(manifest, items)[1]
