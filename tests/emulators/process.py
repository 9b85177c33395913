"""A background emulator process that stops with the test: the shared part of the BMC emulators."""

from __future__ import annotations

import subprocess
from types import TracebackType
from typing import TypeVar

T = TypeVar("T", bound="EmulatorProcess")


class EmulatorProcess:
    """Owns one subprocess; subclasses start it in ``start()`` and set ``self._proc``."""

    _proc: subprocess.Popen[bytes] | None = None

    def start(self: T) -> T:
        raise NotImplementedError

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self: T) -> T:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
