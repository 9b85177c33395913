"""Fair share, declared: the accounts tree, users' associations and QOS of ``slurm:`` and
``users:`` against what slurmdbd holds (``sacctmgr --parsable2 --noheader show ...``), as
adds, changes and removals, each with the sacctmgr command that makes it so.

Pure: the parsers read recorded output (tests/areas/slurm/data/), :func:`drift` compares,
:func:`commands` turns the drift into sacctmgr argv lists. Managed only when the manifest
declares ``slurm.accounts``; root's account and user and the ``normal`` QOS are never touched,
and an association with running or pending jobs is never removed (:func:`drift` says so and
leaves it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from provisioner.manifest.model import Manifest

# what `sacctmgr show` prints, in this order (the role asks for exactly these:
# :func:`read_commands`, which tests/areas/slurm checks against roles/slurm/tasks/fairshare.yml)
QOS_FORMAT = "Name,Priority,MaxTRESPU,MaxJobsPU,MaxWall,Preempt"
ASSOC_FORMAT = "Account,User,ParentName,Share,QOS,DefaultQOS"
USER_FORMAT = "User,DefaultAccount"
JOBS_FORMAT = "%u|%a"  # squeue --noheader --format (running and pending jobs)
JOB_STATES = "PENDING,RUNNING,SUSPENDED,CONFIGURING,COMPLETING"

KEEP_ACCOUNTS = frozenset({"root"})
KEEP_USERS = frozenset({"root"})
KEEP_QOS = frozenset({"normal"})


class ParseError(ValueError):
    pass


@dataclass(frozen=True)
class Qos:
    name: str
    priority: int = 0
    max_tres_per_user: str = ""  # "cpu=8,gres/gpu=2", sorted
    max_jobs_per_user: str = ""
    max_wall_minutes: str = ""
    preempt: str = ""  # "a,b", sorted


@dataclass(frozen=True)
class Account:
    name: str
    parent: str
    fairshare: int
    qos: str  # "a,b", sorted
    default_qos: str


@dataclass(frozen=True)
class Assoc:
    user: str
    account: str


@dataclass
class Holdings:
    """What slurmdbd holds, or what the manifest wants."""

    qos: dict[str, Qos] = field(default_factory=dict)
    accounts: dict[str, Account] = field(default_factory=dict)
    assocs: set[Assoc] = field(default_factory=set)
    default_account: dict[str, str] = field(default_factory=dict)


Kind = Literal["add", "change", "remove", "kept"]


@dataclass(frozen=True)
class Change:
    kind: Kind
    what: Literal["qos", "account", "user"]
    name: str  # QOS or account name; "user/account" for an association
    detail: str
    argv: tuple[str, ...] = ()  # the sacctmgr command; () for kept

    def line(self) -> str:
        sign = {"add": "+", "change": "~", "remove": "-", "kept": "!"}[self.kind]
        return f"{sign} {self.what} {self.name}: {self.detail}"


# --------------------------------------------------------------------------- parsing
def wall_minutes(text: str) -> str:
    """A Slurm time as whole minutes ("" for none or unlimited): 90, 01:30:00, 1-00:00:00."""
    text = text.strip()
    if text in ("", "INFINITE", "UNLIMITED"):
        return ""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if m is None:
        raise ParseError(f"{text!r} is not a Slurm time")
    days, a, b, c = (int(g) if g else None for g in m.groups())
    assert a is not None
    if days is None:  # M, M:S or H:M:S
        hours, minutes, seconds = (0, a, b or 0) if c is None else (a, b or 0, c)
    else:  # D-H, D-H:M or D-H:M:S
        hours, minutes, seconds = a, b or 0, c or 0
    total = (days or 0) * 1440 + hours * 60 + minutes + (1 if seconds else 0)  # whole minutes, rounded up
    return str(total)


def _sorted_list(text: str) -> str:
    return ",".join(sorted(p for p in text.strip().split(",") if p))


def _rows(text: str, width: int, what: str) -> list[list[str]]:
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != width:
            raise ParseError(f"sacctmgr {what}, line {n}: {width} fields expected, got {len(parts)}: {line!r}")
        rows.append(parts)
    return rows


def parse_qos(text: str) -> dict[str, Qos]:
    """``sacctmgr -P -n show qos format=`` :data:`QOS_FORMAT`."""
    out: dict[str, Qos] = {}
    for name, priority, tres, jobs, wall, preempt in _rows(text, 6, "show qos"):
        out[name] = Qos(name, int(priority or 0), _sorted_list(tres), jobs, wall_minutes(wall), _sorted_list(preempt))
    return out


def parse_assocs(text: str) -> tuple[dict[str, Account], set[Assoc]]:
    """``sacctmgr -P -n show assoc format=`` :data:`ASSOC_FORMAT` (one cluster): accounts
    (rows without a user) and user associations."""
    accounts: dict[str, Account] = {}
    assocs: set[Assoc] = set()
    for account, user, parent, share, qos, default_qos in _rows(text, 6, "show assoc"):
        if user:
            assocs.add(Assoc(user, account))
        else:
            fairshare = int(share) if share.lstrip("-").isdigit() else 1
            accounts[account] = Account(account, parent, fairshare, _sorted_list(qos), default_qos)
    return accounts, assocs


def parse_users(text: str) -> dict[str, str]:
    """``sacctmgr -P -n show user format=`` :data:`USER_FORMAT`: user -> default account."""
    return {user: default for user, default in _rows(text, 2, "show user")}


def parse_jobs(text: str) -> set[Assoc]:
    """``squeue --noheader --states=RUNNING,PENDING,SUSPENDED --format`` :data:`JOBS_FORMAT`."""
    return {Assoc(user, account) for user, account in _rows(text, 2, "squeue")}


def held(qos_text: str, assoc_text: str, user_text: str) -> Holdings:
    accounts, assocs = parse_assocs(assoc_text)
    return Holdings(parse_qos(qos_text), accounts, assocs, parse_users(user_text))


# --------------------------------------------------------------------------- the manifest's
def managed(m: Manifest) -> bool:
    return m.slurm.enabled and m.slurm.accounting and bool(m.slurm.accounts)


def wanted(m: Manifest) -> Holdings:
    want = Holdings()
    for q in m.slurm.qos:
        tres = ([f"cpu={q.max_cpus_per_user}"] if q.max_cpus_per_user is not None else []) + (
            [f"gres/gpu={q.max_gpus_per_user}"] if q.max_gpus_per_user is not None else [])
        want.qos[q.name] = Qos(q.name, q.priority, ",".join(sorted(tres)),
                               "" if q.max_jobs_per_user is None else str(q.max_jobs_per_user),
                               wall_minutes(q.max_wall or ""), ",".join(sorted(q.preempt)))
    for a in m.slurm.accounts:
        want.accounts[a.name] = Account(a.name, a.parent, a.fairshare, ",".join(sorted(a.qos or ["normal"])),
                                        a.default_qos or "")
    for u in m.users:
        if u.account is None:
            continue
        want.default_account[u.name] = u.account
        for account in dict.fromkeys([u.account, *u.accounts]):
            want.assocs.add(Assoc(u.name, account))
    return want


def problems(m: Manifest) -> list[tuple[tuple[str | int, ...], str]]:
    """(manifest path, message) for accounts, QOS and users' accounts that do not fit."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    s = m.slurm
    if (s.accounts or s.qos) and not s.accounting:
        out.append((("slurm", "accounts" if s.accounts else "qos"),
                    "accounts and QOS live in slurmdbd: they need slurm.accounting: true"))
    accounts = {a.name: a for a in s.accounts}
    qos = {q.name for q in s.qos} | KEEP_QOS
    names = [a.name for a in s.accounts]
    tree = {k: Account(k, v.parent, 1, "", "") for k, v in accounts.items()}
    for i, a in enumerate(s.accounts):
        if names.index(a.name) != i:
            out.append((("slurm", "accounts", i, "name"), f"account {a.name!r} is declared twice"))
        if a.name in KEEP_ACCOUNTS:
            out.append((("slurm", "accounts", i, "name"), "'root' is Slurm's own top account: name yours"))
        elif a.parent not in accounts and a.parent not in KEEP_ACCOUNTS:
            out.append((("slurm", "accounts", i, "parent"),
                        f"{a.name!r}: parent {a.parent!r} is not in slurm.accounts"))
        elif a.name in _ancestors(tree, a.parent):
            out.append((("slurm", "accounts", i, "parent"), f"{a.name!r}: its parents lead back to it"))
        for j, name in enumerate(a.qos):
            if name not in qos:
                out.append((("slurm", "accounts", i, "qos", j), f"{a.name!r}: QOS {name!r} is not in slurm.qos"))
        if a.default_qos is not None and a.default_qos not in (a.qos or ["normal"]):
            out.append((("slurm", "accounts", i, "default_qos"),
                        f"{a.name!r}: default QOS {a.default_qos!r} is not one of its qos"))
    for i, q in enumerate(s.qos):
        if [r.name for r in s.qos].index(q.name) != i or q.name in KEEP_QOS:
            out.append((("slurm", "qos", i, "name"), f"QOS {q.name!r} is declared twice (normal is Slurm's own)"))
        for j, name in enumerate(q.preempt):
            if name not in qos or name == q.name:
                out.append((("slurm", "qos", i, "preempt", j), f"{q.name!r} cannot preempt {name!r}"))
    for i, u in enumerate(m.users):
        if u.accounts and u.account is None:
            out.append((("users", i, "accounts"), f"{u.name!r}: accounts without a default account (account:)"))
        for path, name in ([(("users", i, "account"), u.account)] if u.account is not None else []) + [
                (("users", i, "accounts", j), n) for j, n in enumerate(u.accounts)]:
            if name not in accounts:
                out.append((path, f"{u.name!r}: Slurm account {name!r} is not in slurm.accounts"))
    return out


