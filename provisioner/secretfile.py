"""An operator's secret held in a file on the admin host (a password, a token): read only from
a regular file others cannot read, and never shown in a message."""

from __future__ import annotations

import stat
from pathlib import Path

from provisioner.errors import ProvisionError


def private_file_text(path: Path, where: str) -> str:
    """The file's text with one trailing newline dropped. Each message starts with ``where``
    (the manifest field) and names the path, never the content."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ProvisionError(f"{where}: {path} is not a regular file")
        if info.st_mode & stat.S_IROTH:
            raise ProvisionError(f"{where}: {path} is readable by everyone; run chmod o-r {path}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError(f"{where}: cannot read {path}: {exc}") from None
    return text[:-1] if text.endswith("\n") else text
