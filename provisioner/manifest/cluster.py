"""The ``cluster:`` section: the cluster's name and domain, admins, mirrors, SSH, and how
nodes get their OS (install media, install method, node images)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from provisioner.manifest.fields import HOST_RE, SSH_KEY_RE, USER_RE, AbsPath, OsName, Strict, ssh_public_keys
from provisioner.platforms import UbuntuName


class AdminUser(Strict):
    name: str = Field(description="login name")
    ssh_keys: list[str] = Field(min_length=1)
    sudo: bool = True
    shell: AbsPath = "/bin/bash"
    uid: int | None = Field(default=None, ge=1000, le=60000)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not USER_RE.match(v):
            raise ValueError(f"{v!r} is not a valid user name")
        if v == "root":
            raise ValueError("'root' is not an admin user; list named operators")
        return v

    @field_validator("ssh_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        return ssh_public_keys(v)



class Mirrors(Strict):
    apt: str | None = Field(default=None, description="APT mirror base URL for air-gapped sites")
    apt_proxy: str | None = None
    pip: str | None = Field(default=None, description="PyPI simple index URL")

    @field_validator("apt", "apt_proxy", "pip")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(https?|file)://[^\s]+$", v):
            raise ValueError(f"{v!r} is not an http(s):// or file:// URL")
        return v


SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def normalized_sha256(v: Any) -> Any:
    """A SHA-256 given as text, lower-cased and without a ``sha256:`` prefix; other values
    pass through to pydantic's own type check."""
    if isinstance(v, str):
        v = v.strip().lower().removeprefix("sha256:")
        if not SHA256_RE.match(v):
            raise ValueError(f"{v[:20]!r}... is not a SHA-256 (64 hex digits)")
    return v


class InstallMedia(Strict):
    """A pinned Ubuntu live-server ISO: a URL with its SHA-256 (e.g. a site mirror), or a
    file already on the head node."""

    url: str | None = Field(default=None, description="http(s):// or file:// URL of the ISO")
    path: AbsPath | None = Field(default=None, description="the ISO on the head node")
    sha256: str | None = Field(default=None, description="SHA-256 of the ISO (hex); required with url")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(https?|file)://[^\s]+$", v):
            raise ValueError(f"{v!r} is not an http(s):// or file:// URL")
        return v

    @field_validator("sha256", mode="before")
    @classmethod
    def _sha256(cls, v: Any) -> Any:
        return normalized_sha256(v)

    @model_validator(mode="after")
    def _one_source(self) -> InstallMedia:
        if (self.url is None) == (self.path is None):
            raise ValueError("give exactly one of url or path")
        if self.url is not None and self.sha256 is None:
            raise ValueError("a pinned ISO url needs its sha256 (from the release's SHA256SUMS)")
        return self


# Root file system tarballs a node image may be, by compression (the name carries it all the
# way to the node: the cache, the PXE server's URL, the deploy agent's tar). Built images are
# zstd: it decompresses with a fifth of gzip's CPU in the deploy's longest step (where the
# node also writes the files) and compresses ten times faster on the build host.
IMAGE_EXTS = (".tar.gz", ".tar.xz", ".tar.zst")
BUILT_IMAGE_EXT = ".tar.zst"


class NodeImage(Strict):
    """A node OS image named in the manifest instead of one built by ``provision image build``:
    a root file system tarball (.tar.gz, .tar.xz or .tar.zst, e.g. an Ubuntu cloud image's
    ``*-root.tar.xz``), verified against its SHA-256 before it is written to any disk."""

    url: str = Field(description="http(s):// or file:// URL of the root file system tarball")
    sha256: str = Field(description="SHA-256 of the tarball (hex)")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^(https?|file)://[^\s]+\.tar\.(gz|xz|zst)$", v):
            raise ValueError(f"{v!r} is not an http(s):// or file:// URL of a .tar.gz, .tar.xz or .tar.zst")
        return v

    @field_validator("sha256", mode="before")
    @classmethod
    def _sha256(cls, v: Any) -> Any:
        return normalized_sha256(v)

    @property
    def ext(self) -> str:
        """Its compression, as the extension the validated URL ends in."""
        return next(e for e in IMAGE_EXTS if self.url.endswith(e))


InstallMethod = Literal["image", "installer"]


class SshSettings(Strict):
    user: str = "root"
    port: int = Field(default=22, ge=1, le=65535)
    private_key: str | None = Field(default=None, description="private key file for Ansible's SSH")
    public_key: str | None = Field(
        default=None,
        description="OpenSSH public key Ansible logs in with (a dedicated automation key); root, or the "
                    "account in user, gets it besides the keys of admins with sudo",
    )

    @field_validator("public_key")
    @classmethod
    def _public_key(cls, v: str | None) -> str | None:
        if v is not None and not SSH_KEY_RE.match(v):
            shown = v[:30] + ("..." if len(v) > 30 else "")
            raise ValueError(f"{shown!r} is not an OpenSSH public key (ssh-ed25519 AAAA... comment)")
        return v


class Cluster(Strict):
    name: str
    domain: str = "cluster.local"
    timezone: str = "Etc/UTC"
    ntp_servers: list[str] = Field(default_factory=list, description="empty: nodes follow the head node")
    admin_users: list[AdminUser] = Field(default_factory=list)
    mirrors: Mirrors = Field(default_factory=Mirrors)
    ssh: SshSettings = Field(default_factory=SshSettings)
    allow_reboot: bool = False
    install_media: dict[UbuntuName, InstallMedia] = Field(
        default_factory=dict,
        description="pinned live-server ISO per Ubuntu release; default: the release's current point "
                    "release from releases.ubuntu.com, checked against its SHA256SUMS",
    )
    install_method: InstallMethod = Field(
        default="image",
        description="how PXE installs put the OS on a node: image (a deploy ramdisk writes the node OS "
                    "image) or installer (Ubuntu autoinstall / Debian preseed); a node may override it",
    )
    images: dict[OsName, NodeImage] = Field(
        default_factory=dict,
        description="per OS, a named root file system image {url, sha256} instead of the one "
                    "`provision image build` builds",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[a-z][a-z0-9-]{0,30}$", v):
            raise ValueError(f"{v!r}: use lower-case letters, digits and '-', starting with a letter")
        return v

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        labels = v.split(".")
        if not all(HOST_RE.match(label) for label in labels):
            raise ValueError(f"{v!r} is not a valid DNS domain")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_]+(/[A-Za-z0-9_+-]+)*$", v):
            raise ValueError(f"{v!r} is not a timezone name like Europe/Berlin or Etc/UTC")
        return v
