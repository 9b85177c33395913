"""Signals that end a command: Ctrl-C (SIGINT), SIGTERM, and SIGHUP (the terminal closed).

A command that changes machines must never simply die on one of them: an ansible-playbook
run would go on without anyone recording it, its lock released (issue: a closed terminal
orphaned ansible-playbook and a second apply was accepted beside it). Inside
:class:`Signals` every one of the three raises :class:`Interrupted` in the main thread,
except inside :meth:`Signals.deferred`, where it is only recorded: long steps (a playbook
run, the bare-metal installs) poll :meth:`Signals.stop_requested`, stop their own work
(the whole process tree), and the caller records what finished before raising.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from provisioner.errors import ProvisionError

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(ProvisionError):
    """The command was stopped by a signal; ``exit_code`` is the shell's 128 + signal."""

    def __init__(self, signum: int, detail: str = "") -> None:
        self.signum = signum
        self.detail = detail  # where it stopped and what is left, after the signal's words
        name = signal.Signals(signum).name
        what = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"interrupted by {name}"
        super().__init__(what + (f": {detail}" if detail else ""))

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


class Signals:
    """Catch SIGINT, SIGTERM and SIGHUP while the context is open (main thread only; in
    another thread it records nothing and changes nothing). A signal the process was started
    ignoring stays ignored: ``nohup provision apply`` goes on when the terminal closes."""

    def __init__(self, on_signal: Callable[[], bool | None] | None = None) -> None:
        """``on_signal``: called in the main thread when a signal arrives, before anything is
        raised (e.g. end the command's child processes, so that nothing they do lands after
        the command said it was interrupted). It returns True when the main thread is in a
        step that must not be broken off (holding a lock, or starting a child whose handle
        would be lost): nothing is raised then, and that step raises through
        :meth:`raise_if_stopped` once it is done."""
        self.received: int | None = None
        self._deferred = 0
        self._saved: dict[signal.Signals, Any] = {}
        self._on_signal = on_signal

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:  # nohup (or the caller) asked to ignore it: keep that
                    continue
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        held = bool(self._on_signal()) if self._on_signal is not None else False
        if self._deferred == 0 and not held:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Record signals without raising: the code inside polls :meth:`stop_requested`."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1

    def stop_requested(self) -> bool:
        return self.received is not None

    def raise_if_stopped(self, detail: str = "") -> None:
        if self.received is not None:
            raise Interrupted(self.received, detail)

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less once a signal came; True when one came."""
        deadline = time.monotonic() + seconds
        while self.received is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, 0.2))
        return True
