"""The backup area's decisions, pure functions of the manifest: where backups go, what one
holds, when the head's timer makes them, how old the newest may be, the restore's order, and
the configuration of the head's tool (``tool.py``). The one edge is :func:`prepare_key`
(the operator's passphrase into the state directory's secrets, as the munge key is)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provisioner.areas.backup import tool
from provisioner.areas.monitoring import decide as monitoring_decide
from provisioner.areas.slurm import decide as slurm_decide
from provisioner.areas.storage.base import StorageError
from provisioner.areas.storage.nfs import dataset_mountpoint
from provisioner.errors import ProvisionError
from provisioner.manifest.backup import Backup
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.manifest.select import SelectorError
from provisioner.secretfile import private_file_text
from provisioner.state import StateDir

# On the head (the backup role's defaults name the same paths)
CONFIG_FILE = "/etc/provision-backup/config.json"
KEY_FILE = "/etc/provision-backup/key"  # 0400 root: the operator's passphrase
TOOL_FILE = "/usr/local/sbin/provision-backup"
STAGING = "/var/lib/provision-backup"
# The slurm role's defaults (tests/areas/backup/test_decide.py keeps them equal)
STATE_SAVE_LOCATION = "/var/lib/slurm/slurmctld"
ACCOUNTING_DB = "slurm_acct_db"
MUNGE_DIR = "/etc/munge"
# slurmctld writes a change to its state up to 5 s later (state_save.c's SAVE_MAX_WAIT): the
# copy waits that long and a second more, so a job queued just before the backup is in it
SLURMCTLD_SETTLE_S = 6
PROMETHEUS_URL = "http://127.0.0.1:9090"
PROMETHEUS_DATA = "/var/lib/prometheus/metrics2"  # the Debian package's TSDB path
# Grafana's SQLite database: the grafana package's [paths] data and [database] path defaults,
# which the grafana role keeps (https://grafana.com/docs/grafana/latest/setup-grafana/configure-grafana/#database)
GRAFANA_DB = "/var/lib/grafana/grafana.db"

KEY_NAME = "backup.key"  # in the state directory's secrets/ (rolevars: backup_key_file)
PERIOD = {"hourly": dt.timedelta(hours=1), "daily": dt.timedelta(days=1), "weekly": dt.timedelta(weeks=1)}
GRACE = dt.timedelta(minutes=10)  # beyond one period and one run's bound, the newest is late


class BackupConfigError(ProvisionError):
    """A destination or backup name the operator gave that cannot be used."""


def enabled(m: Manifest) -> bool:
    return m.backup is not None


def section(m: Manifest) -> Backup:
    if m.backup is None:
        raise BackupConfigError("the manifest has no backup section")
    return m.backup


def head(m: Manifest) -> Node:
    """Where the backups are made and restored: slurmctld's and slurmdbd's node."""
    return slurm_decide.controller(m)


def prometheus_on(m: Manifest) -> bool:
    """A TSDB snapshot is part of a backup when the manifest asks (the checks insist that
    Prometheus runs on the head: the tool reads the snapshot from its data folder). Not by
    default: the snapshot API is part of Prometheus' admin API, which also deletes series; the
    monitoring area switches it on only with this (``monitoring.decide.admin_api``)."""
    return section(m).prometheus


def grafana_on_head(m: Manifest) -> bool:
    mon = m.monitoring
    if mon is None or not mon.grafana:
        return False
    try:
        return head(m).name in monitoring_decide.server_names(m)
    except SelectorError:  # reported by the monitoring area's checks
        return False


def grafana_on(m: Manifest) -> bool:
    """Grafana's database is part of a backup where Grafana runs on the head, unless the
    manifest says ``grafana: false`` (``true`` elsewhere is a finding of :func:`problems`)."""
    asked = section(m).grafana
    return grafana_on_head(m) if asked is None else asked


def parse_to(text: str) -> dict[str, Any]:
    """``--to``: an absolute path on the head, or ``[user@]host[:port]:/path`` over SSH."""
    if text.startswith("/"):
        return {"kind": "local", "path": text.rstrip("/") or "/"}
    match = re.fullmatch(r"(?:([a-z_][a-z0-9_-]{0,31})@)?([A-Za-z0-9][A-Za-z0-9.-]*)(?::(\d{1,5}))?:(/\S*)", text)
    if match is None or not 0 < int(match.group(3) or 22) < 65536:
        raise BackupConfigError(f"--to {text!r}: give an absolute path on the head or [user@]host[:port]:/path")
    user, host, port, path = match.groups()
    return {"kind": "ssh", "user": user or "root", "host": host, "port": int(port or 22),
            "path": path.rstrip("/") or "/"}


def destination(m: Manifest) -> dict[str, Any]:
    """The manifest's destination, as the tool takes it. A dataset is its mountpoint on its
    storage node, reached as root over SSH on the management network."""
    dest = section(m).destination
    if dest.path is not None:
        return {"kind": "local", "path": dest.path}
    if dest.ssh is not None:
        return {"kind": "ssh", "user": dest.ssh.user, "host": dest.ssh.host, "port": dest.ssh.port,
                "path": dest.ssh.path}
    assert dest.dataset is not None  # the model guarantees one of the three
    node = m.node(dest.dataset.node)
    return {"kind": "ssh", "user": "root", "host": str(node.ip), "port": 22,
            "path": dataset_mountpoint(m, node.name, dest.dataset.name)}


def describe(dest: Mapping[str, Any]) -> str:
    if dest["kind"] == "local":
        return str(dest["path"])
    port = "" if dest["port"] == 22 else f":{dest['port']}"
    return f"{dest['user']}@{dest['host']}{port}:{dest['path']}"


def parts(m: Manifest) -> list[dict[str, Any]]:
    """What one backup holds, in the order it is made and restored: the munge key first (the
    daemons authenticate with it), then slurmdbd's database, slurmctld's state, Prometheus,
    Grafana (its database holds password hashes and data source secrets: encrypted)."""
    found: list[dict[str, Any]] = [
        {"name": "munge", "kind": "files", "path": MUNGE_DIR, "file": "munge.tar.gz", "encrypt": True},
    ]
    if m.slurm.enabled and m.slurm.accounting:
        found.append({"name": "slurmdbd", "kind": "database", "database": ACCOUNTING_DB,
                      "file": "slurmdbd.sql.gz", "encrypt": False})
    if m.slurm.enabled:
        found.append({"name": "slurmctld", "kind": "files", "path": STATE_SAVE_LOCATION, "stable": True,
                      "settle": SLURMCTLD_SETTLE_S, "file": "slurmctld-state.tar.gz", "encrypt": False})
    if prometheus_on(m):
        found.append({"name": "prometheus", "kind": "prometheus", "url": PROMETHEUS_URL, "data": PROMETHEUS_DATA,
                      "file": "prometheus.tar.gz", "encrypt": False})
    if grafana_on(m):
        found.append({"name": "grafana", "kind": "sqlite", "path": GRAFANA_DB, "file": "grafana.db.gz",
                      "encrypt": True})
    return found


def services(m: Manifest) -> dict[str, list[str]]:
    """The units a restore stops before it overwrites anything and starts after, in order:
    the controller before the database daemon before munge going down, the reverse coming up
    (SchedMD's order: munge, slurmdbd, slurmctld)."""
    start = ["munge"]
    if m.slurm.enabled and m.slurm.accounting:
        start.append("slurmdbd")
    if m.slurm.enabled:
        start.append("slurmctld")
    if prometheus_on(m):
        start.append("prometheus")
    if grafana_on(m):
        start.append("grafana-server")
    return {"stop": list(reversed(start)), "start": start}


def on_calendar(b: Backup) -> str | None:
    """The timer's OnCalendar= (UTC); None: no timer."""
    if b.schedule == "off":
        return None
    if b.schedule == "hourly":
        return "*-*-* *:00:00 UTC"
    day = "Sun " if b.schedule == "weekly" else ""
    return f"{day}*-*-* {b.at}:00 UTC"


def max_age(b: Backup) -> dt.timedelta | None:
    """How old the newest backup may be before it is late: one period, one run's bound and a
    grace; None without a schedule."""
    if b.schedule == "off":
        return None
    return PERIOD[b.schedule] + dt.timedelta(seconds=b.timeout_s) + GRACE


def age_verdict(b: Backup, newest: str, now: dt.datetime) -> tuple[bool | None, str]:
    """The verify check's verdict from the tool's ``newest`` line (an ISO time or ``none``):
    True/False, or None (SKIP) without a schedule."""
    limit = max_age(b)
    text = newest.strip()
    if text == "none":
        return (None, "no backup yet; no schedule") if limit is None else (False, "no backup at the destination")
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return False, f"unreadable answer {text[:60]!r}"
    age = now - when
    words = f"newest {when:%Y-%m-%d %H:%M} UTC, {_hours(age)} old"
    if limit is None:
        return None, words + "; no schedule"
    if age > limit:
        return False, f"{words}; late (a {b.schedule} backup is due within {_hours(limit)})"
    return True, words


def _hours(delta: dt.timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} d"


def tool_config(m: Manifest, to: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The head tool's configuration (``CONFIG_FILE``): no secret in it, only the key's path."""
    b = section(m)
    return {
        "cluster": slurm_decide.cluster_name(m),
        "staging": STAGING,
        "destination": dict(to) if to is not None else destination(m),
        "keep": b.keep,
        "key_file": KEY_FILE,
        "timeout_s": b.timeout_s,
        "parts": parts(m),
        "services": services(m),
    }


UPLOAD = f"{STAGING}/incoming/provision-state.tar.gz.enc"  # the admin host's part, on its way in
ADMIN_PART = "provision-state"
# what the admin host's part leaves out of .provision/: the node OS image cache (gigabytes,
# rebuilt by `provision image build`) and the lock of a running command
ADMIN_SKIP = frozenset({"images", "lock"})


def make_command(to: Mapping[str, Any] | None, with_admin_part: bool) -> str:
    """The shell line that makes a backup on the head (``provision backup``)."""
    words = ["python3", TOOL_FILE, "make", CONFIG_FILE]
    if to is not None:
        words += ["--to", json.dumps(dict(to), sort_keys=True)]
    if with_admin_part:
        words += ["--extra", f"{ADMIN_PART}={UPLOAD}"]
    return shlex.join(words)


def upload_command() -> str:
    """Reads the admin host's part from stdin into ``UPLOAD`` (root-only)."""
    folder = shlex.quote(str(Path(UPLOAD).parent))
    return f"umask 077 && mkdir -p {folder} && cat > {shlex.quote(UPLOAD)}"


def restore_command(name: str, yes: bool, source: Mapping[str, Any] | None = None) -> str:
    """The shell line that restores backup ``name`` on the head (``provision restore``);
    ``source``: read it from there instead of the manifest's destination."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise BackupConfigError(f"--from {name!r}: give a backup's name, e.g. provision-backup-<cluster>-<time>")
    words = ["python3", TOOL_FILE, "restore", CONFIG_FILE, name]
    if source is not None:
        words += ["--to", json.dumps(dict(source), sort_keys=True)]
    return shlex.join([*words, "--yes"] if yes else words)


def plan_lines(m: Manifest) -> list[str]:
    """The backup's words for ``plan``-like output: where, when, what, how many."""
    if m.backup is None:
        return []
    b = m.backup
    when = "only on `provision backup`" if b.schedule == "off" else (
        "hourly" if b.schedule == "hourly" else f"{b.schedule} at {b.at} UTC")
    encrypted = [p["name"] for p in parts(m) if p["encrypt"]]
    return [f"backup of {head(m).name} {when} to {describe(destination(m))}, the newest {b.keep} kept",
            "holds " + ", ".join(p["name"] for p in parts(m)) + f"; encrypted: {', '.join(encrypted)}"]


def problems(m: Manifest) -> list[tuple[tuple[str | int, ...], str]]:
    """Whole-manifest problems of the backup section: (path, message)."""
    if m.backup is None:
        return []
    b = m.backup
    found: list[tuple[tuple[str | int, ...], str]] = []
    ds = b.destination.dataset
    if ds is not None:
        where: tuple[str | int, ...] = ("backup", "destination", "dataset")
        pool_name = ds.name.split("/")[0]
        if ds.node not in m.node_names():
            found.append(((*where, "node"), f"unknown node {ds.node!r}"))
        elif not any(p.name == pool_name and p.node == ds.node for p in m.zfs.pools):
            found.append(((*where, "name"), f"no pool {pool_name!r} on {ds.node} in zfs.pools"))
        elif ds.node == head(m).name:
            found.append(((*where, "node"), f"{ds.node} is the head node itself: a backup there is lost with "
                          "the head; use path: for that"))
        else:
            try:
                dataset_mountpoint(m, ds.node, ds.name)
            except StorageError as exc:
                found.append(((*where, "name"), str(exc)))
    if b.destination.path is not None:
        inside = [p for p in (STATE_SAVE_LOCATION, MUNGE_DIR, STAGING, "/var/lib/mysql")
                  if (b.destination.path + "/").startswith(p + "/") or (p + "/").startswith(b.destination.path + "/")]
        if inside:
            found.append((("backup", "destination", "path"), f"{b.destination.path} overlaps {inside[0]}, which a "
                          "backup copies or a restore replaces"))
    if b.prometheus and m.monitoring is None:
        found.append((("backup", "prometheus"), "no monitoring section: there is no Prometheus to snapshot"))
    elif b.prometheus and head(m).name not in monitoring_decide.server_names(m):
        found.append((("backup", "prometheus"), f"Prometheus does not run on the head {head(m).name}; the head's "
                      "backup can snapshot only its own"))
    if b.grafana and not grafana_on_head(m):
        found.append((("backup", "grafana"), f"Grafana does not run on the head {head(m).name} (monitoring.grafana "
                      "and monitoring.nodes); the head's backup can copy only its own"))
    if not m.slurm.enabled:
        found.append((("backup",), "slurm is not enabled: the head holds nothing a backup takes but the munge key"))
    return found


# ------------------------------------------------------------------ the operator's key (edge)
def secret_envs(m: Manifest) -> set[str]:
    return {m.backup.key_env} if m.backup is not None and m.backup.key_env is not None else set()


def read_key(b: Backup, environ: Mapping[str, str] | None = None) -> str:
    """The passphrase from its variable or file. A file must be regular and unreadable by
    others; messages say where it was looked for, never the value."""
    if b.key_env is not None:
        value = (os.environ if environ is None else environ).get(b.key_env, "")
        if not value:
            raise BackupConfigError(f"backup.key_env: environment variable {b.key_env} is empty or unset")
        return value
    assert b.key_file is not None
    try:
        return private_file_text(Path(b.key_file), "backup.key_file", "the backup passphrase", one_line=True)
    except ProvisionError as exc:
        raise BackupConfigError(str(exc)) from None


def key_problem(value: str) -> str | None:
    """A passphrase too weak to protect the munge key at a destination others may read."""
    if len(value) < 16:
        return "the backup passphrase has fewer than 16 characters"
    return None


def prepare_key(loaded: Loaded, state: StateDir) -> None:
    """The area's ``prepare`` step: the passphrase into ``secrets/backup.key`` (0600), where the
    backup role finds it; removed when the manifest has no backup section."""
    m = loaded.manifest
    path = state.secrets / KEY_NAME
    if m.backup is None:
        path.unlink(missing_ok=True)
        return
    value = read_key(m.backup)
    if (problem := key_problem(value)) is not None:
        raise BackupConfigError(problem)
    state.secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_NAME}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, value.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)


