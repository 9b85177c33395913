"""Pure decisions of the people area: every user's primary group and home, where homes are
made, and what is wrong with the ``users:``/``groups:``/``homes:`` sections.

A user without ``group`` gets a group of their own name with gid = uid (as ``useradd`` does);
``homes.export`` puts homes on that NFS export's server, where they are made with the user as
owner (root there is not squashed); the clients only name them.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.areas.storage.nfs import export_path
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.people import Sssd, User
from provisioner.manifest.source import PathKey
from provisioner.manifest.storage import NfsExport

# accounts the OS and our roles own: a person or group by that name would take them over
SYSTEM_NAMES = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy", "www-data",
    "backup", "list", "irc", "gnats", "nobody", "nogroup", "sshd", "_apt", "messagebus", "systemd-network",
    "systemd-resolve", "systemd-timesync", "syslog", "adm", "sudo", "users", "staff", "docker", "munge", "slurm",
    "mysql", "prometheus", "grafana", "nvidia-persistenced", "ubuntu", "debian",
})


@dataclass(frozen=True)
class Problem:
    path: PathKey
    message: str
    severity: str = "error"


def primary_group(user: User) -> str:
    return user.group if user.group is not None else user.name


def directory(m: Manifest) -> Sssd | None:
    """The directory the nodes join (identity sssd), or None (local identity)."""
    return m.identity.sssd if m.identity.provider == "sssd" else None


def local_users(m: Manifest) -> list[User]:
    """The users made on every node: all of them with local identity; with sssd, those with a
    uid (local accounts beside the directory). The others are directory people."""
    return [u for u in m.users if u.uid is not None]


def directory_people(m: Manifest) -> list[User]:
    """Users the directory holds (identity sssd, no uid): named for Slurm and e-mail, never made."""
    return [u for u in m.users if u.uid is None] if directory(m) is not None else []


def primary_gid(m: Manifest, user: User) -> int:
    if user.group is None:
        if user.uid is None:
            raise KeyError(f"{user.name} is a directory person: the directory gives the gid")
        return user.uid
    for group in m.groups:
        if group.name == user.group:
            return group.gid
    raise KeyError(user.group)


def home_of(m: Manifest, user: User) -> str:
    return f"{m.homes.path.rstrip('/')}/{user.name}" if m.homes.path != "/" else f"/{user.name}"


def home_export(m: Manifest) -> NfsExport | None:
    if m.homes.export is None:
        return None
    return next((e for e in m.nfs.exports if e.name == m.homes.export), None)


def home_root_on(m: Manifest, node: Node) -> str:
    """Where ``node`` makes the homes: the export's directory on its NFS server, ``homes.path``
    on every node with local homes, "" on an NFS client (its homes are made on the server)."""
    export = home_export(m)
    if m.homes.export is None:
        return m.homes.path
    if export is None or export.node != node.name:
        return ""
    return export_path(m, export)


def _private_groups(m: Manifest) -> list[tuple[int, User]]:
    return [(i, u) for i, u in enumerate(m.users) if u.group is None and u.uid is not None]


def id_problems(m: Manifest) -> list[Problem]:
    """Names and ids that clash: two users or groups with one name or id, a user's own group
    (gid = uid) on a declared group's name or gid, a person named like an admin or with an
    admin's uid."""
    out: list[Problem] = []
    names: dict[str, str] = {}
    uids: dict[int, str] = {}
    for a in m.cluster.admin_users:
        names[a.name] = f"admin user {a.name!r}"
        if a.uid is not None:
            uids[a.uid] = f"admin user {a.name!r}"
    for i, user in enumerate(m.users):
        if user.name in SYSTEM_NAMES:
            out.append(Problem(("users", i, "name"), f"{user.name!r} is a system account's name: choose another"))
        if user.name in names:
            out.append(Problem(("users", i, "name"), f"{user.name!r} is already {names[user.name]}"))
        else:
            names[user.name] = f"users[{i}]"
        if user.uid is None:
            continue
        if user.uid in uids:
            out.append(Problem(("users", i, "uid"), f"uid {user.uid} of {user.name!r} is already {uids[user.uid]}'s"))
        else:
            uids[user.uid] = f"{user.name!r}"
    group_names: dict[str, str] = {}
    gids: dict[int, str] = {}
    for i, group in enumerate(m.groups):
        if group.name in SYSTEM_NAMES:
            out.append(Problem(("groups", i, "name"), f"{group.name!r} is a system group's name: choose another"))
        if group.name in group_names:
            out.append(Problem(("groups", i, "name"), f"group {group.name!r} is declared twice"))
        group_names.setdefault(group.name, f"group {group.name!r}")
        if group.gid in gids:
            out.append(Problem(("groups", i, "gid"),
                               f"gid {group.gid} of group {group.name!r} is already {gids[group.gid]}'s"))
        gids.setdefault(group.gid, f"group {group.name!r}")
    for i, user in _private_groups(m):
        if user.name in group_names:
            out.append(Problem(("users", i, "name"), f"{user.name!r} has no group: its own group would be "
                               f"{group_names[user.name]} (set group: to use it)"))
        elif user.uid in gids:
            out.append(Problem(("users", i, "uid"), f"{user.name!r} has no group: its own group would take "
                               f"gid {user.uid}, already {gids[user.uid]}'s (set group:, or another uid)"))
    return out


