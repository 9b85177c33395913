"""The people area's verify check: the manifest's users and groups on a node, with their ids."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.areas.people.decide import directory, directory_people, home_of, primary_gid
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.people import User
from provisioner.nodecheck.check import Check, CheckList, NodeChecks, Outcome, judged
from provisioner.nodecheck.parsers import ParseError


@dataclass(frozen=True)
class Accounts:
    users: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # name -> (uid, gid, home)
    groups: dict[str, int] = field(default_factory=dict)  # name -> gid


def parse_getent(text: str) -> Accounts:
    """``getent passwd NAMES; getent group NAMES``: passwd lines have 7 fields, group lines 4."""
    users: dict[str, tuple[int, int, str]] = {}
    groups: dict[str, int] = {}
    for line in text.splitlines():
        cells = line.split(":")
        if len(cells) not in (4, 7):
            if line.strip():
                raise ParseError(f"not a passwd or group line: {line!r}")
            continue
        if not all(c.isdigit() for c in cells[2:4 if len(cells) == 7 else 3]):
            raise ParseError(f"an id that is not a number: {line!r}")
        if len(cells) == 7:
            users[cells[0]] = (int(cells[2]), int(cells[3]), cells[5])
        else:
            groups[cells[0]] = int(cells[2])
    return Accounts(users, groups)


def command(m: Manifest) -> str:
    users = " ".join(shlex.quote(u.name) for u in m.users)
    groups = " ".join(shlex.quote(g.name) for g in m.groups)
    # getent exits 2 when a name is missing: the verdict names it, so the status is not the test
    return "; ".join(part for part in (f"getent passwd {users}" if users else "",
                                       f"getent group {groups}" if groups else "") if part) + "; true"


def _directory_person(m: Manifest, user: User, got: tuple[int, int, str] | None) -> str:
    """What is wrong with a directory person as the node resolves them ("" when right): they
    resolve (sssd reached the directory over TLS), with an id in ``id_range`` (not a local
    account of that name) and their home under ``homes.path``."""
    d = directory(m)
    assert d is not None
    name = user.name
    if got is None:
        return f"no user {name} (not in the directory, or sssd cannot reach it)"
    first, last = d.id_range.first, d.id_range.last
    if not first <= got[0] <= last:
        return f"{name} is uid {got[0]}, outside the directory's id_range {first}..{last} (a local account?)"
    home = home_of(m, user)
    if got[2] != home:
        return f"{name} has home {got[2]}, not {home}"
    return ""


def ids_verdict(m: Manifest) -> Callable[[Accounts], Outcome]:
    def verdict(found: Accounts) -> Outcome:
        wrong: list[str] = []
        people = 0
        for u in m.users:
            got = found.users.get(u.name)
            if u.uid is None:  # identity sssd: a directory person
                people += 1
                if problem := _directory_person(m, u, got):
                    wrong.append(problem)
                continue
            want = (u.uid, primary_gid(m, u), home_of(m, u))
            if got is None:
                wrong.append(f"no user {u.name}")
            elif got != want:
                wrong.append(f"{u.name} is uid {got[0]} gid {got[1]} home {got[2]}, not {want[0]} {want[1]} {want[2]}")
        for g in m.groups:
            gid = found.groups.get(g.name)
            if gid != g.gid:
                wrong.append(f"no group {g.name}" if gid is None else f"group {g.name} is gid {gid}, not {g.gid}")
        if wrong:
            return Outcome("FAIL", "; ".join(wrong[:4]) + (f" (+{len(wrong) - 4} more)" if len(wrong) > 4 else ""))
        if people:
            return Outcome("PASS", f"{len(m.users) - people} users, {len(m.groups)} groups with the manifest's ids; "
                           f"{people} directory people resolved through sssd")
        return Outcome("PASS", f"{len(m.users)} users, {len(m.groups)} groups with the manifest's ids")
    return verdict


# --------------------------------------------------------------------------- identity sssd
LOOKUP_TIMEOUT_S = 20  # one lookup through sssd; its own LDAP timeouts are shorter (role sssd)


def probe_name(m: Manifest) -> str | None:
    """The name verify looks up in the directory: ``identity.sssd.probe``, else the first
    directory person the manifest names, else none."""
    d = directory(m)
    if d is None:
        return None
    if d.probe is not None:
        return d.probe
    people = directory_people(m)
    return people[0].name if people else None


def directory_command(name: str | None) -> str:
    """Whether sssd runs, then ``name`` through sssd alone (``getent -s sss``: a local account
    of that name is not an answer), as a user, else as a group; each lookup bounded."""
    parts = ['systemctl is-active sssd; echo "sssd rc=$?"']
    if name is not None:
        q = shlex.quote(name)
        # the group only when no user has the name (getent's 2): a hung directory costs one bound
        parts += [f'timeout {LOOKUP_TIMEOUT_S} getent -s sss passwd {q}; r=$?; echo "passwd rc=$r"',
                  f'if [ $r -eq 2 ]; then timeout {LOOKUP_TIMEOUT_S} getent -s sss group {q}; echo "group rc=$?"; fi']
    return "; ".join(parts)


@dataclass(frozen=True)
class DirectoryProbe:
    sssd: str  # systemctl's word: active, inactive, failed, ...
    found: tuple[str, int] | None = None  # ("user" | "group", its id) when the name resolved
    timed_out: bool = False  # a lookup ran into its bound


def parse_directory(text: str) -> DirectoryProbe:
    lines = text.splitlines()
    rc = re.search(r"^sssd rc=(\d+)$", text, re.MULTILINE)
    if not rc:
        raise ParseError("no 'sssd rc=N' line")
    state = next((ln.strip() for ln in lines if ln.strip() and not ln.startswith("sssd rc=")), "")
    found: tuple[str, int] | None = None
    for line in lines:
        cells = line.split(":")
        if len(cells) == 7 and cells[2].isdigit():
            found = found or ("user", int(cells[2]))
        elif len(cells) == 4 and cells[2].isdigit() and found is None:
            found = ("group", int(cells[2]))
    timed_out = bool(re.search(rf"^(passwd|group) rc={TIMED_OUT}$", text, re.MULTILINE))
    return DirectoryProbe(state.split()[0] if state else "unknown", found, timed_out)


TIMED_OUT = 124  # timeout(1)'s status when the command ran past its bound


def directory_verdict(m: Manifest, name: str | None) -> Callable[[DirectoryProbe], Outcome]:
    d = directory(m)
    assert d is not None

    def verdict(p: DirectoryProbe) -> Outcome:
        if p.sssd != "active":
            return Outcome("FAIL", f"sssd is {p.sssd}, not running: nobody from the directory can log in")
        if name is None:
            return Outcome("SKIP", "sssd runs; nothing to look up in the directory: the manifest names no directory "
                                   "person (name one in users:, or identity.sssd.probe)")
        if p.found is None:
            if p.timed_out:
                return Outcome("FAIL", f"looking up {name} through sssd took over {LOOKUP_TIMEOUT_S} s: "
                                       "the directory does not answer")
            return Outcome("FAIL", f"sssd does not know {name}: the directory is unreachable (network, TLS, bind) "
                                   "or lacks it")
        kind, ident = p.found
        first, last = d.id_range.first, d.id_range.last
        if not first <= ident <= last:
            return Outcome("FAIL", f"{name} is {'uid' if kind == 'user' else 'gid'} {ident}, outside the "
                                   f"directory's id_range {first}..{last}")
        return Outcome("PASS", f"sssd runs; {kind} {name} ({'uid' if kind == 'user' else 'gid'} {ident}) "
                               "resolves from the directory")
    return verdict


def checks(m: Manifest) -> NodeChecks:
    """Every node, when the manifest has users or groups: ``users``; with identity sssd:
    ``identity.directory``, whether or not the manifest names anyone from the directory."""

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        if m.users or m.groups:
            out.add("users", command(m), judged(parse_getent, ids_verdict(m)))
        if directory(m) is not None:
            name = probe_name(m)
            out.add("identity.directory", directory_command(name), judged(parse_directory, directory_verdict(m, name)))
        return out.checks

    return node_checks
