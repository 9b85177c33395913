"""Variables for the ``users`` role: the same users and groups on every node; where homes are made."""

from __future__ import annotations

from typing import Any

from provisioner.areas.people.decide import home_of, home_root_on, primary_gid, primary_group
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


def cluster_vars(m: Manifest) -> dict[str, Any]:
    return {
        # the declared groups, then each user's own group (a user without group:, gid = uid)
        "users_groups": [{"name": g.name, "gid": g.gid} for g in m.groups]
        + [{"name": u.name, "gid": u.uid} for u in m.users if u.group is None],
        "users_people": [
            {"name": u.name, "uid": u.uid, "group": primary_group(u), "gid": primary_gid(m, u),
             "groups": list(u.groups), "ssh_keys": list(u.ssh_keys), "shell": u.shell, "comment": u.comment,
             "state": u.state, "home": home_of(m, u)}
            for u in m.users
        ],
        "users_home_mode": m.homes.mode if len(m.homes.mode) == 4 else f"0{m.homes.mode}",
    }


# the role is light (a play on every node, every apply): all its cluster-wide variables are
LIGHT_KEYS = frozenset({"users_groups", "users_people", "users_home_mode"})


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """Where the node makes homes; nothing without users (states recorded before the area
    existed stay unchanged: provisioner.plan)."""
    return {"users_home_root": home_root_on(m, node)} if m.users else {}
