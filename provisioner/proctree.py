"""Our process tree (Linux /proc): find every process a run started, and stop them all.

ansible-playbook's workers each start a session of their own (``os.setsid``), so killing
ansible-playbook's process group leaves them, and the ssh clients under them, running;
once their parent is gone they would be adopted by PID 1 and lost from view. While
:func:`subreaper` is on, orphans of our descendants are adopted by this process instead,
so :func:`stop_tree` finds and ends every one of them, and waits until they are gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from provisioner.image import builder
from provisioner.interrupts import Signals

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid`` from /proc/<pid>/stat, or None when gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses; it ends at the last ')'
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 2:
        return None
    return int(rest[1]), rest[0]


def descendants(root: int | None = None) -> list[int]:
    """Every living process below ``root`` (default: this process), parents first."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        info = _stat(int(entry.name))
        if info is not None:
            children.setdefault(info[0], []).append(int(entry.name))
            states[int(entry.name)] = info[1]
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return [p for p in out if states.get(p) != "Z"] + [p for p in out if states.get(p) == "Z"]


def ssh_master(pid: int) -> bool:
    """Whether ``pid`` is an OpenSSH connection master (its title ``ssh: <ControlPath> [mux]``)."""
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    title = cmdline.split(b"\0")[0].strip()  # setproctitle wrote it over argv[0] (and on, padded)
    return title.startswith(b"ssh: ") and title.endswith(b" [mux]")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _set_subreaper(on: bool) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Adopt orphaned descendants while open (yields whether the kernel agreed)."""
    on = _set_subreaper(True)
    try:
        yield on
    finally:
        if on:
            _set_subreaper(False)


def stop_tree(
    *,
    grace: float = 3.0,
    deadline: float = 20.0,
    root: int | None = None,
    keep: Callable[[int], bool] = lambda _pid: False,
) -> list[int]:
    """Stop every process below ``root`` (default: this process): SIGTERM, then after
    ``grace`` seconds SIGKILL, reaping our own children, until none is left or
    ``deadline`` passes. Returns the pids still there at the deadline (none normally).
    ``keep(pid)`` spares a process (and is asked for each one found)."""
    own = os.getpid() if root is None else root
    start = time.monotonic()
    termed: set[int] = set()
    while True:
        alive = [p for p in descendants(own) if not keep(p)]
        living = [p for p in alive if (_stat(p) or (0, "Z"))[1] != "Z"]
        for pid in alive:
            if (_stat(pid) or (0, ""))[0] == os.getpid():
                _reap(pid)
        if not living:
            return []
        waited = time.monotonic() - start
        if waited >= deadline:
            return living
        for pid in living:
            sig = signal.SIGKILL if pid in termed and waited >= grace else signal.SIGTERM
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
            termed.add(pid)
        time.sleep(0.1)


@contextlib.contextmanager
def processes_end_with_a_signal(grace: float) -> Iterator[Signals]:
    """While open, SIGINT, SIGTERM and SIGHUP first end every process started meanwhile below
    this one, their orphans included (this process adopts them: :func:`subreaper`):
    TERM, then KILL after ``grace`` seconds; only then is Interrupted raised. For commands that
    run tools which start children of their own (mmdebstrap's apt, tar): killing the tool
    alone left those writing on after the command said it was interrupted. A chroot builder
    run by :func:`provisioner.image.builder.run` is spared: it is passed the stop itself and
    given the time to unmount what it mounted."""
    earlier = set(descendants())
    with subreaper(), Signals(on_signal=lambda: _stop_new(earlier, grace)) as signals:
        yield signals


def _stop_new(earlier: set[int], grace: float) -> None:
    stop_tree(grace=grace, deadline=grace + 10, keep=lambda pid: pid in earlier or builder.stops_itself(pid))
