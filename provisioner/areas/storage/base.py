"""What the storage area's modules share: its error, its constants, option merging."""

from __future__ import annotations

from collections.abc import Sequence

BY_ID_DIR = "/dev/disk/by-id"
NFS_RDMA_PORT = 20049


class StorageError(ValueError):
    """The manifest asks for something the storage logic cannot build. ``node`` names the
    node that has to change, when it is not the one whose variables were being computed
    (an RDMA mount on a client without InfiniBand, found while rendering the server)."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


# Option pairs that contradict each other: a manifest option replaces the generated one.
_OPPOSITES = {
    "rw": "ro", "ro": "rw",
    "sync": "async", "async": "sync",
    "root_squash": "no_root_squash", "no_root_squash": "root_squash",
    "all_squash": "no_all_squash", "no_all_squash": "all_squash",
    "subtree_check": "no_subtree_check", "no_subtree_check": "subtree_check",
    "secure": "insecure", "insecure": "secure",
    "hard": "soft", "soft": "hard",
}


def merge_options(generated: Sequence[str], extra: Sequence[str]) -> list[str]:
    """Generated options followed by the manifest's own; a manifest option overrides a
    generated one with the same key (``nconnect=4``) or its opposite (``async``)."""
    def key(opt: str) -> str:
        return opt.split("=", 1)[0]

    overridden = {key(o) for o in extra} | {_OPPOSITES.get(key(o), "") for o in extra}
    out = [o for o in generated if key(o) not in overridden]
    for o in extra:
        if o not in out:
            out.append(o)
    return out
