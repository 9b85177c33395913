"""Pruning the image cache: every changed recipe leaves a new keyed image behind (a few
hundred MiB each) and nothing removed the old ones.

What is kept, per OS and for the deploy ramdisk: the current one (what ``<os><ext>`` and
``deploy-ramdisk`` point at, what the PXE server publishes) and the ``keep`` newest others
(to go back to), each with its checksum file and proof record. Leftovers of builds that died
(``.partial-*``, ``.ramdisk-*``, a proof's ``.proof-*`` tree) go once they are older than
any build may run. Anything else in the directory is never touched.

:func:`stale` decides from a listing (pure); :func:`scan` and :func:`remove` are the edges.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from provisioner.image.build import BUILD_TIMEOUT, PARTIAL_PREFIX, RAMDISK_WORK_PREFIX, current_name
from provisioner.image.proof import PROOF_SUFFIX
from provisioner.image.proof import WORK_PREFIX as PROOF_WORK_PREFIX
from provisioner.image.recipe import OS_IMAGES, RAMDISK
from provisioner.manifest.cluster import IMAGE_EXTS

_VERSIONED = re.compile(r"^(?P<os>" + "|".join(re.escape(o) for o in sorted(OS_IMAGES)) + r")-(?P<id>[^/]+?)"
                        r"(?P<ext>" + "|".join(re.escape(x) for x in IMAGE_EXTS) + r")$")
_RAMDISK = re.compile(r"^" + re.escape(RAMDISK) + r"-[0-9a-f]+$")


@dataclass(frozen=True)
class Entry:
    """One name in the cache directory."""

    name: str
    kind: str  # file, dir, link
    mtime: float
    size: int  # bytes (a directory: its files')
    target: str = ""  # a link's target name


@dataclass(frozen=True)
class Stale:
    names: tuple[str, ...]  # the entry with its checksum file and proof record, removed together
    size: int
    why: str


def _group(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Versioned images per OS, and the deploy ramdisks under RAMDISK."""
    groups: dict[str, list[Entry]] = {}
    for e in entries:
        if e.kind == "file" and (m := _VERSIONED.match(e.name)):
            groups.setdefault(m["os"], []).append(e)
        elif e.kind == "dir" and _RAMDISK.match(e.name):
            groups.setdefault(RAMDISK, []).append(e)
    return groups


def _current(entries: list[Entry], group: str) -> set[str]:
    """What the group's link points at (``<os><ext>``, ``deploy-ramdisk``)."""
    links = {RAMDISK} if group == RAMDISK else {current_name(group, ext) for ext in IMAGE_EXTS}
    return {os.path.basename(e.target) for e in entries if e.kind == "link" and e.name in links}


def stale(entries: list[Entry], keep: int, now: float, build_timeout: float = BUILD_TIMEOUT) -> list[Stale]:
    """What pruning removes from a cache listed as ``entries`` (see the module's text)."""
    if keep < 0:
        raise ValueError(f"keep must be 0 or more, not {keep}")
    by_name = {e.name: e for e in entries}
    out: list[Stale] = []
    for group, members in sorted(_group(entries).items()):
        current = _current(entries, group)
        others = sorted((e for e in members if e.name not in current), key=lambda e: (-e.mtime, e.name))
        what = "deploy ramdisk" if group == RAMDISK else f"{group} image"
        for e in others[keep:]:
            beside = [b for b in (by_name.get(f"{e.name}.sha256"), by_name.get(f"{e.name}{PROOF_SUFFIX}")) if b]
            out.append(Stale((e.name, *(b.name for b in beside)), e.size + sum(b.size for b in beside),
                             f"an older {what}, not the current one"))
    for e in entries:
        leftover = (e.kind == "file" and e.name.startswith(PARTIAL_PREFIX)) or (
            e.kind == "dir" and e.name.startswith((RAMDISK_WORK_PREFIX, PROOF_WORK_PREFIX)))
        if leftover and now - e.mtime > build_timeout:
            out.append(Stale((e.name,), e.size, "left by a build that did not finish"))
    return sorted(out, key=lambda s: s.names)


def _size(path: Path) -> int:
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    return sum((Path(root) / f).lstat().st_size for root, _, files in os.walk(path) for f in files)


def scan(cache: Path) -> list[Entry]:
    """The cache directory's entries (none when there is no cache)."""
    if not cache.is_dir():
        return []
    entries = []
    for path in sorted(cache.iterdir()):
        st = path.lstat()
        if path.is_symlink():
            entries.append(Entry(path.name, "link", st.st_mtime, 0, os.readlink(path)))
        else:
            entries.append(Entry(path.name, "dir" if path.is_dir() else "file", st.st_mtime, _size(path)))
    return entries


class RemoveError(Exception):
    """A file the cache's file system would not remove (read-only, ...): which, why, and how
    many of the stale entries were removed before it."""

    def __init__(self, path: str, reason: str, removed: int) -> None:
        self.path, self.reason, self.removed = path, reason, removed
        super().__init__(f"{path}: {reason}")


def remove(cache: Path, stale_entries: list[Stale]) -> None:
    """Remove each stale entry (with its checksum file and proof record), in order; stop at the
    first the file system refuses (:class:`RemoveError`)."""
    for done, s in enumerate(stale_entries):
        for name in s.names:
            path = cache / name
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            except OSError as exc:
                raise RemoveError(exc.filename or str(path), exc.strerror or str(exc), done) from None
