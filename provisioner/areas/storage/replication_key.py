"""The SSH key of ZFS replication, in the state directory's secrets: made once by an apply's
prepare step (the storage area's only side effect on the control machine), kept, never
shown. The zfs role copies the private half to the replicating nodes and authorizes the
public half on the receiving ones, for the forced command alone
(provisioner.areas.storage.replicate)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from provisioner.areas.storage.zfs import replications
from provisioner.manifest.load import Loaded
from provisioner.state import StateDir

KEY_NAME = "zfs-replication.key"  # in secrets/, with its .pub beside it (rolevars: zfs_replication_key_file)
KEYGEN_TIMEOUT = 30


def prepare(loaded: Loaded, state: StateDir) -> None:
    """The storage area's ``prepare`` step: the key exists before a run whenever the manifest
    replicates a dataset."""
    if replications(loaded.manifest):
        ensure_key(state.secrets / KEY_NAME, loaded.manifest.cluster.name)


def ensure_key(path: Path, cluster: str) -> None:
    """An ed25519 key pair at ``path`` (0600) and ``path.pub`` unless both exist; a private
    half without its public one is refused rather than replaced (the targets trust it)."""
    pub = path.with_name(path.name + ".pub")
    if path.exists() and pub.exists():
        return
    if path.exists() or pub.exists():
        raise ValueError(f"{path if path.exists() else pub} exists without its other half; "
                         "move it away and apply again (the nodes are given a new key)")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp_pub = tmp.with_name(tmp.name + ".pub")
    try:
        comment = f"provision-zfs-replication@{cluster}"
        proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(tmp)],
                              capture_output=True, text=True, timeout=KEYGEN_TIMEOUT, check=False)
        if proc.returncode != 0:
            raise ValueError(f"ssh-keygen could not make {path}: {proc.stderr.strip()}")
        os.chmod(tmp, 0o600)
        os.replace(tmp_pub, pub)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_pub.unlink(missing_ok=True)


def secret_values(state: StateDir) -> list[str]:
    """The private key's base64 lines, for the artifact scan of ``provision apply``."""
    path = state.secrets / KEY_NAME
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line and not line.startswith("-----")]
