"""systemd mount and automount unit names (``systemd-escape --path``), pure."""

from __future__ import annotations

import functools
import re

_UNIT_SAFE = re.compile(r"[A-Za-z0-9:_.]")


@functools.lru_cache(maxsize=1024)  # pure; every node's mount units escape the same few paths
def systemd_escape_path(path: str) -> str:
    """``systemd-escape --path``: /mnt/corpus1 -> mnt-corpus1, / -> -."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "-"
    text = "/".join(parts)
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "/":
            out.append("-")
        elif _UNIT_SAFE.match(ch) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"\\x{b:02x}" for b in ch.encode())
    return "".join(out)


def mount_unit(path: str) -> str:
    return systemd_escape_path(path) + ".mount"


def automount_unit(path: str) -> str:
    return systemd_escape_path(path) + ".automount"


def under(path: str, parent: str) -> bool:
    """``path`` is ``parent`` or lies below it."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")
