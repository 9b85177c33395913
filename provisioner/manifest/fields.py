"""The manifest's building blocks: the strict base model and the field types, patterns and
names the sections share (host patterns, paths, MACs, roles, OS and network names, SSH keys)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from provisioner.manifest.ranges import RangeError, expand, normalize_mac
from provisioner.platforms import OsName, Role

__all__ = ["OsName", "Role"]  # said in provisioner.platforms; the manifest's modules import them from here

HOST_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An address as Alertmanager's `to:` takes it: a dot-atom before the @ without the braces
# that would make the address a Go template, and no commas, quotes or spaces that would make
# it a list or a display name (net/mail.ParseAddressList).
EMAIL_RE = re.compile(
    r"^[A-Za-z0-9!#$%&'*+/=?^_`|~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`|~-]+)*@[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"
)
SSH_KEY_RE = re.compile(
    r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com) "
    r"[A-Za-z0-9+/=]+( .*)?$"
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=False)


def _hostname_pattern(value: str) -> str:
    try:
        names = expand(value)
    except RangeError as exc:
        raise ValueError(str(exc)) from None
    for name in names:
        if not HOST_RE.match(name):
            raise ValueError(
                f"{name!r} is not a valid host name (lower-case letters, digits and '-', "
                "at most 63 characters)"
            )
    return value


def _abs_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} must be an absolute path")
    if any(c.isspace() or not c.isprintable() for c in value):  # fstab, exports: one token
        raise ValueError(f"{value!r}: a path must not contain spaces or control characters")
    if "//" in value or "/../" in value or value.endswith("/..") or (value != "/" and value.endswith("/")):
        raise ValueError(f"{value!r} is not a normalised absolute path")
    return value


def _mac(value: str) -> str:
    return normalize_mac(value)


def _onoff(value: Any) -> Any:
    """YAML 1.1 turns ``off``/``on`` into booleans; ZFS/NFS properties want the words."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


HostPattern = Annotated[str, AfterValidator(_hostname_pattern)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
Mac = Annotated[str, AfterValidator(_mac)]
PropertyValue = Annotated[str | int, BeforeValidator(_onoff)]
NetworkName = Literal["management", "bmc", "data", "infiniband", "roce"]
# every network kind, in the order the manifest and the checks list them
NETWORK_NAMES: tuple[NetworkName, ...] = ("management", "bmc", "data", "infiniband", "roce")
# the fabrics RDMA runs on: InfiniBand, and RDMA over Converged Ethernet (RoCE v2)
RDMA_NETWORKS: tuple[NetworkName, ...] = ("infiniband", "roce")


def ssh_public_key(key: str) -> str:
    if not SSH_KEY_RE.match(key):
        shown = key[:30] + ("..." if len(key) > 30 else "")
        raise ValueError(f"{shown!r} is not an OpenSSH public key (ssh-ed25519 AAAA... comment)")
    return key


def ssh_public_keys(v: list[str]) -> list[str]:
    for key in v:
        ssh_public_key(key)
    return v


SshPublicKey = Annotated[str, AfterValidator(ssh_public_key)]


def _email_address(value: str) -> str:
    if not EMAIL_RE.match(value):
        raise ValueError(f"{value!r} is not an e-mail address")
    return value


EmailAddress = Annotated[str, AfterValidator(_email_address)]


def secret_ref(owner: str, field: str, env: str | None, file: str | None) -> None:
    """At most one of ``<field>_env`` / ``<field>_file``; a name and an absolute path."""
    if env is not None and file is not None:
        raise ValueError(f"{owner}: give only one of {field}_env or {field}_file")
    if env is not None and not ENV_RE.match(env):
        raise ValueError(f"{field}_env {env!r} is not an environment variable name")
    if file is not None and not file.startswith("/"):
        raise ValueError(f"{field}_file {file!r} must be an absolute path")


def no_inline(data: Any, keys: tuple[str, ...], what: str) -> Any:
    """Refuse a secret written inline: the manifest names where it is, never what it is."""
    if isinstance(data, dict):
        for key in keys:
            if key in data:
                raise ValueError(f"inline {what} ({key}) is not allowed; use {key}_env (an environment "
                                 f"variable name) or {key}_file")
    return data
