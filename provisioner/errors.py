"""Error types shared by the manifest loader, validator and CLI.

Every user-facing problem becomes a :class:`Diagnostic`: a file, a position, a dotted field
path and a message. The CLI prints them as ``file:line:col: path: message``.
"""

from __future__ import annotations

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
