"""Error types shared by the manifest loader, validator and CLI.

Every user-facing problem becomes a :class:`Diagnostic`: a file, a position, a dotted field
path and a message. The CLI prints them as ``file:line:col: path: message``.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int  # 1-based; 0 when unknown
    col: int  # 1-based; 0 when unknown
    path: str  # dotted field path, "" for the whole document
    message: str
    severity: str = field(default="error", compare=False)

    def format(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.col or 1}"
        label = "" if self.severity == "error" else f"{self.severity}: "
        if self.path:
            return f"{where}: {label}{self.path}: {self.message}"
        return f"{where}: {label}{self.message}"


class ManifestError(Exception):
    """Raised with one or more diagnostics when a manifest cannot be used."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = sorted(diagnostics)
        super().__init__("\n".join(d.format() for d in self.diagnostics))


class ProvisionError(Exception):
    """An operational error (state lock, runner, BMC) with a one-line message for the user."""


# Network errno values in words (an unreachable server must read as such, never as a bare
# number): used for SSH probes, BMC sessions and Ansible's unreachable messages.
NETWORK_ERRNO_WORDS: dict[int, str] = {
    errno.ENETUNREACH: "network is unreachable",
    errno.EHOSTUNREACH: "no route to host",
    errno.EHOSTDOWN: "host is down",
    errno.ECONNREFUSED: "connection refused",
    errno.ETIMEDOUT: "timed out",
    errno.ECONNRESET: "connection reset by the other end",
    errno.ECONNABORTED: "connection aborted",
    errno.EPIPE: "broken pipe (the other end closed the connection)",
    errno.ENETDOWN: "network is down",
    errno.EADDRNOTAVAIL: "address not available on this machine",
}


def network_reason(exc: BaseException) -> str | None:
    """Words for a network error ("no route to host"), or None when ``exc`` is not one.

    Knows OSError's errno, a bare errno number as the only argument (what pyghmi raises:
    ``101``), and ``[Errno N] text`` inside a message."""
    code: int | None = None
    if isinstance(exc, OSError) and exc.errno is not None:
        code = exc.errno
    elif isinstance(exc, TimeoutError):
        code = errno.ETIMEDOUT
    elif exc.args and isinstance(exc.args[0], int) and not isinstance(exc.args[0], bool):
        code = exc.args[0]
    elif exc.args and isinstance(exc.args[0], str):
        return errno_text_reason(exc.args[0])
    if code is None:
        return None
    return NETWORK_ERRNO_WORDS.get(code)


def errno_text_reason(text: str) -> str | None:
    """Words for ``[Errno 113] No route to host`` or a bare ``113`` in a message."""
    match = re.search(r"\[Errno (\d+)\]", text) or re.fullmatch(r"\s*(\d+)\s*", text)
    if match is None:
        return None
    return NETWORK_ERRNO_WORDS.get(int(match.group(1)))
