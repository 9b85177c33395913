"""The ``slurm:`` section: partitions, accounts and QOS, containers in jobs."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from provisioner.manifest.fields import AbsPath, Strict, no_inline, secret_ref
from provisioner.manifest.people import PersonName

SLURM_TIME_RE = re.compile(r"^(INFINITE|UNLIMITED|\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?)$")


class Partition(Strict):
    name: str
    nodes: list[str] = Field(min_length=1)
    default: bool = False
    max_time: str = "INFINITE"
    default_time: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_-]{1,40}$", v):
            raise ValueError(f"{v!r} is not a valid partition name")
        return v

    @field_validator("max_time", "default_time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_TIME_RE.match(str(v)):
            raise ValueError(f"{v!r} is not a Slurm time (minutes, HH:MM:SS, D-HH:MM:SS or INFINITE)")
        return v


SLURM_ENTITY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")  # sacctmgr folds names to lower case


def _slurm_entity(v: str) -> str:
    if not SLURM_ENTITY_RE.match(v):
        raise ValueError(f"{v!r} is not a Slurm account or QOS name (lower-case letters, digits, '_', '-')")
    return v


SlurmEntity = Annotated[str, AfterValidator(_slurm_entity)]


def _slurm_time(v: str | None) -> str | None:
    if v is not None and not SLURM_TIME_RE.match(str(v)):
        raise ValueError(f"{v!r} is not a Slurm time (minutes, HH:MM:SS, D-HH:MM:SS or INFINITE)")
    return v


class SlurmQos(Strict):
    name: SlurmEntity
    priority: int = Field(default=0, ge=0, le=1_000_000)
    max_gpus_per_user: int | None = Field(default=None, ge=0, description="MaxTRESPerUser gres/gpu")
    max_cpus_per_user: int | None = Field(default=None, ge=0, description="MaxTRESPerUser cpu")
    max_jobs_per_user: int | None = Field(default=None, ge=0, description="MaxJobsPerUser (running)")
    max_wall: Annotated[str | None, AfterValidator(_slurm_time)] = Field(default=None, description="MaxWall")
    preempt: list[SlurmEntity] = Field(default_factory=list, description="QOS this one may preempt")


class SlurmAccount(Strict):
    name: SlurmEntity
    parent: SlurmEntity = Field(default="root", description="another account of slurm.accounts, or root")
    fairshare: int = Field(default=1, ge=1, le=1_000_000, description="shares among its siblings")
    description: str = Field(default="", pattern=r"^[^'\"\n]*$")
    qos: list[SlurmEntity] = Field(default_factory=list, description="QOS its users may ask for; empty: normal")
    default_qos: SlurmEntity | None = None


URL_BASE_RE = re.compile(r"^(https?|file)://[^\s]+$")
# A registry as an image reference names it (enroot: REGISTRY#IMAGE): a host name, a port.
REGISTRY_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
                              r"(:[0-9]{1,5})?$")
# A netrc token (enroot's .credentials): no blank, and no opening quote (curl reads "..." as a
# quoted token).
NETRC_TOKEN_RE = re.compile(r'^[^\s"][^\s]*$')


class RegistryLogin(Strict):
    """A cluster-wide login to a container registry, for every job's image pulls
    (provisioner/areas/slurm/containers.py: the credentials file enroot reads)."""

    host: str = Field(description="the registry as image references name it: host or host:port "
                      "(nvcr.io, registry.example.org:5000)")
    login: str = Field(description="the user name ($oauthtoken for NGC)")
    password_env: str | None = Field(default=None, description="environment variable holding the password "
                                     "or token (admin host)")
    password_file: str | None = Field(default=None, description="file holding it (admin host, not readable "
                                      "by others)")

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, data: Any) -> Any:
        return no_inline(data, ("password",), "registry passwords")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not REGISTRY_HOST_RE.match(v):
            raise ValueError(f"{v!r} is not a registry host or host:port (no scheme, no path)")
        return v

    @field_validator("login")
    @classmethod
    def _login(cls, v: str) -> str:
        if not NETRC_TOKEN_RE.match(v):
            raise ValueError(f"{v!r} is not a login enroot can read: one word, not starting with a quote")
        return v

    @model_validator(mode="after")
    def _secret(self) -> RegistryLogin:
        if (self.password_env is None) == (self.password_file is None):
            raise ValueError("give exactly one of password_env or password_file")
        secret_ref("registry", "password", self.password_env, self.password_file)
        return self


class SlurmContainers(Strict):
    """Containers in Slurm jobs: enroot + pyxis on the compute and login nodes
    (provisioner/areas/slurm/containers.py; docs/containers.md)."""

    enabled: bool = False
    source_mirror: str | None = Field(
        default=None, description="http(s):// or file:// folder holding the pinned enroot and pyxis source "
        "tarballs under their upstream file names; unset: download them from GitHub")
    registry_logins: list[RegistryLogin] = Field(
        default_factory=list, description="cluster-wide registry logins every job's image pulls use "
        "(docs/containers.md: every job user can read them)")
    registry_group: PersonName | None = Field(
        default=None, description="the group (one of groups:) that may read the registry logins on the nodes; "
        "unset: everyone on the node")

    @field_validator("source_mirror")
    @classmethod
    def _mirror(cls, v: str | None) -> str | None:
        if v is not None and not URL_BASE_RE.match(v):
            raise ValueError(f"{v!r} is not an http(s):// or file:// URL")
        return v


SLURM_BUILD_VERSION_RE = r"^\d{2}\.\d{2}\.\d+$"


class Slurm(Strict):
    enabled: bool = True
    source: Literal["os", "build"] = Field(
        default="os", description="os: each node's OS Slurm (slurm-wlm); build: one pinned Slurm built into "
        ".deb packages per OS release and served from the head (provisioner/areas/slurm/build.py)")
    version: str | None = Field(
        default=None, pattern=SLURM_BUILD_VERSION_RE,
        description="with source: build, the Slurm release to build (a version the area pins, e.g. 25.05.1); "
                    "unset: the area's default")
    mirror: str | None = Field(
        default=None, description="with source: build, an http(s):// or file:// folder holding the pinned "
        "source files under their upstream names; unset: the upstream download URL")
    cluster_name: str | None = None
    accounting: bool = False
    accounts: list[SlurmAccount] = Field(
        default_factory=list, description="the account tree in slurmdbd (needs accounting); empty: not managed")
    qos: list[SlurmQos] = Field(default_factory=list, description="QOS in slurmdbd besides normal")
    partitions: list[Partition] = Field(default_factory=list)
    constrain_cores: bool = True
    constrain_memory: bool = True
    constrain_devices: bool = True
    job_tmp: AbsPath | None = Field(
        default=None,
        description="each job's private /tmp and /dev/shm (job_container/tmpfs BasePath) under this path on "
                    "every slurmd node, and TmpFS (the file system whose size slurmd reports as TmpDisk); a "
                    "folder on the compute nodes' scratch, e.g. /scratch/slurm; unset: jobs share /tmp")
    containers: SlurmContainers = Field(default_factory=SlurmContainers)
    ssh_only_with_job: bool | None = Field(
        default=None,
        description="SSH to a compute node only for users with a running job there, into that job's cgroup "
                    "(pam_slurm_adopt); admins, root and cluster.ssh.user always get in; unset: on when users: "
                    "lists anyone")

    @field_validator("mirror")
    @classmethod
    def _slurm_mirror(cls, v: str | None) -> str | None:
        if v is not None and not URL_BASE_RE.match(v):
            raise ValueError(f"{v!r} is not an http(s):// or file:// URL")
        return v
