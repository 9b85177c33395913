"""The head node's backup tool: makes, lists, prunes and restores backups of the head.

It runs on the head node with the standard library alone (``python3 tool.py make CONFIG``):
the backup role installs it with its configuration, written from the manifest by
``provisioner.areas.backup.decide.tool_config``, and a timer runs it. A backup is a folder
``provision-backup-<cluster>-<UTC stamp>`` at the destination holding one file per part,
``backup.json`` (what it holds) and ``SHA256SUMS`` (every other file's SHA-256). It is made in
a root-only staging folder on the head, copied to the destination as ``<name>.partial`` and
renamed, so a folder without the suffix is complete. Parts that hold secrets are encrypted
with ``openssl enc -aes-256-cbc -pbkdf2`` and the operator's passphrase before they leave the
staging folder: they are never in clear at the destination.

One file on purpose, and so longer than our other modules: the backup role ships this
module's text as one executable (``backup_tool`` in the inventory, read by
``rolevars.tool_source``) to a head node that has Python's standard library and nothing of
ours; split into modules it would need a package or a zipapp built and installed there.

Commands: ``make``, ``list``, ``newest`` (for verify), ``restore NAME --yes`` (without
``--yes`` it shows what it would overwrite and changes nothing). Exit 0: done; 1: failed;
2: refused (checksums that do not match, no ``--yes``); 128 + the signal: stopped by SIGINT,
SIGTERM or SIGHUP, after removing its staging files and its partial copy (a restore says
whether it had changed anything yet).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import hashlib
import json
import os
import re
import select
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

PREFIX = "provision-backup-"
PARTIAL = ".partial"
SUMS = "SHA256SUMS"
META = "backup.json"
FORMAT = 1
STAMP = "%Y%m%dT%H%M%SZ"
STABLE_TRIES = 3  # copies of a folder that keeps changing before the backup fails
PARTIAL_CLEANUP_S = 30.0  # removing a partial copy at an SSH destination after a stop or failure
UTC = dt.timezone.utc  # noqa: UP017  (dt.UTC is 3.11; Ubuntu 22.04 has 3.10)
OPENSSL = ("openssl", "enc", "-aes-256-cbc", "-pbkdf2", "-iter", "200000", "-salt")


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says why."""