def pack_admin(m: Manifest, state_dir: Path, out: Path) -> None:
    """The admin host's part (edge): ``.provision/`` as a tar, encrypted with the operator's
    passphrase (from its variable or file) before it is written to ``out``."""
    key = read_key(section(m))
    with tempfile.TemporaryDirectory(prefix="provision-backup-") as tmp:
        folder = Path(tmp)
        os.chmod(folder, 0o700)
        key_file = folder / "key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, key.encode() + b"\n")
        finally:
            os.close(fd)
        clear = folder / "provision-state.tar.gz"
        try:
            tool.tar_folder(state_dir, clear, ADMIN_SKIP)
        except OSError as exc:  # a full temporary folder: tarfile's error names no file
            raise BackupConfigError(f"cannot pack {state_dir} into {clear}: {exc.strerror or exc}; set TMPDIR to a "
                                    "writable folder with room") from None
        try:
            tool.encrypt(clear, out, key_file, section(m).timeout_s)
        except tool.BackupError as exc:
            raise BackupConfigError(f"cannot encrypt the admin host's part into {out}: {exc}") from None


def secret_values(state: StateDir) -> list[str]:
    path = state.secrets / KEY_NAME
    try:
        return [path.read_text(encoding="utf-8").rstrip("\n")] if path.is_file() else []
    except (OSError, UnicodeDecodeError):
        return []


NAME_PREFIX = tool.PREFIX  # backups of ours at a destination start with this
