"""The state directory beside the manifest (default ``.provision/``).

Layout::

    .provision/
      state.json      node lifecycle, applied fingerprints, run history (atomic writes)
      lock            held (flock) by a running apply; holds the holder's description
      known_hosts     SSH host keys: first contact recorded, later mismatch is an error
      facts/          Ansible fact cache (stable across runs)
      inventory/      the inventory the last run used
      runs/<id>/      ansible-runner artifacts per run (no env/ files: no secrets)
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

Lifecycle = Literal["new", "installed", "configured"]
STATE_VERSION = 1
MAX_RUNS = 100


@dataclass
class NodeState:
    lifecycle: Lifecycle = "new"
    fingerprints: dict[str, str] = field(default_factory=dict)
    applied_at: str | None = None
    last_run: str | None = None
    last_result: str | None = None


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
        if data.get("version") != STATE_VERSION:
            raise ProvisionError(f"state file version {data.get('version')!r} is not {STATE_VERSION}")
        return cls(
            cluster=str(data.get("cluster", "")),
            cluster_fingerprint=data.get("cluster_fingerprint"),
            nodes={k: NodeState(**v) for k, v in data.get("nodes", {}).items()},
            runs=[RunRecord(**r) for r in data.get("runs", [])],
        )


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
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateDir:
    def __init__(self, root: Path) -> None:
        self.root = root

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
    def facts(self) -> Path:
        return self.root / "facts"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in (self.facts, self.runs, self.inventory):
            sub.mkdir(exist_ok=True)
        self.secrets.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self.secrets, 0o700)
        self.known_hosts.touch(mode=0o600, exist_ok=True)

    def load(self) -> State:
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise ProvisionError(f"{self.state_file}: cannot read the state ({exc.strerror})") from None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError(f"expected a JSON object, found {type(data).__name__}")
            return State.from_json(data)
        except (ValueError, TypeError, AttributeError) as exc:  # bad JSON, bad UTF-8, wrong shapes
            raise ProvisionError(f"{self.state_file}: unreadable state ({exc}); restore it from a backup") from None

    def save(self, state: State) -> None:
        atomic_write(self.state_file, json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n")

    @contextlib.contextmanager
    def lock(self, command: str) -> Iterator[None]:
        """Hold the apply lock; a second holder is refused with the first one's description."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown holder"
                raise ProvisionError(f"another provision run holds {path}: {holder}") from None
            info = f"{command} by {getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} since {now()}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
