"""Variables for the ``users`` and ``sssd`` roles: the same users and groups on every node;
where homes are made; the directory the nodes join (identity sssd)."""

from __future__ import annotations

from typing import Any

from provisioner.areas.people.decide import (
    directory,
    directory_people,
    home_of,
    home_root_on,
    local_users,
    primary_gid,
    primary_group,
)
from provisioner.areas.people.secrets import bind_password_var
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


def cluster_vars(m: Manifest) -> dict[str, Any]:
    users = local_users(m)
    out: dict[str, Any] = {
        # the declared groups, then each user's own group (a user without group:, gid = uid)
        "users_groups": [{"name": g.name, "gid": g.gid} for g in m.groups]
        + [{"name": u.name, "gid": u.uid} for u in users if u.group is None],
        "users_people": [
            {"name": u.name, "uid": u.uid, "group": primary_group(u), "gid": primary_gid(m, u),
             "groups": list(u.groups), "ssh_keys": list(u.ssh_keys), "shell": u.shell, "comment": u.comment,
             "state": u.state, "home": home_of(m, u)}
            for u in users
        ],
        "users_home_mode": m.homes.mode if len(m.homes.mode) == 4 else f"0{m.homes.mode}",
    }
    # only with a directory: a cluster with local identity keeps its variables (and fingerprints)
    if directory(m) is not None:
        out["users_directory_people"] = [{"name": u.name, "home": home_of(m, u)} for u in directory_people(m)]
        out.update(sssd_vars(m))
    return out


def sssd_vars(m: Manifest) -> dict[str, Any]:
    """The ``sssd`` role's variables: the directory, its CA and bind secret as paths on the
    control machine (the role reads the secret in tasks that log nothing), homes at
    ``homes.path``/<user> whatever the directory says, pam_mkhomedir only with local homes."""
    d = directory(m)
    if d is None:
        return {}
    has_password = d.bind_password_env is not None or d.bind_password_file is not None
    return {
        "sssd_enabled": True,
        "sssd_ldap_uris": list(d.uris),
        "sssd_start_tls": d.start_tls,
        "sssd_search_base": d.search_base,
        "sssd_user_search_base": d.user_search_base or "",
        "sssd_group_search_base": d.group_search_base or "",
        "sssd_ca_file": d.ca_file,
        "sssd_bind_dn": d.bind_dn or "",
        "sssd_bind_password_file": bind_password_var() if has_password else "",
        "sssd_min_id": d.id_range.first,
        "sssd_max_id": d.id_range.last,
        "sssd_schema": d.ldap_schema,
        "sssd_access_filter": d.access_filter or "",
        "sssd_home_dir": f"{m.homes.path.rstrip('/')}/%u" if m.homes.path != "/" else "/%u",
        "sssd_mkhomedir": m.homes.export is None,
    }


# the roles are light (a play on every node, every apply): all their cluster-wide variables are
LIGHT_KEYS = frozenset({
    "users_groups", "users_people", "users_home_mode", "users_directory_people",
    "sssd_enabled", "sssd_ldap_uris", "sssd_start_tls", "sssd_search_base", "sssd_user_search_base",
    "sssd_group_search_base", "sssd_ca_file", "sssd_bind_dn", "sssd_bind_password_file", "sssd_min_id",
    "sssd_max_id", "sssd_schema", "sssd_access_filter", "sssd_home_dir", "sssd_mkhomedir",
})


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """Where the node makes homes; nothing without users (states recorded before the area
    existed stay unchanged: provisioner.plan)."""
    return {"users_home_root": home_root_on(m, node)} if m.users else {}
