"""BMC passwords from the manifest's ``password_env`` or ``password_file`` reference.

The value is wrapped in :class:`Secret`, whose ``str``/``repr`` never show it; drivers call
:meth:`Secret.reveal` only when handing it to the protocol library. Nothing here logs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from provisioner.bmc.base import BmcError
from provisioner.errors import ProvisionError
from provisioner.manifest.nodes import Bmc as BmcConfig
from provisioner.secretfile import private_file_text


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
    what = f"the BMC password of {node}"
    try:
        value = private_file_text(path, "bmc.password_file", what)
    except ProvisionError as exc:
        raise BmcError(node, address, str(exc), kind="config") from None
    value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise BmcError(node, address, f"bmc.password_file: {path} ({what}): empty", kind="config")
    return Secret(value)
