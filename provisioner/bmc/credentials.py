"""BMC passwords from the manifest's ``password_env`` or ``password_file`` reference.

The value is wrapped in :class:`Secret`, whose ``str``/``repr`` never show it; drivers call
:meth:`Secret.reveal` only when handing it to the protocol library. Nothing here logs.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from provisioner.bmc.base import BmcError
from provisioner.manifest.nodes import Bmc as BmcConfig


class Secret:
    """A string that does not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


def resolve_password(
    node: str, bmc: BmcConfig, *, environ: Mapping[str, str] | None = None
) -> Secret:
    """Read the BMC password that ``bmc`` references.

    ``password_env``: the variable must be set and non-empty. ``password_file``: the file
    must exist, be a regular file and not be readable by others (like ssh private keys);
    one trailing newline is stripped.
    """
    env = os.environ if environ is None else environ
    address = bmc.address
    if bmc.password_env is not None:
        value = env.get(bmc.password_env, "")
        if not value:
            raise BmcError(
                node, address,
                f"the BMC password for {node} is not set: environment variable {bmc.password_env} "
                "is empty or unset",
                kind="config",
            )
        return Secret(value)
    if bmc.password_file is None:  # the model guarantees one of the two
        raise BmcError(node, address, f"{node}: no BMC password reference", kind="config")
    path = Path(bmc.password_file).expanduser()
    try:
        info = path.stat()
    except OSError as exc:
        raise BmcError(
            node, address, f"cannot read the BMC password file {path} for {node}: {exc.strerror}", kind="config"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise BmcError(node, address, f"the BMC password file {path} for {node} is not a regular file", kind="config")
    if info.st_mode & stat.S_IROTH:
        raise BmcError(
            node, address,
            f"the BMC password file {path} for {node} is readable by everyone; run chmod o-r {path}",
            kind="config",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise BmcError(
            node, address, f"cannot read the BMC password file {path} for {node}: {reason}", kind="config"
        ) from None
    value = text[:-1] if text.endswith("\n") else text
    value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise BmcError(node, address, f"the BMC password file {path} for {node} is empty", kind="config")
    return Secret(value)