class Refused(BackupError):
    """A restore refused before it changed anything."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """SIGINT, SIGTERM or SIGHUP: raised in the main thread, so that every ``finally`` removes
    what this run made (a child process it waited for is killed by ``subprocess.run``). Not
    an Exception, as KeyboardInterrupt is not: no ``except`` for a failed step takes it."""

    def __init__(self, signum: int, detail: str = "") -> None:
        self.signum = signum
        self.detail = detail
        super().__init__(f"stopped by {signal.Signals(signum).name}" + (f": {detail}" if detail else ""))


class _Starting:
    """Whether the main thread is inside ``Popen`` (a child forked, its handle not yet ours),
    and the signal that came meanwhile: raising there would lose the child, which then ran on
    after the tool had stopped (a stand-in openssl's sleep outlived a stopped restore)."""

    now = False
    held: int | None = None


def _stop(signum: int, frame: object) -> None:
    for sig in STOP_SIGNALS:  # a second signal must not break off the clean-up
        signal.signal(sig, signal.SIG_IGN)
    if _Starting.now:  # run() raises it once it holds the child
        _Starting.held = signum
        return
    raise Stopped(signum)


def stop_on_signals() -> dict[int, Any]:
    """Turn the stop signals into :class:`Stopped`; one ignored at the start (nohup) stays so.
    Returns the handlers it replaced (``main`` puts them back: tests call it in-process)."""
    _Starting.now, _Starting.held = False, None
    return {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


def stop_when_the_reader_goes(fd: int = 1, every: float = 0.5) -> None:
    """When this tool's output is a pipe and its reader goes (``provision backup``/``restore``
    interrupted: its ssh ended, sshd closed the session's pipes), stop as on SIGHUP. ssh does
    not signal a remote command without a terminal, so a restore went on after the operator's
    Ctrl-C. (From the timer the output is the journal's socket: nothing to watch.)"""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
    except OSError:
        return

    def watch() -> None:
        poll = select.poll()
        poll.register(fd, 0)  # no event asked: poll reports POLLERR once the pipe has no reader
        while not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(every * 1000)):
            pass
        os.kill(os.getpid(), signal.SIGHUP)

    threading.Thread(target=watch, daemon=True, name="reader-watch").start()


# ------------------------------------------------------------------ names and retention (pure)
def backup_name(cluster: str, when: dt.datetime) -> str:
    return f"{PREFIX}{cluster}-{when.astimezone(UTC).strftime(STAMP)}"


def stamp_of(name: str, cluster: str) -> dt.datetime | None:
    """The time of a complete backup of ``cluster`` named ``name``; None for anything else
    (another cluster's, a partial copy, a folder that is not ours)."""
    head = f"{PREFIX}{cluster}-"
    if not name.startswith(head):
        return None
    rest = name[len(head):]
    if not re.fullmatch(r"\d{8}T\d{6}Z", rest):
        return None
    try:
        return dt.datetime.strptime(rest, STAMP).replace(tzinfo=UTC)
    except ValueError:
        return None


def ours(names: Iterable[str], cluster: str) -> list[str]:
    """The complete backups of ``cluster`` among ``names``, oldest first."""
    found = [(when, name) for name in names if (when := stamp_of(name, cluster)) is not None]
    return [name for _, name in sorted(found)]


def to_prune(names: Iterable[str], cluster: str, keep: int, making: str = "") -> list[str]:
    """What retention removes: our complete backups beyond the newest ``keep``, and our partial
    copies other than ``making`` (a run that failed half-way). Nothing else is ever named."""
    listed = list(names)
    complete = ours(listed, cluster)
    old = complete[:-keep] if keep > 0 else complete
    partial = sorted(n for n in listed if n.endswith(PARTIAL) and n != making + PARTIAL
                     and stamp_of(n[: -len(PARTIAL)], cluster) is not None)
    return old + partial


def newest(names: Iterable[str], cluster: str) -> str | None:
    found = ours(names, cluster)
    return found[-1] if found else None


# ------------------------------------------------------------------ checksums (pure)
def render_sums(sums: Mapping[str, str]) -> str:
    """sha256sum's format, sorted by name: ``sha256sum -c SHA256SUMS`` checks it too."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items()))


def parse_sums(text: str) -> dict[str, str]:
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        match = re.fullmatch(r"([0-9a-f]{64}) [ *]([A-Za-z0-9_.-]+)", line)
        if match is None:
            raise Refused(f"{SUMS} line {number} is not '<sha256>  <file>': {line[:80]!r}")
        sums[match.group(2)] = match.group(1)
    return sums


def mismatches(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Every difference between the recorded sums and the files found, in words."""
    problems = [f"{name}: missing" for name in sorted(set(expected) - set(actual))]
    problems += [f"{name}: checksum does not match" for name in sorted(set(expected) & set(actual))
                 if expected[name] != actual[name]]
    problems += [f"{name}: not in {SUMS}" for name in sorted(set(actual) - set(expected))]
    return problems


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_sums(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != SUMS}


def check_folder(folder: Path) -> None:
    """Refuse a backup folder whose files are not exactly the ones its SHA256SUMS lists."""
    sums_file = folder / SUMS
    if not sums_file.is_file():
        raise Refused(f"{folder}: no {SUMS}; not a complete backup")
    try:
        recorded = parse_sums(sums_file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:  # a corrupted file is a refusal naming it, not a failure naming a codec
        raise Refused(f"{folder}: refused, its {SUMS} is not text (corrupted?)") from None
    except Refused as exc:
        raise Refused(f"{folder}: refused, {exc}") from None
    problems = mismatches(recorded, folder_sums(folder))
    if problems:
        raise Refused(f"{folder}: refused, the backup does not match its checksums: " + "; ".join(problems))


# ------------------------------------------------------------------ consistent copies
Stamps = dict[str, tuple[int, int]]


def stamps(root: Path) -> Stamps:
    """Every file below ``root``: (size, mtime in ns)."""
    found: Stamps = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            found[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return found


def changed(before: Stamps, after: Stamps) -> list[str]:
    """Files that appeared, went or changed between two looks at a folder."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def tar_folder(root: Path, out: Path, skip: frozenset[str] = frozenset()) -> None:
    """``root`` as a gzipped tar; ``skip``: names of its own entries left out."""
    with tarfile.open(out, "w:gz") as tar:
        tar.add(root, arcname=".", filter=lambda info: None if info.name[2:].split("/")[0] in skip else info)


def tar_stable(root: Path, out: Path, tries: int = STABLE_TRIES, pause: float = 1.0, settle: float = 0.0) -> int:
    """Copy ``root`` into ``out`` so that no file changed while it was read: look, copy, look
    again; retry while they differ, at most ``tries`` times. Returns the copies it took.
    ``settle``: seconds to wait first, for a daemon that writes its state late (slurmctld
    defers a save up to 5 s) to have written what changed before the backup began."""
    if not root.is_dir():
        raise BackupError(f"{root}: no such folder")
    if settle > 0:
        time.sleep(settle)
    for attempt in range(1, tries + 1):
        before = stamps(root)
        tar_folder(root, out)
        moved = changed(before, stamps(root))
        if not moved:
            return attempt
        if attempt < tries:
            time.sleep(pause)
    raise BackupError(f"{root} kept changing while it was copied ({tries} tries; e.g. {', '.join(moved[:3])})")


def untar_into(archive: Path, root: Path) -> None:
    """Replace ``root``'s contents with the archive's (owners and modes kept)."""
    root.mkdir(parents=True, exist_ok=True)
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    with tarfile.open(archive, "r:gz") as tar:
        if hasattr(tarfile, "tar_filter"):  # Python 3.11.4, 3.10.12 and later
            tar.extractall(root, filter="tar")
        else:  # Debian 12's 3.11.2: no filters; the archive matched its checksums
            tar.extractall(root)


# ------------------------------------------------------------------ the edges
def run(argv: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """``subprocess.run``, bounded, whose child a stop signal never outlives: a signal while
    ``Popen`` starts it is held until the child is ours (:class:`_Starting`), then the child
    is killed as for a signal during its run."""
    if "stdout" not in kwargs:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _Starting.now = True
    try:
        process = subprocess.Popen(list(argv), **kwargs)
    except FileNotFoundError:
        raise BackupError(f"{argv[0]}: not installed") from None
    finally:
        _Starting.now = False
    with process:
        try:
            if _Starting.held is not None:
                signum, _Starting.held = _Starting.held, None
                raise Stopped(signum)
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise BackupError(f"{argv[0]} did not finish within {timeout:.0f} s") from None
        except BaseException:
            process.kill()
            raise
    done = subprocess.CompletedProcess(list(argv), process.returncode, out, err)
    if done.returncode != 0:
        tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
        raise BackupError(f"{' '.join(argv[:2])} failed (exit {done.returncode}){': ' + tail[0] if tail else ''}")
    return done


def encrypt(src: Path, dst: Path, key_file: Path, timeout: float) -> None:
    run([*OPENSSL, "-pass", f"file:{key_file}", "-in", str(src), "-out", str(dst)], timeout)


def decrypt(src: Path, dst: Path, key_file: Path, timeout: float) -> None:
    try:
        run([*OPENSSL, "-d", "-pass", f"file:{key_file}", "-in", str(src), "-out", str(dst)], timeout)
    except BackupError as exc:
        raise BackupError(f"{src.name}: cannot decrypt with {key_file} (wrong passphrase?): {exc}") from None


class Destination:
    """Where backups go: a folder on this host, or one reached over SSH."""

    def __init__(self, spec: Mapping[str, Any], timeout: float) -> None:
        self.spec = spec
        self.timeout = timeout
        self.path = str(spec["path"])
        self.remote = spec["kind"] == "ssh"

    def _ssh(self) -> list[str]:
        return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-p", str(self.spec["port"]),
                f"{self.spec['user']}@{self.spec['host']}"]

    def _scp(self) -> list[str]:
        return ["scp", "-q", "-r", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-P", str(self.spec["port"])]

    def _target(self, name: str) -> str:
        return f"{self.spec['user']}@{self.spec['host']}:{self.path}/{name}"

    def names(self) -> list[str]:
        if not self.remote:
            root = Path(self.path)
            return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        out = run([*self._ssh(), f"mkdir -p -- '{self.path}' && ls -1 -- '{self.path}'"], self.timeout)
        return out.stdout.decode().split()

    def put(self, folder: Path, name: str) -> None:
        """Copy ``folder`` in as ``name``: as ``name.partial`` first, renamed once complete."""
        if not self.remote:
            root = Path(self.path)
            partial = root / (name + PARTIAL)
            try:
                root.mkdir(parents=True, exist_ok=True)
                shutil.copytree(folder, partial)
                partial.rename(root / name)
            except BaseException as exc:  # a full or read-only destination, a signal: no partial copy left
                shutil.rmtree(partial, ignore_errors=True)
                if isinstance(exc, shutil.Error):  # copytree's list of (source, target, why)
                    _, target, why = exc.args[0][0]  # why: str(OSError), "[Errno 28] No space left...: 'src' -> 'dst'"
                    found = re.match(r"\[Errno \d+\] ([^:]+)", str(why))
                    raise BackupError(f"cannot copy the backup to {root}: {target}: "
                                      f"{found.group(1) if found else why}") from None
                if isinstance(exc, OSError):
                    raise BackupError(f"cannot copy the backup to {root}: {said(exc)}") from None
                raise
            return
        run([*self._ssh(), f"mkdir -p -- '{self.path}'"], self.timeout)
        try:
            run([*self._scp(), str(folder), self._target(name + PARTIAL)], self.timeout)
            run([*self._ssh(), f"mv -- '{self.path}/{name}{PARTIAL}' '{self.path}/{name}'"], self.timeout)
        except BaseException:  # a signal (now ignored: this runs to its end, bounded), a failed copy
            with contextlib.suppress(BackupError, OSError):
                run([*self._ssh(), f"rm -rf -- '{self.path}/{name}{PARTIAL}'"], min(self.timeout, PARTIAL_CLEANUP_S))
            raise

    def remove(self, name: str) -> None:
        if not (name.startswith(PREFIX) and re.fullmatch(r"[A-Za-z0-9_.-]+", name)):
            raise BackupError(f"refusing to remove {name!r}: not a backup of ours")
        if not self.remote:
            shutil.rmtree(Path(self.path) / name)
        else:
            run([*self._ssh(), f"rm -rf -- '{self.path}/{name}'"], self.timeout)

    def get(self, name: str, into: Path) -> Path:
        if not self.remote:
            source = Path(self.path) / name
            if not source.is_dir():
                raise BackupError(f"{source}: no such backup")
            return source
        run([*self._scp(), self._target(name), str(into)], self.timeout)
        return into / name


# ------------------------------------------------------------------ making a backup
def make_part(part: Mapping[str, Any], work: Path, timeout: float) -> Path:
    """One part in clear in the (root-only) work folder; returns its file."""
    out = work / str(part["file"])
    try:
        _make_part(part, out, work, timeout)
    except OSError as exc:  # a full staging disk, an unreadable source: say which part
        raise BackupError(f"cannot make {out}: {said(exc)}") from None
    return out


def said(exc: OSError) -> str:
    """An OSError in words, with its file when it names one."""
    return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else (exc.strerror or str(exc))


def _make_part(part: Mapping[str, Any], out: Path, work: Path, timeout: float) -> None:
    kind = part["kind"]
    if kind == "database":
        dump = [part.get("dump", "mysqldump"), "--single-transaction", "--quick", "--routines", "--triggers",
                "--databases", part["database"]]
        raw = work / (part["name"] + ".sql")
        with raw.open("wb") as f:
            run(dump, timeout, stdout=f, stderr=subprocess.PIPE)  # bounded, and a failure says why
        with raw.open("rb") as src, gzip.open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
    elif kind == "files":
        if part.get("stable"):
            tar_stable(Path(part["path"]), out, settle=float(part.get("settle", 0)))
        else:
            tar_folder(Path(part["path"]), out)
    elif kind == "prometheus":
        request = urllib.request.Request(f"{part['url']}/api/v1/admin/tsdb/snapshot", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                snapshot = json.load(answer)["data"]["name"]
        except urllib.error.HTTPError as exc:  # Prometheus says why in its JSON answer
            raise BackupError(f"Prometheus' TSDB snapshot API ({part['url']}): {prometheus_error(exc)}") from None
        except Exception as exc:  # a refused connection, an answer without a name
            raise BackupError(f"Prometheus' TSDB snapshot API ({part['url']}): {exc}") from None
        folder = Path(part["data"]) / "snapshots" / snapshot
        try:
            tar_folder(folder, out)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    elif kind == "sqlite":
        copy = work / (part["name"] + ".db")
        sqlite_copy(Path(part["path"]), copy, timeout)
        with copy.open("rb") as src, gzip.open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        copy.unlink()
    else:
        raise BackupError(f"unknown part kind {kind!r}")


def prometheus_error(exc: urllib.error.HTTPError) -> str:
    """Prometheus' own reason from an error answer (its JSON ``error``), else the HTTP status."""
    try:
        said = str(json.loads(exc.read(4096))["error"])
    except Exception:  # an answer that is not Prometheus' JSON
        return str(exc)
    if said == "admin APIs disabled":
        return f"{said}: Prometheus runs without --web.enable-admin-api (apply switches it on for backup.prometheus)"
    return f"HTTP {exc.code}: {said}"


def sqlite_copy(src: Path, dst: Path, timeout: float) -> None:
    """A consistent copy of a live SQLite database (Grafana's) by SQLite's online backup API,
    which copies a snapshot between the writes of the program that holds it open."""
    if not src.is_file():
        raise BackupError(f"{src}: no such database")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=timeout)) as source, \
                contextlib.closing(sqlite3.connect(dst)) as target:
            source.backup(target)
    except sqlite3.Error as exc:
        raise BackupError(f"{src}: {exc}") from None


def sqlite_put(archive: Path, path: Path) -> None:
    """Put a database copy back in place, owned as the folder it lies in (Grafana's own user),
    mode 0640; written beside it and renamed, so the file is whole or the old one. The
    program that uses it is stopped first (the restore's ``services``)."""
    folder = path.parent
    tmp = folder / f".{path.name}.restore"
    with gzip.open(archive, "rb") as src, tmp.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    owner = folder.stat()
    with contextlib.suppress(PermissionError):  # a test as an ordinary user keeps its own
        os.chown(tmp, owner.st_uid, owner.st_gid)
    tmp.chmod(0o640)
    for stale in (f"{path}-wal", f"{path}-shm", f"{path}-journal"):  # the old file's; would be replayed on it
        Path(stale).unlink(missing_ok=True)
    tmp.replace(path)


def make(config: Mapping[str, Any], now: dt.datetime, extra: Mapping[str, Path] | None = None) -> str:
    """Make one backup at the destination, then prune ours beyond ``keep``; returns its name.
    ``extra``: parts made elsewhere and already encrypted (the admin host's ``.provision/``),
    name -> file; they are moved into the backup."""
    timeout = float(config["timeout_s"])
    name = backup_name(config["cluster"], now)
    staging = Path(config["staging"])
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(staging, 0o700)
    work = staging / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    clear = staging / (name + ".clear")
    shutil.rmtree(clear, ignore_errors=True)
    clear.mkdir(mode=0o700)
    try:
        meta_parts = []
        for part in config["parts"]:
            made = make_part(part, clear, timeout)
            if part.get("encrypt"):
                encrypt(made, work / (made.name + ".enc"), Path(config["key_file"]), timeout)
                stored = made.name + ".enc"
            else:
                shutil.move(str(made), work / made.name)
                stored = made.name
            meta_parts.append({"name": part["name"], "kind": part["kind"], "file": stored,
                               "encrypted": bool(part.get("encrypt"))})
        for extra_name, path in (extra or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9-]*", extra_name):
                raise BackupError(f"--extra {extra_name!r}: a part's name is lower-case letters, digits and -")
            stored = f"{extra_name}.tar.gz.enc"
            shutil.move(str(path), work / stored)
            meta_parts.append({"name": extra_name, "kind": "admin", "file": stored, "encrypted": True})
        meta = {"format": FORMAT, "cluster": config["cluster"], "created": now.isoformat(), "parts": meta_parts}
        (work / META).write_text(json.dumps(meta, indent=1) + "\n")
        (work / SUMS).write_text(render_sums(folder_sums(work)))
        destination = Destination(config["destination"], timeout)
        destination.put(work, name)
        try:
            for old in to_prune(destination.names(), config["cluster"], int(config["keep"]), making=name):
                destination.remove(old)
        except Stopped as exc:
            raise Stopped(exc.signum, f"{name} was made; the old backups were not all pruned") from None
    except Stopped as exc:
        if not exc.detail:
            raise Stopped(exc.signum, "no backup was made; its staging files were removed") from None
        raise
    finally:
        shutil.rmtree(clear, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return name


# ------------------------------------------------------------------ restoring
def restore_plan(config: Mapping[str, Any], meta: Mapping[str, Any]) -> list[str]:
    """What a restore of this backup does, in order, in words (pure)."""
    by_name = {p["name"]: p for p in config["parts"]}
    lines = [f"stop {unit}" for unit in config["services"]["stop"]]
    for part in meta["parts"]:
        spec = by_name.get(part["name"])
        if part["kind"] == "admin":
            lines.append(f"leave {part['file']}: the admin host's copy, restored there (docs/backup.md)")
        elif spec is None:
            lines.append(f"skip {part['name']}: this head does not take it")
        elif spec["kind"] == "database":
            lines.append(f"overwrite database {spec['database']} from {part['file']}")
        elif spec["kind"] == "files":
            lines.append(f"overwrite {spec['path']} from {part['file']}")
        elif spec["kind"] == "prometheus":
            lines.append(f"overwrite {spec['data']} from {part['file']}")
        elif spec["kind"] == "sqlite":
            lines.append(f"overwrite {spec['path']} from {part['file']}")
    lines += [f"start {unit}" for unit in config["services"]["start"]]
    return lines


def restore_part(spec: Mapping[str, Any], archive: Path, timeout: float, work: Path) -> None:
    """Put one part back; ``work``: a root-only folder for the database's uncompressed dump."""
    if spec["kind"] == "database":
        sql = work / archive.name.removesuffix(".gz")
        with gzip.open(archive, "rb") as src, sql.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        try:
            with sql.open("rb") as f:
                run([spec.get("load", "mysql")], timeout, stdin=f)  # bounded, and a failure says why
        finally:
            sql.unlink()
    elif spec["kind"] == "files":
        untar_into(archive, Path(spec["path"]))
    elif spec["kind"] == "prometheus":
        untar_into(archive, Path(spec["data"]))
    elif spec["kind"] == "sqlite":
        sqlite_put(archive, Path(spec["path"]))


def restore(config: Mapping[str, Any], name: str, yes: bool, out: Any) -> None:
    timeout = float(config["timeout_s"])
    staging = Path(config["staging"])
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stamp_of(name, config["cluster"]) is None:
        raise Refused(f"{name!r} is not a backup of cluster {config['cluster']}")
    fetched = staging / "restore"
    shutil.rmtree(fetched, ignore_errors=True)
    fetched.mkdir(mode=0o700)
    try:
        folder = Destination(config["destination"], timeout).get(name, fetched)
        check_folder(folder)
        meta = json.loads((folder / META).read_text())
        if meta.get("format") != FORMAT or meta.get("cluster") != config["cluster"]:
            raise Refused(f"{name}: format {meta.get('format')} of cluster {meta.get('cluster')!r}; "
                          f"this tool restores format {FORMAT} of {config['cluster']!r}")
        plan = restore_plan(config, meta)
        for line in plan:
            print(line, file=out)
        if not yes:
            raise Refused("nothing changed: this overwrites the lines above; run again with --yes")
        clear = fetched / "clear"
        clear.mkdir(mode=0o700)
        archives = {}
        by_name = {p["name"]: p for p in config["parts"]}
        for part in (p for p in meta["parts"] if p["name"] in by_name and p["kind"] != "admin"):
            src = folder / part["file"]
            if part["encrypted"]:
                decrypt(src, clear / part["file"].removesuffix(".enc"), Path(config["key_file"]), timeout)
                src = clear / part["file"].removesuffix(".enc")
            archives[part["name"]] = src
        done: list[str] = []  # the plan's steps taken so far
        try:
            for unit in config["services"]["stop"]:
                run(["systemctl", "stop", unit], timeout)
                done.append(f"stop {unit}")
            for part in meta["parts"]:  # in the order they were made: the config's order
                if part["name"] in archives:
                    restore_part(by_name[part["name"]], archives[part["name"]], timeout, clear)
                    done.append(f"{part['name']} restored")
            for unit in config["services"]["start"]:
                run(["systemctl", "start", unit], timeout)
                done.append(f"start {unit}")
        except Stopped as exc:
            raise Stopped(exc.signum, f"after {', '.join(done) or 'nothing'} of the plan; run the restore "
                                      "again with --yes") from None
    except Stopped as exc:
        if not exc.detail:  # before the plan's first step
            raise Stopped(exc.signum, "nothing changed") from None
        raise
    finally:
        shutil.rmtree(fetched, ignore_errors=True)


# ------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision-backup", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("make", "list", "newest", "restore", "check"))
    parser.add_argument("config", type=Path)
    parser.add_argument("name", nargs="?", default="")
    parser.add_argument("--yes", action="store_true", help="restore: overwrite what the plan lists")
    parser.add_argument("--to", default="", help="make, restore: this destination (JSON) instead of the config's")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=FILE",
                        help="make: add this encrypted file as part NAME (moved into the backup)")
    args = parser.parse_args(argv)
    replaced = stop_on_signals()
    if argv is None:  # the command line, not a test calling main()
        stop_when_the_reader_goes()
    try:
        return _main(args)
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)