# --------------------------------------------------------------------------- drift
def _qos_set(q: Qos, adding: bool) -> tuple[str, ...]:
    """QOS settings for sacctmgr: a new QOS names only what it limits; a change also clears (-1)."""
    pairs = (("Priority", str(q.priority), "0"), ("MaxTRESPerUser", q.max_tres_per_user, "cpu=-1,gres/gpu=-1"),
             ("MaxJobsPerUser", q.max_jobs_per_user, "-1"), ("MaxWall", q.max_wall_minutes, "-1"),
             ("Preempt", q.preempt, ""))
    return tuple(f"{key}={value or clear}" for key, value, clear in pairs if value or not adding)


def _differs(a: object, b: object, fields: tuple[str, ...]) -> list[str]:
    return [f"{f} {getattr(a, f) or '-'} -> {getattr(b, f) or '-'}" for f in fields if getattr(a, f) != getattr(b, f)]


def _account_order(accounts: dict[str, Account]) -> list[str]:
    """Parents before children (the manifest's tree is checked to have no cycle)."""
    done: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in done or name not in accounts or name in trail:
            return
        visit(accounts[name].parent, (*trail, name))
        done.append(name)

    for name in sorted(accounts):
        visit(name, ())
    return done


def drift(want: Holdings, have: Holdings, busy: set[Assoc]) -> list[Change]:
    """What to add, change and remove so slurmdbd holds ``want``; associations in ``busy``
    (running or pending jobs) and the accounts above them are kept, and said so."""
    out: list[Change] = []
    sacct = ("sacctmgr", "--immediate")
    for name, q in sorted(want.qos.items()):
        if name not in have.qos:
            out.append(Change("add", "qos", name, "new", (*sacct, "add", "qos", name, *_qos_set(q, adding=True))))
        elif have.qos[name] != q:
            diff = _differs(have.qos[name], q, ("priority", "max_tres_per_user", "max_jobs_per_user",
                                                "max_wall_minutes", "preempt"))
            out.append(Change("change", "qos", name, "; ".join(diff),
                              (*sacct, "modify", "qos", "where", f"name={name}", "set", *_qos_set(q, adding=False))))
    for name in _account_order(want.accounts):
        a = want.accounts[name]
        settings = (f"Fairshare={a.fairshare}", f"QOS={a.qos}", f"DefaultQOS={a.default_qos or -1}")
        if name not in have.accounts:
            adding = settings if a.default_qos else settings[:2]
            out.append(Change("add", "account", name, f"under {a.parent}",
                              (*sacct, "add", "account", name, f"Parent={a.parent}", *adding)))
            continue
        h = have.accounts[name]
        if h.parent != a.parent:
            out.append(Change("change", "account", name, f"parent {h.parent} -> {a.parent}",
                              (*sacct, "modify", "account", "where", f"name={name}", "set", f"Parent={a.parent}")))
        diff = _differs(h, a, ("fairshare", "qos", "default_qos"))
        if diff:
            out.append(Change("change", "account", name, "; ".join(diff),
                              (*sacct, "modify", "account", "where", f"name={name}", "set", *settings)))
    def default_first(x: Assoc) -> tuple[str, bool, str]:
        return (x.user, want.default_account.get(x.user) != x.account, x.account)

    for assoc in sorted(want.assocs - have.assocs, key=default_first):
        default = want.default_account.get(assoc.user, assoc.account)
        argv: tuple[str, ...] = (*sacct, "add", "user", assoc.user, f"Account={assoc.account}")
        if assoc.user not in have.default_account and assoc.account == default:  # a new user: default first
            argv = (*argv, f"DefaultAccount={default}")
        out.append(Change("add", "user", f"{assoc.user}/{assoc.account}", "new association", argv))
    for user, default in sorted(want.default_account.items()):
        if user in have.default_account and have.default_account[user] != default:
            out.append(Change("change", "user", user, f"default account {have.default_account[user]} -> {default}",
                              (*sacct, "modify", "user", "where", f"name={user}", "set", f"DefaultAccount={default}")))
    kept_accounts: set[str] = set()
    for assoc in sorted(have.assocs - want.assocs, key=lambda x: (x.user, x.account)):
        if assoc.user in KEEP_USERS:
            continue
        name = f"{assoc.user}/{assoc.account}"
        if assoc in busy:
            out.append(Change("kept", "user", name, "has running or pending jobs: not removed"))
            kept_accounts |= _ancestors(have.accounts, assoc.account)
            continue
        out.append(Change("remove", "user", name, "not in the manifest",
                          (*sacct, "delete", "user", "where", f"name={assoc.user}", f"account={assoc.account}")))
    for name in reversed(_account_order(have.accounts)):  # children before parents
        if name in want.accounts or name in KEEP_ACCOUNTS:
            continue
        if name in kept_accounts:
            out.append(Change("kept", "account", name, "holds associations with jobs: not removed"))
            continue
        out.append(Change("remove", "account", name, "not in the manifest",
                          (*sacct, "delete", "account", "where", f"name={name}")))
    for name in sorted(set(have.qos) - set(want.qos) - KEEP_QOS):
        out.append(Change("remove", "qos", name, "not in the manifest",
                          (*sacct, "delete", "qos", "where", f"name={name}")))
    return out


