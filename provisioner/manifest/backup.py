"""The ``backup:`` section: where `provision backup` and the head's timer put the head node's
state (docs/backup.md), how often, how many are kept, and where the passphrase is."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from provisioner.manifest.fields import USER_RE, AbsPath, Strict, no_inline, secret_ref


class BackupSsh(Strict):
    """A destination reached over SSH from the head node (as root, with the head's own key)."""

    host: str = Field(description="host name or address")
    user: str = "root"
    port: int = Field(default=22, ge=1, le=65535)
    path: AbsPath

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not USER_RE.match(v):
            raise ValueError(f"{v!r} is not a valid user name")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,252})$", v):
            raise ValueError(f"{v!r} is not a host name or address")
        return v


class BackupDataset(Strict):
    """A ZFS dataset of a storage node (zfs.pools), written at its mountpoint over SSH."""

    node: str
    name: str = Field(description="pool/dataset, e.g. tank/backup")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*(/[A-Za-z0-9][A-Za-z0-9_.:-]*)+$", v):
            raise ValueError(f"{v!r} is not pool/dataset (e.g. tank/backup)")
        return v


class BackupDestination(Strict):
    """Exactly one of: a directory on the head, a ZFS dataset of a storage node (its mountpoint,
    reached over SSH), or an SSH target."""

    path: AbsPath | None = Field(default=None, description="a directory on the head node")
    dataset: BackupDataset | None = None
    ssh: BackupSsh | None = None

    @model_validator(mode="after")
    def _one(self) -> BackupDestination:
        given = [k for k in ("path", "dataset", "ssh") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of path, dataset or ssh")
        return self


class Backup(Strict):
    """Backups of the head node (`provision backup`, and a timer on the head): slurmdbd's
    database, slurmctld's state, the munge key (encrypted), Prometheus' TSDB snapshot, Grafana's
    database (encrypted)."""

    destination: BackupDestination
    schedule: Literal["hourly", "daily", "weekly", "off"] = Field(
        default="daily", description="the head's timer; off: only `provision backup`")
    at: str = Field(default="02:30", description="HH:MM (UTC) of a daily or weekly backup")
    keep: int = Field(default=14, ge=1, le=1000, description="backups of ours kept at the destination")
    key_env: str | None = Field(default=None, description="environment variable holding the operator's "
                                "passphrase that encrypts the secrets")
    key_file: str | None = Field(default=None, description="file holding that passphrase (admin host)")
    prometheus: bool = Field(default=False, description="a TSDB snapshot of Prometheus on the head (switches on "
                             "its admin API, --web.enable-admin-api)")
    grafana: bool | None = Field(default=None, description="Grafana's database on the head (users, dashboards "
                                 "and folders made in its web page); default: on where Grafana runs on the head")
    timeout_s: int = Field(default=3600, ge=60, le=86400, description="bound on one backup or restore")

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, data: Any) -> Any:
        return no_inline(data, ("key",), "backup key")

    @model_validator(mode="after")
    def _key(self) -> Backup:
        if self.key_env is None and self.key_file is None:
            raise ValueError("give key_env or key_file: the passphrase that encrypts the secrets, held by the "
                             "operator (never in the manifest)")
        secret_ref("backup", "key", self.key_env, self.key_file)
        if not re.match(r"^([01]\d|2[0-3]):[0-5]\d$", self.at):
            raise ValueError(f"at {self.at!r} is not HH:MM")
        return self
