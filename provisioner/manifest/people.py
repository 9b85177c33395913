"""The people who use the cluster: ``groups:``, ``users:`` and ``homes:``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from provisioner.manifest.fields import USER_RE, AbsPath, EmailAddress, SshPublicKey, Strict

FIRST_ID = 1000  # ids below are the OS's system accounts
LAST_ID = 60000  # Debian's and Ubuntu's UID_MAX/GID_MAX: above are nobody and the dynamic ranges


def _person_id(v: int | None) -> int | None:
    if v is not None and not FIRST_ID <= v <= LAST_ID:
        raise ValueError(f"{v} is outside {FIRST_ID}..{LAST_ID} (below {FIRST_ID} are the OS's system accounts)")
    return v


PersonId = Annotated[int, AfterValidator(_person_id)]


def _person_name(v: str) -> str:
    if not USER_RE.match(v):
        raise ValueError(f"{v!r} is not a valid user or group name (lower-case letters, digits, '_', '-')")
    return v


PersonName = Annotated[str, AfterValidator(_person_name)]


class Group(Strict):
    name: PersonName
    gid: PersonId


class User(Strict):
    name: PersonName
    uid: PersonId
    group: PersonName | None = Field(
        default=None, description="primary group, one of groups:; default: the user's own group, gid = uid")
    groups: list[PersonName] = Field(default_factory=list, description="extra groups, each one of groups:")
    ssh_keys: list[SshPublicKey] = Field(default_factory=list)
    shell: AbsPath = "/bin/bash"
    comment: str = Field(default="", description="full name (GECOS)")
    state: Literal["present", "locked"] = Field(
        default="present", description="locked: no login, files kept (also what a user removed from users: gets)")
    account: str | None = Field(default=None, description="default Slurm account, one of slurm.accounts")
    accounts: list[str] = Field(default_factory=list, description="other Slurm accounts the user may charge")
    email: EmailAddress | None = Field(
        default=None, description="where monitoring.gpu_job_idle.notify_users mails the user about their idle jobs")

    @field_validator("comment")
    @classmethod
    def _comment(cls, v: str) -> str:
        if any(c in ":,\n" or not c.isprintable() for c in v):
            raise ValueError(f"{v!r}: a comment holds no ':', ',' or control characters (passwd's separators)")
        return v


class Homes(Strict):
    path: AbsPath = Field(default="/home", description="where homes are on every node: <path>/<user>")
    export: str | None = Field(
        default=None, description="an nfs.exports entry: homes are made on its server; absent: local homes")
    mode: str = Field(default="0700", pattern=r"^0?[0-7]{3}$", description="a new home's mode")
