"""The state directory beside the manifest (default ``.provision/``).

Layout::

    .provision/
      state.json      node lifecycle, applied fingerprints, run history (atomic writes)
      state.json.1    the state before the last command that changed it (.2, .3: older)
      lock            held (flock) by a running apply; holds the holder's description
      known_hosts     SSH host keys: first contact recorded, later mismatch is an error
      inventory/      the inventory the last run used
      runs/<id>/      ansible-runner artifacts per run (no env/ files: no secrets), with the
                      facts that run gathered (fact_cache/: never reused by a later run, since a
                      node's kernel and packages change between runs)
      secrets/        mode 0700: munge.key (0600)
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import getpass
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from provisioner.errors import ProvisionError

# removed: taken out of the cluster (the manifest no longer lists it; `provision remove`, or
# a whole apply without it); its fingerprints are cleared, so a node of that name added
# again is new
Lifecycle = Literal["new", "installed", "configured", "removed"]
STATE_VERSION = 1
MAX_RUNS = 100
BACKUPS = 3  # state.json.1 (newest) .. state.json.3
STATE_DIR_HINT = "choose another state directory with --state-dir"


@dataclass
class NodeState:
    lifecycle: Lifecycle = "new"
    fingerprints: dict[str, str] = field(default_factory=dict)
    applied_at: str | None = None
    last_run: str | None = None
    last_result: str | None = None
    removed_at: str | None = None
    # what the areas record of the node at its last good apply (slurm: the Slurm release it runs)
    recorded: dict[str, str] = field(default_factory=dict)


@dataclass
class RunRecord:
    id: str
    started: str
    finished: str | None = None
    command: str = "apply"
    limit: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    result: str = "running"
    failed: list[str] = field(default_factory=list)
    changed: dict[str, int] = field(default_factory=dict)
    # per node: ok, failed, unreachable, not run, interrupted (what actually ran there)
    results: dict[str, str] = field(default_factory=dict)
    # per node, for an interrupted run: the play and task it was in when the run stopped
    stopped_at: dict[str, str] = field(default_factory=dict)
    note: str = ""  # why the run ended as it did, when not obvious (e.g. "interrupted by SIGTERM")


@dataclass
class State:
    cluster: str = ""
    nodes: dict[str, NodeState] = field(default_factory=dict)
    cluster_fingerprint: str | None = None
    runs: list[RunRecord] = field(default_factory=list)

    def node(self, name: str) -> NodeState:
        return self.nodes.setdefault(name, NodeState())

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "cluster": self.cluster,
            "cluster_fingerprint": self.cluster_fingerprint,
            "nodes": {k: asdict(v) for k, v in sorted(self.nodes.items())},
            "runs": [asdict(r) for r in self.runs[-MAX_RUNS:]],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        """The state from its JSON form; a ValueError names the first field of a wrong shape
        (a hand-edited file must not surface later as an AttributeError in plan)."""
        if data.get("version") != STATE_VERSION:
            raise StateVersionError(data.get("version"))
        nodes = _shaped(data.get("nodes", {}), dict, "nodes")
        runs = _shaped(data.get("runs", []), list, "runs")
        return cls(
            cluster=_shaped(data.get("cluster", ""), str, "cluster"),
            cluster_fingerprint=_optional(data.get("cluster_fingerprint"), "cluster_fingerprint"),
            nodes={k: NodeState(**_fields(_NODE_SHAPES, v, f"nodes.{k}")) for k, v in nodes.items()},
            runs=[RunRecord(**_fields(_RUN_SHAPES, r, f"runs[{i}]")) for i, r in enumerate(runs)],
        )


class StateVersionError(ValueError):
    def __init__(self, version: object) -> None:
        self.version = version
        super().__init__(f"state version {version!r}; this provision reads version {STATE_VERSION}")


# What each recorded field must hold: str, str | None ("str?"), list[str], dict[str, str], dict[str, int].
_NODE_SHAPES: dict[str, str] = {
    "lifecycle": "lifecycle", "fingerprints": "dict[str]", "applied_at": "str?", "last_run": "str?",
    "last_result": "str?", "removed_at": "str?", "recorded": "dict[str]",
}
_RUN_SHAPES: dict[str, str] = {
    "id": "str", "started": "str", "finished": "str?", "command": "str", "limit": "list[str]",
    "targets": "list[str]", "result": "str", "failed": "list[str]", "changed": "dict[int]", "results": "dict[str]",
    "stopped_at": "dict[str]", "note": "str",
}


def _shaped(value: Any, kind: type, where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: expected {'a JSON ' + kind.__name__ if kind is not str else 'a string'}, "
                         f"found {json.dumps(value)[:40]}")
    return value


def _optional(value: Any, where: str) -> str | None:
    return None if value is None else str(_shaped(value, str, where))


def _fits(shape: str, value: Any) -> bool:
    if shape == "lifecycle":
        return value in ("new", "installed", "configured", "removed")
    if shape.endswith("?") and value is None:
        return True
    if shape.rstrip("?") == "str":
        return isinstance(value, str)
    if shape == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    item = str if shape == "dict[str]" else int
    return isinstance(value, dict) and all(isinstance(v, item) and not isinstance(v, bool) for v in value.values())


def _fields(shapes: dict[str, str], value: Any, where: str) -> dict[str, Any]:
    """``value`` as keyword arguments of a record whose fields are ``shapes``, each checked."""
    _shaped(value, dict, where)
    for key, item in value.items():
        shape = shapes.get(key)
        if shape is None:
            raise ValueError(f"{where}: unknown field {key!r}")
        if not _fits(shape, item):
            wanted = "one of new, installed, configured, removed" if shape == "lifecycle" else shape
            raise ValueError(f"{where}.{key}: expected {wanted}, found {json.dumps(item)[:40]}")
    return dict(value)


def now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and not exc.filename:
            exc.filename = str(path)  # a full disk says ENOSPC; the message must say where
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


# A dry run (apply --check) holds the lock shared and writes no description into it.
CHECK_HOLDER = "a dry run (apply --check), which holds the lock without naming itself"


class StateDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._backed_up = False  # the state before this command's first save is kept once

    @classmethod
    def beside(cls, manifest: Path, override: Path | None = None) -> StateDir:
        return cls(override if override is not None else manifest.resolve().parent / ".provision")

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

    def backup(self, n: int = 1) -> Path:
        """``state.json.<n>``: the state before the n-th last command that changed it."""
        return self.root / f"state.json.{n}"

    def _not_a_directory(self) -> ProvisionError | None:
        if self.root.exists() and not self.root.is_dir():
            return ProvisionError(f"{self.root} is not a directory: the state directory must be one; "
                                  f"{STATE_DIR_HINT}")
        return None

    def ensure(self) -> None:
        problem = self._not_a_directory()
        if problem is not None:
            raise problem
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for sub in (self.runs, self.inventory):
                sub.mkdir(exist_ok=True)
            self.secrets.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.secrets, 0o700)
            self.known_hosts.touch(mode=0o600, exist_ok=True)
        except OSError as exc:
            where = "" if exc.filename in (None, str(self.root)) else f"{exc.filename}: "
            raise ProvisionError(f"cannot set up the state directory {self.root}: {where}{_reason(exc)}; "
                                 f"{STATE_DIR_HINT}") from None

    def remove_if_untouched(self) -> None:
        """Undo :meth:`ensure` for a command that changed nothing (a refused or aborted
        apply): the empty folders, the empty known_hosts and the lock file go, and the state
        directory itself when that leaves it empty. Anything with content stays."""
        for path in (self.known_hosts, self.root / "lock"):
            with contextlib.suppress(OSError):
                if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
                    path.unlink()
        # facts/: made by earlier versions (an empty fact cache), gone with the rest
        for folder in (self.root / "facts", self.runs, self.inventory, self.secrets, self.root):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty one

    def load(self) -> State:
        problem = self._not_a_directory()
        if problem is not None:
            raise problem
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise ProvisionError(f"{self.state_file}: cannot read the state ({_reason(exc)})") from None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError(f"expected a JSON object, found {type(data).__name__}")
            return State.from_json(data)
        except StateVersionError as exc:
            raise ProvisionError(f"{self.state_file}: {exc} (written by another version of provision?); "
                                 f"{STATE_DIR_HINT} or use the matching provision") from None
        except (ValueError, TypeError, AttributeError) as exc:  # bad JSON, bad UTF-8, wrong shapes
            raise ProvisionError(f"{self.state_file}: unreadable state ({exc}); {self._restore_hint()}") from None

    def _restore_hint(self) -> str:
        kept = [self.backup(n) for n in range(1, BACKUPS + 1) if self.backup(n).is_file()]
        if not kept:
            return ("no earlier state is kept beside it; move it aside to start afresh (every node is then "
                    "new; see docs/operations.md, 'State, logs and backups')")
        return (f"the state before the last change is kept in {kept[0]}: check it, then copy it over "
                f"{self.state_file}" + (f" (older: {', '.join(p.name for p in kept[1:])})" if kept[1:] else ""))

    def load_for(self, cluster: str) -> State:
        """The state, refused when it belongs to another cluster (two manifests beside each
        other share one default state directory)."""
        st = self.load()
        if st.cluster and st.cluster != cluster:
            raise ProvisionError(
                f"{self.root} belongs to cluster {st.cluster!r}, not {cluster!r}; give this manifest its own "
                "state directory with --state-dir (or keep each manifest in a folder of its own)"
            )
        return st

    def _keep_previous(self) -> None:
        """Before this command's first change, keep the current state as state.json.1
        (shifting older copies up to state.json.<BACKUPS>), each written atomically."""
        if self._backed_up:
            return
        try:
            current = self.state_file.read_text()
        except FileNotFoundError:
            self._backed_up = True
            return
        for n in range(BACKUPS, 1, -1):
            older = self.backup(n - 1)
            if older.is_file():
                atomic_write(self.backup(n), older.read_text(), 0o600)
        atomic_write(self.backup(1), current, 0o600)
        self._backed_up = True

    def save(self, state: State) -> None:
        text = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
        try:
            self._keep_previous()
            atomic_write(self.state_file, text, 0o600)  # as its backups: run history is the operator's
        except OSError as exc:
            raise ProvisionError(f"cannot write the state {self.state_file}: {_reason(exc)}; {STATE_DIR_HINT} "
                                 "(or make this one writable)") from None

    @contextlib.contextmanager
    def lock(self, command: str) -> Iterator[None]:
        """Hold the apply lock; a second holder is refused with the first one's description."""
        problem = self._not_a_directory()
        if problem is not None:
            raise problem
        path = self.root / "lock"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ProvisionError(f"cannot take the lock {path}: {_reason(exc)}; {STATE_DIR_HINT}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or CHECK_HOLDER
                raise ProvisionError(f"another provision run holds {path}: {holder}") from None
            info = f"{command} by {getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {now()}"
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, info.encode(), 0)
            except OSError as exc:  # a full disk: the holder's name cannot be written
                fcntl.flock(fd, fcntl.LOCK_UN)
                raise ProvisionError(f"cannot take the lock {path}: {_reason(exc)}; {STATE_DIR_HINT}") from None
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


    def lock_held(self) -> bool:
        """Whether a run holds the lock right now (it is never taken here)."""
        try:
            fd = os.open(self.root / "lock", os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def shared_lock(self) -> Iterator[None]:
        """For a dry run, which writes nothing: share the lock with other dry runs, and be
        refused while an apply holds it. Without a lock file (no apply ever ran here)
        nothing is created."""
        path = self.root / "lock"
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            yield
            return
        except OSError as exc:
            raise ProvisionError(f"cannot read the lock {path}: {_reason(exc)}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or CHECK_HOLDER
                raise ProvisionError(f"another provision run holds {path}: {holder}") from None
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