def _ancestors(accounts: dict[str, Account], name: str) -> set[str]:
    out: set[str] = set()
    while name in accounts and name not in out:
        out.add(name)
        name = accounts[name].parent
    return out


def commands(changes: list[Change]) -> list[list[str]]:
    return [list(c.argv) for c in changes if c.argv]


# --------------------------------------------------------------------------- the role's side
def to_vars(want: Holdings) -> dict[str, Any]:
    """``want`` as role data (slurm_fairshare), read back by :func:`from_vars`."""
    return {
        "qos": [asdict(q) for q in want.qos.values()],
        "accounts": [asdict(a) for a in want.accounts.values()],
        "assocs": sorted([a.user, a.account] for a in want.assocs),
        "default_account": dict(sorted(want.default_account.items())),
    }


def from_vars(data: Mapping[str, Any]) -> Holdings:
    return Holdings(
        {q["name"]: Qos(**q) for q in data.get("qos", [])},
        {a["name"]: Account(**a) for a in data.get("accounts", [])},
        {Assoc(str(u), str(a)) for u, a in data.get("assocs", [])},
        {str(k): str(v) for k, v in data.get("default_account", {}).items()},
    )


def fairshare_drift(want: Mapping[str, Any], qos_text: str, assoc_text: str, user_text: str,
                    jobs_text: str) -> list[dict[str, Any]]:
    """The role's filter: the drift as [{line, kind, argv}] from sacctmgr's and squeue's output."""
    changes = drift(from_vars(want), held(qos_text, assoc_text, user_text), parse_jobs(jobs_text))
    return [{"line": c.line(), "kind": c.kind, "argv": list(c.argv)} for c in changes]