def _main(args: argparse.Namespace) -> int:
    try:
        config = json.loads(args.config.read_text())
        if args.to:
            config = {**config, "destination": json.loads(args.to)}
        timeout = float(config["timeout_s"])
        if args.command == "make":
            extra = dict(item.split("=", 1) for item in args.extra)
            print(make(config, dt.datetime.now(UTC), {k: Path(v) for k, v in extra.items()}))
        elif args.command == "list":
            for name in ours(Destination(config["destination"], timeout).names(), config["cluster"]):
                print(name)
        elif args.command == "newest":
            found = newest(Destination(config["destination"], timeout).names(), config["cluster"])
            stamp = stamp_of(found, config["cluster"]) if found else None
            print(stamp.isoformat() if stamp else "none")
        elif args.command == "check":
            staging = Path(config["staging"]) / "check"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(mode=0o700, parents=True)
            try:
                check_folder(Destination(config["destination"], timeout).get(args.name, staging))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            print(f"{args.name}: every checksum matches")
        else:
            restore(config, args.name, args.yes, sys.stdout)
    except Stopped as exc:
        print(f"provision-backup: {exc}", file=sys.stderr)
        return 128 + exc.signum
    except Refused as exc:
        print(f"provision-backup: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"provision-backup: {said(exc)}", file=sys.stderr)
        return 1
    except (BackupError, KeyError, ValueError) as exc:
        print(f"provision-backup: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
