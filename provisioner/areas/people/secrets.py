"""The directory's bind password and CA (identity sssd), read on the admin host before an
apply (the area's ``prepare`` step, the only side effects here).

The password is read from ``bind_password_env`` or ``bind_password_file`` into the state
directory (``secrets/people/bind_password``, 0600 in the 0700 secrets directory), where the
``sssd`` role reads it on the control machine in tasks that log nothing: it is never in the
inventory, a role variable, or a run's records. The CA file must be a PEM certificate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from provisioner.areas.people.decide import directory
from provisioner.errors import ProvisionError
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.people import Sssd
from provisioner.secretfile import private_file_text
from provisioner.state import StateDir

SECRETS_SUBDIR = "people"
BIND_PASSWORD = "bind_password"
PEM_CERTIFICATE = "-----BEGIN CERTIFICATE-----"


def bind_password_var() -> str:
    """The role variable's value: the secret's path on the control machine, never the value."""
    return "{{ provision_state_dir }}/secrets/" + f"{SECRETS_SUBDIR}/{BIND_PASSWORD}"


def secret_envs(m: Manifest) -> set[str]:
    d = directory(m)
    return {d.bind_password_env} if d is not None and d.bind_password_env is not None else set()




def read_bind_password(d: Sssd, environ: Mapping[str, str] | None = None) -> str | None:
    """The bind password from its variable or file; None for anonymous reads (no bind_dn)."""
    if d.bind_password_env is not None:
        value = (os.environ if environ is None else environ).get(d.bind_password_env, "")
        if not value or "\n" in value:
            raise ProvisionError(f"identity.sssd.bind_password_env: environment variable {d.bind_password_env} "
                                 "is empty, unset or more than one line")
        return value
    if d.bind_password_file is not None:
        return private_file_text(Path(d.bind_password_file), "identity.sssd.bind_password_file",
                                 "the directory's bind password", one_line=True)
    return None


def check_ca_file(d: Sssd) -> None:
    """The CA file holds a PEM certificate (the nodes verify the servers with it)."""
    path = Path(d.ca_file)
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProvisionError(f"identity.sssd.ca_file: cannot read {path}: {exc}") from None
    if PEM_CERTIFICATE not in text:
        raise ProvisionError(f"identity.sssd.ca_file: {path} holds no PEM certificate ({PEM_CERTIFICATE})")


def _write_private(path: Path, value: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def prepare_directory(loaded: Loaded, state: StateDir) -> None:
    """The area's ``prepare`` step: the CA checked and the bind password copied into
    ``secrets/people/`` for the role; removed when the manifest no longer binds with one."""
    folder = state.secrets / SECRETS_SUBDIR
    target = folder / BIND_PASSWORD
    d = directory(loaded.manifest)
    if d is None:
        target.unlink(missing_ok=True)
        return
    check_ca_file(d)
    value = read_bind_password(d)
    if value is None:
        target.unlink(missing_ok=True)
        return
    state.secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    _write_private(target, value)


def secret_values(state: StateDir) -> list[str]:
    """The prepared bind password, for the artifact scan of ``provision apply``."""
    path = state.secrets / SECRETS_SUBDIR / BIND_PASSWORD
    try:
        return [path.read_text(encoding="utf-8")] if path.is_file() else []
    except (OSError, UnicodeDecodeError):
        return []
