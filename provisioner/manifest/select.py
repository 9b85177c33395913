"""Node selectors: names, ranges like ``gpu[01-04]`` and ``@role``, resolved to node names."""

from __future__ import annotations

from collections.abc import Iterable

from provisioner.manifest.model import Manifest
from provisioner.manifest.ranges import RangeError, expand


class SelectorError(ValueError):
    pass


def select_nodes(manifest: Manifest, items: Iterable[str]) -> list[str]:
    """Resolve node selectors (names, ranges like gpu[01-04], or @role) to node names.

    Order follows the manifest's node order; unknown names raise SelectorError.
    """
    known = manifest.node_names()
    wanted: set[str] = set()
    for item in items:
        if item.startswith("@"):
            role = item[1:]
            members = [n.name for n in manifest.nodes if role in n.roles]
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
    return [n for n in known if n in wanted]