# --------------------------------------------------------------------------- plan's side
def read_commands(cluster: str) -> tuple[tuple[str, ...], ...]:
    """What reads slurmdbd's QOS, associations and users and the queue (read-only), in the
    order :func:`live_changes` takes their output: the role's first fairshare task and
    ``provision plan`` run the same."""
    return (
        ("sacctmgr", "--noheader", "--parsable2", "show", "qos", f"format={QOS_FORMAT}"),
        ("sacctmgr", "--noheader", "--parsable2", "show", "assoc", f"cluster={cluster}", f"format={ASSOC_FORMAT}"),
        ("sacctmgr", "--noheader", "--parsable2", "show", "user", f"format={USER_FORMAT}"),
        ("squeue", "--noheader", f"--states={JOB_STATES}", f"--format={JOBS_FORMAT}"),
    )


def live_changes(m: Manifest, outputs: list[str]) -> list[tuple[str, str]]:
    """The drift of ``m`` against what :func:`read_commands` printed, as (kind, line): what
    apply's reconcile would do (add, change, remove) and what it would keep (kept)."""
    qos_text, assoc_text, user_text, jobs_text = outputs
    changes = drift(wanted(m), held(qos_text, assoc_text, user_text), parse_jobs(jobs_text))
    return [(c.kind, c.line()) for c in changes]
