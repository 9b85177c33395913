"""The cluster's MUNGE key in the state directory: made once, kept, never shown (the only
side effect of the slurm area's decisions)."""

from __future__ import annotations

import base64
import os
import secrets
import stat
from pathlib import Path

from provisioner.manifest.load import Loaded
from provisioner.state import StateDir

MUNGE_KEY_BYTES = 1024
MUNGE_KEY_MIN_BYTES = 32  # munged refuses shorter keys
MUNGE_KEY_NAME = "munge.key"  # in the state directory's secrets/ (rolevars: munge_key_file)


def prepare_munge_key(loaded: Loaded, state: StateDir) -> None:
    """The slurm area's ``prepare`` step (provisioner.areas.registry): the cluster's munge
    key exists before a run whenever the manifest enables Slurm."""
    if loaded.manifest.slurm.enabled:
        ensure_munge_key(state.secrets / MUNGE_KEY_NAME)


def secret_values(state: StateDir) -> list[str]:
    """The munge key as it could appear in a run's artifacts (hex, base64), for the artifact
    scan of ``provision apply``; none before the key exists."""
    key = state.secrets / MUNGE_KEY_NAME
    if not key.exists():
        return []
    raw = key.read_bytes()
    return [raw.hex(), base64.b64encode(raw).decode()]


def ensure_munge_key(path: Path) -> None:
    """Create the cluster's MUNGE key (1024 random bytes, mode 0600) unless it exists.

    Created atomically: written to a temporary file in the same directory, then hard-linked
    into place, so a concurrent run never sees a partial key and never overwrites one. An
    existing key is kept (it is the cluster's identity); one that is not a regular file or
    is too short raises ``ValueError``; group/other permission bits are removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists() or path.is_symlink():
        _check_existing_key(path)
        return
    fd = -1
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)  # the umask cannot widen it, but be explicit
        data = secrets.token_bytes(MUNGE_KEY_BYTES)
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)
        except FileExistsError:
            _check_existing_key(path)  # another run won the race: keep its key
    except OSError as exc:  # a full disk says ENOSPC; the message must say where
        if exc.errno is not None:
            exc.filename = exc.filename or str(path)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _check_existing_key(path: Path) -> None:
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} exists but is not a regular file; refusing to use it as the munge key")
    if st.st_size < MUNGE_KEY_MIN_BYTES:
        raise ValueError(f"{path} holds {st.st_size} bytes; a munge key needs at least {MUNGE_KEY_MIN_BYTES}")
    if st.st_mode & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
