"""An operator's secret held in a file on the admin host (a password, a token, a passphrase):
read only from a regular file others cannot read, and never shown in a message.

Every refusal has one shape, ``<field>: <path> (<what it is for>): <problem>``, e.g.
``backup.key_file: /root/backup.key (the backup passphrase): readable by everyone; run
chmod o-r /root/backup.key``.
"""

from __future__ import annotations

import stat
from pathlib import Path

from provisioner.errors import ProvisionError


def private_file_text(path: Path, where: str, what: str, *, one_line: bool = False) -> str:
    """The file's text with one trailing newline dropped. ``where``: the manifest field that
    names the file; ``what``: what the secret is for. ``one_line``: the text must be one
    non-empty line. Messages name the path, never the content."""

    def refused(problem: str) -> ProvisionError:
        return ProvisionError(f"{where}: {path} ({what}): {problem}")

    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise refused("not a regular file")
        if info.st_mode & stat.S_IROTH:
            raise refused(f"readable by everyone; run chmod o-r {path}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise refused(f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise refused("cannot read it: not UTF-8 text") from None
    value = text[:-1] if text.endswith("\n") else text
    if one_line and (not value or "\n" in value):
        raise refused("must hold one non-empty line")
    return value
