"""The people who use the cluster: ``groups:``, ``users:`` and ``homes:``."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from provisioner.manifest.fields import USER_RE, AbsPath, EmailAddress, SshPublicKey, Strict, no_inline, secret_ref

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
    uid: PersonId | None = Field(
        default=None, description="required with local identity; with identity sssd absent: a directory person, "
        "not made on the nodes (named for Slurm and e-mail only)")
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


# sssd's own id bounds (uint32, less the -1 that means "no id")
LAST_DIRECTORY_ID = 4294967294
LDAP_URI_RE = re.compile(r"^ldaps?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$")
# attr=value[,attr=value...]: one line, nothing sssd.conf would read as syntax
DN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*=[^=,\n\r#;]+(,\s*[A-Za-z][A-Za-z0-9-]*=[^=,\n\r#;]+)*$")


def _ldap_uri(v: str) -> str:
    if not LDAP_URI_RE.match(v):
        raise ValueError(f"{v!r} is not ldaps://host[:port] or ldap://host[:port] (StartTLS)")
    return v.rstrip("/")


def _dn(v: str) -> str:
    if not DN_RE.match(v):
        raise ValueError(f"{v!r} is not a distinguished name (attr=value,attr=value, e.g. dc=example,dc=org)")
    return v


LdapUri = Annotated[str, AfterValidator(_ldap_uri)]
Dn = Annotated[str, AfterValidator(_dn)]


class IdRange(Strict):
    first: int = Field(ge=FIRST_ID, le=LAST_DIRECTORY_ID, description="lowest uid/gid the directory hands out")
    last: int = Field(ge=FIRST_ID, le=LAST_DIRECTORY_ID, description="highest uid/gid the directory hands out")

    @model_validator(mode="after")
    def _ordered(self) -> IdRange:
        if self.first > self.last:
            raise ValueError(f"first {self.first} is above last {self.last}")
        return self


class Sssd(Strict):
    uris: list[LdapUri] = Field(
        min_length=1, description="directory servers in order of preference: all ldaps://, or all ldap:// (StartTLS)")
    search_base: Dn = Field(description="base DN of the directory (e.g. dc=example,dc=org)")
    user_search_base: Dn | None = Field(default=None, description="where users are (default: search_base)")
    group_search_base: Dn | None = Field(default=None, description="where groups are (default: search_base)")
    ca_file: AbsPath = Field(description="PEM CA certificate(s) on the admin host that signed the servers' "
                             "certificates; copied to every node (certificates are always verified)")
    bind_dn: Dn | None = Field(default=None, description="DN sssd binds as; absent: anonymous reads")
    bind_password_env: str | None = Field(default=None, description="environment variable holding bind_dn's password")
    bind_password_file: str | None = Field(default=None, description="file holding it (admin host, not world-readable)")
    id_range: IdRange = Field(description="the directory's uid/gid range: sssd ignores entries outside it, and "
                              "local users and groups must lie outside it")
    access_filter: str | None = Field(
        default=None, pattern=r"^\([^\n\r]*\)$",
        description="LDAP filter of who may log in (e.g. (memberOf=cn=hpc,ou=groups,dc=example,dc=org)); "
        "absent: every directory user with an id in id_range")
    ldap_schema: Literal["rfc2307", "rfc2307bis"] = Field(
        default="rfc2307", description="rfc2307: memberUid holds names (OpenLDAP's nis schema); rfc2307bis: member DNs")
    probe: PersonName | None = Field(
        default=None, description="a user or group the directory always holds (a service account, the cluster's "
        "group): verify looks it up through sssd on every node (default: the first directory person in users:)")

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, data: Any) -> Any:
        return no_inline(data, ("bind_password",), "LDAP bind passwords")

    @model_validator(mode="after")
    def _consistent(self) -> Sssd:
        schemes = {uri.split("://", 1)[0] for uri in self.uris}
        if len(schemes) > 1:
            raise ValueError("uris mix ldaps:// and ldap://: use one (ldap:// always runs StartTLS)")
        secret_ref("sssd", "bind_password", self.bind_password_env, self.bind_password_file)
        has_password = self.bind_password_env is not None or self.bind_password_file is not None
        if self.bind_dn is not None and not has_password:
            raise ValueError("bind_dn needs bind_password_env or bind_password_file")
        if has_password and self.bind_dn is None:
            raise ValueError("a bind password needs bind_dn")
        return self

    @property
    def start_tls(self) -> bool:
        return self.uris[0].startswith("ldap://")


class Identity(Strict):
    provider: Literal["local", "sssd"] = Field(
        default="local", description="local: users: are made on every node; sssd: nodes also join the directory")
    sssd: Sssd | None = Field(default=None, description="the directory, with provider sssd")

    @model_validator(mode="after")
    def _provider(self) -> Identity:
        if self.provider == "sssd" and self.sssd is None:
            raise ValueError("provider sssd needs an sssd: section (uris, search_base, ca_file, id_range)")
        if self.provider == "local" and self.sssd is not None:
            raise ValueError("an sssd: section needs provider: sssd")
        return self
