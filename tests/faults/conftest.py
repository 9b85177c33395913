"""Fixtures of the fault suite (issue 27): a cluster on loopback and the real CLI in a subprocess.

Every node of these clusters lives on a loopback address, so nothing a command does can
reach another machine; every subprocess runs under a hard time bound.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA ops@test"


def loopback_manifest(port: int, addresses: tuple[str, ...] = ("127.0.0.1",), slurm: bool = False) -> dict[str, Any]:
    """Nodes n1 (head; compute too when it is the only node) .. nN (compute) on ``addresses``,
    SSH on ``port``."""
    return {
        "version": 1,
        "cluster": {"name": "faults", "admin_users": [{"name": "ops", "ssh_keys": [SSH_KEY]}],
                    "ssh": {"port": port}},
        "networks": {"management": {"cidr": "127.0.0.0/8"}},
        "nodes": [
            {"name": f"n{i}", "os": "debian-12",
             "roles": (["head"] if len(addresses) > 1 else ["head", "compute"]) if i == 1 else ["compute"],
             "interfaces": {"management": {"ip": address}},
             "hardware": {"cpu": {"cores_per_socket": 2}, "memory_gb": 4}}
            for i, address in enumerate(addresses, start=1)
        ],
        "docker": {"enabled": False},
        "slurm": {"enabled": True, "partitions": [{"name": "batch", "nodes": ["@compute"], "default": True}]}
        if slurm else {"enabled": False},
        "software": {"nvidia_driver": {"branch": "535", "source": "debian"},
                     "cuda": {"versions": ["11.8"], "source": "debian"}},
    }


@dataclass
class Cli:
    returncode: int
    stdout: str
    stderr: str

    @property
    def said(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture
def write_cluster(tmp_path: Path) -> Callable[..., Path]:
    def write(port: int = 9, addresses: tuple[str, ...] = ("127.0.0.1",), slurm: bool = False) -> Path:
        path = tmp_path / "cluster" / "cluster.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(loopback_manifest(port, addresses, slurm), sort_keys=False))
        return path
    return write


def read_only_mounts() -> str | None:
    """Why a command cannot be run with a folder mounted read-only (None: it can): that takes
    a mount namespace of its own (``unshare -m``), which needs root."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare or mount is not installed"
    r = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, timeout=30, check=False)
    return None if r.returncode == 0 else f"unshare -m: {r.stderr.strip()} (needs root)"


@pytest.fixture
def provision() -> Callable[..., Cli]:
    """Run ``python -m provisioner.cli ARGV`` bounded by ``timeout`` seconds; with
    ``read_only``, in a mount namespace of its own where that folder is mounted read-only
    (the file system answers EROFS to every write under it, also to root; outside the
    command nothing changes)."""
    def run(*argv: str, timeout: float = 120, cwd: Path | None = None,
            preexec: Callable[[], None] | None = None, env: dict[str, str] | None = None,
            read_only: Path | None = None) -> Cli:
        prefix: list[str] = []
        if read_only is not None:
            why = read_only_mounts()
            if why is not None:
                pytest.skip(f"a read-only folder: {why}")
            prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                      'mount --bind -o ro "$0" "$0" && exec "$@"', str(read_only)]
        r = subprocess.run([*prefix, sys.executable, "-m", "provisioner.cli", *argv], capture_output=True, text=True,
                           timeout=timeout, preexec_fn=preexec, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                           check=False)
        return Cli(r.returncode, r.stdout, r.stderr)
    return run



@pytest.fixture
def backup_tool() -> Path:
    """The head's backup tool (provision-backup), run with this Python as the head runs it."""
    return Path(__file__).resolve().parents[2] / "provisioner" / "areas" / "backup" / "tool.py"


@pytest.fixture
def backup_head(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """The head tool's configuration for a head in ``tmp_path``: its munge key (encrypted in a
    backup) and slurmctld's state, staged and backed up under ``tmp_path``; slurmctld is the
    one unit a restore stops and starts (a ``systemctl`` stand-in on PATH takes that)."""
    root = tmp_path / "head"
    (root / "munge").mkdir(parents=True)
    (root / "munge" / "munge.key").write_bytes(b"k" * 128)
    (root / "state").mkdir()
    (root / "state" / "job_state").write_bytes(b"jobs" * 100)
    key = tmp_path / "backup.key"
    key.write_text("correct horse battery staple\n")
    key.chmod(0o400)
    return {
        "cluster": "faults", "staging": str(tmp_path / "staging"), "keep": 2, "key_file": str(key), "timeout_s": 60,
        "destination": {"kind": "local", "path": str(tmp_path / "dest")},
        "parts": [
            {"name": "munge", "kind": "files", "path": str(root / "munge"), "file": "munge.tar.gz", "encrypt": True},
            {"name": "slurmctld", "kind": "files", "path": str(root / "state"), "file": "slurmctld-state.tar.gz",
             "encrypt": False},
        ],
        "services": {"stop": ["slurmctld"], "start": ["slurmctld"]},
    }, root