def group_problems(m: Manifest) -> list[Problem]:
    """A user's primary or extra group that ``groups:`` does not declare."""
    declared = {g.name for g in m.groups}
    out: list[Problem] = []
    for i, user in enumerate(m.users):
        if user.group is not None and user.group not in declared:
            out.append(Problem(("users", i, "group"), f"{user.name!r}: group {user.group!r} is not in groups:"))
        for j, extra in enumerate(user.groups):
            if extra not in declared:
                out.append(Problem(("users", i, "groups", j),
                                   f"{user.name!r}: group {extra!r} is not in groups:"))
    return out


def home_problems(m: Manifest) -> list[Problem]:
    """``homes.export`` that names no export; an export of homes no node mounts at ``homes.path``."""
    if m.homes.export is None:
        return []
    export = home_export(m)
    names = sorted(e.name for e in m.nfs.exports)
    if export is None:
        return [Problem(("homes", "export"), f"no nfs.exports entry is named {m.homes.export!r} "
                        f"(exports: {', '.join(names) or 'none'})")]
    if not any(mnt.export == export.name and mnt.path == m.homes.path for mnt in m.nfs.mounts):
        return [Problem(("homes", "export"), f"no nfs.mounts entry mounts {export.name!r} at {m.homes.path}: "
                        "users' homes will be missing on the nodes that log them in", "warning")]
    return []


# a directory person's settings that only a local account has: the directory holds them
_LOCAL_ONLY = ("group", "groups", "ssh_keys", "shell", "comment", "state")


def identity_problems(m: Manifest) -> list[Problem]:
    """What validate can tell of accounts and the directory without asking it. Local identity:
    every user needs a uid. sssd: a local user or group (one with a uid or gid, admins
    included) inside ``id_range`` could take a directory person's id (sssd ignores directory
    entries outside that range, so ids outside it never meet); a directory person (no uid)
    with a local account's settings, which the directory holds instead. A local user whose
    *name* the directory also holds cannot be seen here: ``files`` comes first in nsswitch,
    so the local account would win; the verify check names what each user resolves to."""
    sssd = directory(m)
    if sssd is None:
        return [Problem(("users", i), f"{u.name!r} needs a uid (identity.provider is local: every user is "
                        "made on the nodes)") for i, u in enumerate(m.users) if u.uid is None]
    first, last = sssd.id_range.first, sssd.id_range.last
    span = f"identity.sssd.id_range {first}..{last}, the directory's ids"
    out: list[Problem] = []
    for i, a in enumerate(m.cluster.admin_users):
        if a.uid is not None and first <= a.uid <= last:
            out.append(Problem(("cluster", "admin_users", i, "uid"),
                               f"uid {a.uid} of admin user {a.name!r} is inside {span}: choose a uid outside it"))
    for i, u in enumerate(m.users):
        if u.uid is not None and first <= u.uid <= last:
            out.append(Problem(("users", i, "uid"), f"uid {u.uid} of local user {u.name!r} is inside {span}: "
                               "choose a uid outside it, or leave uid out to take the person from the directory"))
        if u.uid is None:
            for key in _LOCAL_ONLY:
                if key in u.model_fields_set:
                    out.append(Problem(("users", i, key), f"{u.name!r} has no uid, so is a directory person: their "
                                       f"{key} comes from the directory (give a uid to make a local account)"))
    for i, g in enumerate(m.groups):
        if first <= g.gid <= last:
            out.append(Problem(("groups", i, "gid"), f"gid {g.gid} of local group {g.name!r} is inside {span}: "
                               "choose a gid outside it"))
    if sssd.probe is None and not directory_people(m):
        out.append(Problem(("identity", "sssd"), "no directory person in users: and no identity.sssd.probe: verify "
                           "can see that sssd runs, not that the directory answers; name a user or group the "
                           "directory always holds in identity.sssd.probe", "warning"))
    return out


def problems(m: Manifest) -> list[Problem]:
    return id_problems(m) + group_problems(m) + home_problems(m) + identity_problems(m)
