"""provisioner.areas.slurm.munge: the cluster's MUNGE key."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.slurm.munge import ensure_munge_key, prepare_munge_key
from provisioner.state import StateDir


def test_munge_key_created_once_private(tmp_path: Path) -> None:
    key = tmp_path / "state" / "secrets" / "munge.key"
    old = os.umask(0)
    try:
        ensure_munge_key(key)
    finally:
        os.umask(old)
    st_ = key.stat()
    assert stat.S_IMODE(st_.st_mode) == 0o600
    assert st_.st_size == 1024
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    content = key.read_bytes()
    ensure_munge_key(key)
    assert key.read_bytes() == content
    assert list(key.parent.iterdir()) == [key]  # no temporary file left behind


def test_munge_keys_are_random(tmp_path: Path) -> None:
    ensure_munge_key(tmp_path / "a")
    ensure_munge_key(tmp_path / "b")
    assert (tmp_path / "a").read_bytes() != (tmp_path / "b").read_bytes()


def test_existing_key_kept_and_tightened(tmp_path: Path) -> None:
    key = tmp_path / "munge.key"
    key.write_bytes(b"k" * 64)
    key.chmod(0o644)
    ensure_munge_key(key)
    assert key.read_bytes() == b"k" * 64
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["dir", "short", "symlink"])
def test_unusable_existing_key_refused(tmp_path: Path, kind: str) -> None:
    key = tmp_path / "munge.key"
    if kind == "dir":
        key.mkdir()
    elif kind == "short":
        key.write_bytes(b"x" * 8)
    else:
        key.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError):
        ensure_munge_key(key)


def test_prepare_hook_creates_the_key_when_slurm_is_on(kit: Any, tmp_path: Path) -> None:
    state = StateDir(tmp_path / ".provision")
    loaded = kit.load(kit.base())
    prepare_munge_key(loaded, state)
    key = state.secrets / "munge.key"
    assert key.stat().st_size == 1024 and stat.S_IMODE(key.stat().st_mode) == 0o600

    off = kit.base()
    off["slurm"] = {"enabled": False}
    other = StateDir(tmp_path / "other")
    prepare_munge_key(kit.load(off), other)
    assert not (other.secrets / "munge.key").exists()
