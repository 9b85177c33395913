"""Running a chroot builder (mmdebstrap) so that a stop leaves nothing mounted (issue 27).

mmdebstrap --mode=root mounts proc, sys and dev inside the chroot it builds in a folder of
``$TMPDIR`` (or, with ``--format=directory``, in its target), and on a signal unmounts them
and removes the folder on its way out. Two things cut that short: a terminal's Ctrl-C (or a
closed terminal's SIGHUP) reaches every process of the foreground group, and the command's
own stop then ended every process it had started, mmdebstrap's ``umount`` and ``rm`` among
them: proc, sys and dev stayed mounted under /tmp.

So :func:`run` starts a builder in a session of its own (the terminal's signals do not reach
it) with ``TMPDIR`` a folder of ours. A stop (a signal raised while we wait, or the time
bound) is passed on as one SIGTERM to the builder's process group, which then has
``stop_wait`` seconds to clean up before the group is killed. Whatever is still mounted under
our folder (or the caller's ``also``) is then unmounted, lazily and deepest first, and our
folder removed, never across a mount point. Whoever stops every process a command started
(:func:`provisioner.proctree.processes_end_with_a_signal`) spares a builder being run here
(:func:`stops_itself`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from provisioner.errors import ProvisionError

STOP_WAIT = 60.0  # after our SIGTERM, the builder's time to unmount and remove its chroot
KILL_WAIT = 5.0  # after SIGKILL, how long its process group may take to be gone
MNT_DETACH = 2  # sys/mount.h: a lazy unmount
MOUNTINFO = Path("/proc/self/mountinfo")
SCRATCH_PREFIX = "provision-build-"

_running: set[int] = set()  # session ids of the builders being run by :func:`run` now


def stops_itself(pid: int) -> bool:
    """Whether ``pid`` belongs to a builder :func:`run` is running now (and will stop itself)."""
    try:
        return os.getsid(pid) in _running
    except OSError:
        return False


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_under(folder: str, mountinfo: str) -> list[str]:
    """The mount points at or below ``folder`` (a real path) in ``mountinfo`` (the text of
    /proc/self/mountinfo), deepest first, each once."""
    root = folder.rstrip("/") or "/"
    found: set[str] = set()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == root or point.startswith(root + "/"):
            found.add(point)
    return sorted(found, key=lambda p: (-p.count("/"), p))


def _mounted(folder: Path) -> list[str]:
    try:
        return mounts_under(os.path.realpath(folder), MOUNTINFO.read_text())
    except OSError:
        return []


def unmount_under(folder: Path) -> list[str]:
    """Unmount (lazily, deepest first) everything mounted at or below ``folder``; returns
    what is still mounted there after (nothing normally)."""
    left = _mounted(folder)
    if not left:
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    for point in left:
        libc.umount2(point.encode(), MNT_DETACH)  # a parent's lazy unmount takes its children along
    return _mounted(folder)


def remove(folder: Path) -> bool:
    """Remove ``folder`` unless something is still mounted under it (removing through a
    mount point would delete what the mount shows); True when it is gone."""
    if _mounted(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the process group ``pgid``; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_group(pgid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-pgid, os.WNOHANG)[0] > 0:
            pass


def stop(proc: subprocess.Popen[Any], stop_wait: float = STOP_WAIT) -> None:
    """Pass a stop on to the builder ``proc`` (leader of its own session and process group):
    one SIGTERM to the group, ``stop_wait`` seconds for its cleanup, then SIGKILL to whatever
    of the group is left, until it is gone (bounded). A further signal raised meanwhile does
    not cut the cleanup short: the builder's unmounting is what it is waiting for."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + stop_wait
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            proc.wait(timeout=min(0.2, max(deadline - time.monotonic(), 0.01)))
        except subprocess.TimeoutExpired:
            continue
        except BaseException:  # a second signal: the cleanup goes on (bounded)
            continue
    deadline = time.monotonic() + KILL_WAIT
    while _signal_group(pgid, signal.SIGKILL) and time.monotonic() < deadline:
        proc.poll()  # the leader's own status first, then the group's orphans adopted by us
        _reap_group(pgid)
        with contextlib.suppress(BaseException):
            time.sleep(0.05)
    with contextlib.suppress(BaseException):
        proc.wait(timeout=1)


def run(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float, check: bool = False,
        also: Path | None = None, stop_wait: float = STOP_WAIT) -> subprocess.CompletedProcess[bytes]:
    """Run the builder ``cmd`` (as :func:`subprocess.run` with no capture would) in a
    session of its own, ``TMPDIR`` a new folder of ours; whatever ends it early (a signal
    raised while we wait, ``timeout``: :class:`subprocess.TimeoutExpired`) is passed on as
    :func:`stop`. Afterwards, however it ended, nothing stays mounted under our folder or
    ``also`` (the builder's target, when it is a folder), and our folder is gone."""
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    folders = [scratch, *([also] if also is not None else [])]
    try:
        proc = subprocess.Popen(list(cmd), env={**(os.environ if env is None else env), "TMPDIR": str(scratch)},
                                start_new_session=True)
        _running.add(proc.pid)
        try:
            returncode = proc.wait(timeout=timeout)
        except BaseException:
            stop(proc, stop_wait)
            raise
        finally:
            _running.discard(proc.pid)
    except BaseException:
        for folder in folders:
            unmount_under(folder)
        remove(scratch)
        raise
    left = [point for folder in folders for point in unmount_under(folder)]
    remove(scratch)
    if left:
        raise ProvisionError(f"{cmd[0]} left {left[0]} mounted and it could not be unmounted: "
                             f"umount --lazy {left[0]}, then remove {scratch}")
    if check and returncode != 0:
        raise subprocess.CalledProcessError(returncode, list(cmd))
    return subprocess.CompletedProcess(list(cmd), returncode)
