"""A stand-in for ``mmdebstrap --mode=root`` that mounts as it does and contacts nothing.

It makes its chroot in ``$TMPDIR`` (``mmdebstrap.XXXXXXXXXX``), waits in a child (its
setting up: ``sleep <setup>``), mounts a tmpfs at the chroot's ``proc`` (source
:data:`SOURCE`), waits in a child again (its apt: ``sleep <build>``), then writes the
``.tar.gz`` or ``.tar.zst`` it was asked for, unmounts and removes the chroot. On SIGINT, SIGTERM or SIGHUP
it cleans up as mmdebstrap does, through children of its own (a cleanup that takes a second,
as removing a real chroot does); ended with them, it leaves the mount. ``deaf``: it ignores
those signals (only SIGKILL ends it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

SOURCE = "provision-stand-in"  # the tmpfs's source in /proc/self/mountinfo

BODY = """\
out=""
for a in "$@"; do case "$a" in *.tar.gz|*.tar.zst) out="$a";; esac; done
root=$(mktemp -d "${{TMPDIR:-/tmp}}/mmdebstrap.XXXXXXXXXX")
cleanup() {{
  sleep 1 && {{ if mountpoint -q "$root/proc"; then umount "$root/proc"; fi && rm -rf "$root"; }}
  exit 1
}}
{trap}
sleep {setup} &
wait $! 2>/dev/null
mkdir "$root/proc" && mount -t tmpfs {source} "$root/proc" || exit 1
sleep {build} &
wait $! 2>/dev/null
if [ -n "$out" ]; then
  mkdir -p "$root/boot" && : > "$root/boot/vmlinuz-6.1.0-13-amd64" && tar -caf "$out" -C "$root" boot
fi
umount "$root/proc" && rm -rf "$root"
"""


def write(bin_dir: Path, setup: str, build: str, *, deaf: bool = False) -> Path:
    """Write the stand-in as ``bin_dir/mmdebstrap``; ``setup`` and ``build`` are how long it
    sleeps at each moment (distinct numbers make its children findable)."""
    trap = "trap '' INT TERM HUP" if deaf else "trap cleanup INT TERM HUP"
    path = bin_dir / "mmdebstrap"
    path.write_text("#!/bin/sh\n" + BODY.format(trap=trap, setup=setup, build=build, source=SOURCE))
    path.chmod(0o755)
    return path


def mounts(under: Path) -> list[str]:
    """The stand-in's mounts still there below ``under``."""
    root = str(under.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        point = before.split(" ")[4]
        if after.split(" ")[1:2] == [SOURCE] and point.startswith(root + "/"):
            found.append(point)
    return found


def unmount_all(under: Path) -> None:
    """Unmount whatever the stand-in left below ``under`` (lazily), so that a failing test
    leaves nothing."""
    libc = ctypes.CDLL(None, use_errno=True)
    for point in mounts(under):
        with contextlib.suppress(OSError):
            libc.umount2(point.encode(), 2)


def signal_self_when(reached: Callable[[], bool], sig: signal.Signals = signal.SIGTERM) -> threading.Thread:
    """Send ``sig`` to this process once ``reached()`` (polled; 30 s at most, then none is sent)."""
    def send() -> None:
        deadline = time.monotonic() + 30
        while not reached():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        os.kill(os.getpid(), sig)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def sleeping(seconds: str) -> Callable[[], bool]:
    """Whether a `sleep <seconds>` (the stand-in waiting at a moment) runs now."""
    def found() -> bool:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "cmdline").read_bytes() == b"sleep\0" + seconds.encode() + b"\0":
                        return True
                except OSError:
                    continue
        return False
    return found
