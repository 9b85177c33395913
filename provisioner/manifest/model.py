"""The manifest schema (version 1): the single source of truth for a cluster.

Field-level rules live here (types, ranges, formats). Rules that need the whole manifest
(unique addresses, references between sections) live in :mod:`provisioner.manifest.checks`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from provisioner.manifest.ranges import RangeError, expand, normalize_mac

SCHEMA_VERSION = 1

HOST_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SLURM_TIME_RE = re.compile(r"^(INFINITE|UNLIMITED|\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?)$")
SIZE_RE = re.compile(r"^\d+(\.\d+)?[KMGT]?$")
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
Role = Literal["head", "compute", "storage", "services", "login"]
OsName = Literal["ubuntu-22.04", "ubuntu-24.04", "debian-12"]
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


# --------------------------------------------------------------------------- cluster
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


# --------------------------------------------------------------------------- people
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
# way to the node: the cache, the PXE server's URL, the deploy agent's tar); built images are
# the first.
IMAGE_EXTS = (".tar.gz", ".tar.xz", ".tar.zst")
BUILT_IMAGE_EXT = IMAGE_EXTS[0]


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
    install_media: dict[Literal["ubuntu-22.04", "ubuntu-24.04"], InstallMedia] = Field(
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


# --------------------------------------------------------------------------- networks
class Network(Strict):
    cidr: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address | None = None
    dns: list[ipaddress.IPv4Address] = Field(default_factory=list)
    mtu: int = Field(default=1500, ge=576, le=65520)

    @field_validator("cidr", mode="before")
    @classmethod
    def _cidr(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return ipaddress.IPv4Network(v, strict=True)
            except ValueError as exc:
                raise ValueError(f"{v!r} is not an IPv4 network like 10.0.0.0/24 ({exc})") from None
        return v

    @model_validator(mode="after")
    def _gateway_inside(self) -> Network:
        if self.gateway is not None and self.gateway not in self.cidr:
            raise ValueError(f"gateway {self.gateway} is outside {self.cidr}")
        return self


IPOIB_DATAGRAM_MAX_MTU = 4092  # a 4096-byte InfiniBand MTU less the 4-byte IPoIB header


class InfinibandNetwork(Network):
    mtu: int = Field(default=2044, ge=576, le=65520)
    mode: Literal["datagram", "connected"] = "datagram"
    hca_supports_connected: bool = Field(
        default=False,
        description="the HCAs run IPoIB connected mode (ConnectX-3 and older; ConnectX-4 and newer run "
                    "Enhanced IPoIB, which is datagram only)",
    )
    subnet_manager: Literal["switch", "opensm"] = Field(
        default="switch", description="'opensm' runs a subnet manager on the head node"
    )
    rdma: bool = Field(default=True, description="NFS over RDMA and GPUDirect on this fabric")

    @model_validator(mode="before")
    @classmethod
    def _no_roce_keys(cls, data: Any) -> Any:
        return _refuse_keys(data, _ROCE_ONLY, "infiniband")

    @model_validator(mode="after")
    def _ipoib_mode(self) -> InfinibandNetwork:
        if self.mode == "connected" and not self.hca_supports_connected:
            raise ValueError(
                "IPoIB connected mode fails on ConnectX-4 and newer HCAs (Enhanced IPoIB is datagram only), "
                f"and so does an MTU above {IPOIB_DATAGRAM_MAX_MTU}; use mode: datagram, or set "
                "hca_supports_connected: true if every HCA on the fabric is a ConnectX-3 or older"
            )
        if self.mode == "datagram" and self.mtu > IPOIB_DATAGRAM_MAX_MTU:
            raise ValueError(
                f"IPoIB datagram mode carries at most {IPOIB_DATAGRAM_MAX_MTU} bytes (a 4096-byte InfiniBand "
                f"MTU less the IPoIB header); mtu {self.mtu} needs connected mode, which only ConnectX-3 and "
                "older HCAs run; Ethernet NICs running RDMA (RoCE) at MTU 9000 go under networks.roce"
            )
        return self


# keys of one fabric kind put on the other, and what to say instead of "extra field"
_IB_ONLY = {
    "mode": "IPoIB mode is InfiniBand's; RoCE NICs are Ethernet and carry IP as they are",
    "hca_supports_connected": "IPoIB connected mode is InfiniBand's; RoCE NICs are Ethernet",
    "subnet_manager": "a subnet manager runs on InfiniBand only; RoCE is Ethernet (the switches learn "
                      "addresses; PFC/ECN are set in the switch, not here)",
    "pkey": "partition keys are InfiniBand's; separate RoCE traffic with VLANs in the switch",
}
_ROCE_ONLY = {
    "gid_index": "the GID index is RoCE's (InfiniBand addresses by LID); put Ethernet RDMA NICs under "
                 "networks.roce",
    "traffic_class": "the traffic class is RoCE's (its PFC/ECN priority); put Ethernet RDMA NICs under "
                     "networks.roce",
}


def _refuse_keys(data: Any, refused: dict[str, str], kind: str) -> Any:
    if isinstance(data, dict):
        wrong = [k for k in refused if k in data]
        if wrong:
            raise ValueError("; ".join(f"{k} on a {kind} network: {refused[k]}" for k in wrong))
    return data


class RoceNetwork(Network):
    """RDMA over Converged Ethernet v2: Ethernet NICs (ConnectX, BlueField, soft-RoCE) with
    IP addresses, RDMA in UDP; no IPoIB and no subnet manager. Lossless transport (PFC, ECN)
    is the switches' configuration, not the manifest's."""

    mtu: int = Field(default=1500, ge=576, le=9000, description="Ethernet MTU, at most 9000")
    rdma: bool = Field(default=True, description="NFS over RDMA and GPUDirect on this fabric")
    gid_index: int = Field(
        default=3, ge=0, le=255,
        description="the GID table entry that is RoCE v2 over the NIC's IPv4 address (NCCL_IB_GID_INDEX, "
                    "ib_write_bw -x): 3 on ConnectX with an IPv4 address, 1 on soft-RoCE (rxe); "
                    "show_gids lists them")
    traffic_class: int | None = Field(
        default=None, ge=0, le=255,
        description="NCCL_IB_TC: the IP traffic class (DSCP x 4) of RDMA traffic, the one the switches' "
                    "PFC/ECN treat as lossless (106 for DSCP 26); unset: the NIC's default")

    @model_validator(mode="before")
    @classmethod
    def _no_infiniband_keys(cls, data: Any) -> Any:
        return _refuse_keys(data, _IB_ONLY, "roce")


class Networks(Strict):
    management: Network
    bmc: Network | None = None
    data: Network | None = None
    infiniband: InfinibandNetwork | None = None
    roce: RoceNetwork | None = None

    def named(self, name: NetworkName) -> Network | None:
        net: Network | None = getattr(self, name)
        return net

    def defined(self) -> list[tuple[NetworkName, Network]]:
        """The networks the manifest declares, in NETWORK_NAMES order."""
        return [(k, n) for k in NETWORK_NAMES if (n := self.named(k)) is not None]

    def rdma(self) -> list[NetworkName]:
        """The fabrics with rdma: true, InfiniBand first, then RoCE."""
        return [k for k in RDMA_NETWORKS if getattr(self.named(k), "rdma", False)]


# --------------------------------------------------------------------------- nodes
class Nic(Strict):
    """One NIC on a network: its address, MAC, name, RDMA device."""

    ip: ipaddress.IPv4Address
    mac: Mac | None = None
    interface: str | None = Field(default=None, description="NIC name, e.g. eno1, ib0")
    rdma_device: str | None = Field(
        default=None, description="on infiniband and roce: the NIC's RDMA device (mlx5_0, rxe0) for "
                                  "NCCL_IB_HCA and ib_write_bw -d; unset: the first device")

    @field_validator("interface")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9_.:-]{1,15}$", v):
            raise ValueError(f"{v!r} is not a network interface name")
        return v

    @field_validator("rdma_device")
    @classmethod
    def _rdma_device(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9_.-]{1,63}$", v):
            raise ValueError(f"{v!r} is not an RDMA device name (mlx5_0, rxe0)")
        return v


# the networks a node may have several NICs on (each its own address)
MULTI_NIC_NETWORKS: tuple[NetworkName, ...] = ("data", "roce")


class Interface(Nic):
    """A node's NIC on a network, and on data and roce the node's further NICs there
    (``more``; the manifest may instead give the network a list of NICs, the first is this)."""

    more: list[Nic] = Field(default_factory=list, description="further NICs on this network (data, roce), "
                            "each with its own address")

    def nics(self) -> list[Nic]:
        """This NIC and the further ones, in the manifest's order."""
        return [self, *self.more]


def _nic_lists(v: Any) -> Any:
    """``interfaces: {roce: [nic, nic]}``: the first NIC, the others as its ``more``."""
    if not isinstance(v, dict):
        return v
    out = {}
    for net, value in v.items():
        if isinstance(value, list) and value and isinstance(value[0], dict) and "more" not in value[0]:
            value = {**value[0], "more": value[1:]}
        out[net] = value
    return out


IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


def is_mac(value: str) -> bool:
    """A MAC address in any case, with ':' or '-' (a NIC name never has five separators
    between hex pairs)."""
    try:
        normalize_mac(value)
    except ValueError:
        return False
    return True


def _bond_member(value: str) -> str:
    """A bond member: a NIC name (ens1f0) or its MAC address (normalised)."""
    if is_mac(value):
        return normalize_mac(value)
    if not IFNAME_RE.match(value):
        raise ValueError(f"{value!r} is neither a network interface name nor a MAC address")
    return value


BondMember = Annotated[str, AfterValidator(_bond_member)]


class Bond(Strict):
    """Several NICs as one link (Linux bonding): ``802.3ad`` (LACP; the switch ports form a
    LAG) or ``active-backup`` (no switch configuration; one member carries the traffic).
    A network's interface uses it by its name (``interface: bond0``)."""

    mode: Literal["802.3ad", "active-backup"] = "802.3ad"
    members: list[BondMember] = Field(min_length=2, description="NIC names (ens1f0) or MAC addresses")
    mtu: int | None = Field(default=None, ge=576, le=9216, description="default: the network's MTU")

    @field_validator("members")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a member is listed twice")
        return v


class Bmc(Strict):
    type: Literal["redfish", "ipmi"]
    address: str = Field(description="IPv4 address or DNS name of the BMC")
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str
    password_env: str | None = None
    password_file: str | None = None
    verify_tls: bool = False
    system_id: str | None = Field(default=None, description="Redfish system path; default: the first")
    boot_mode: Literal["uefi", "legacy"] = "uefi"
    secure_boot: bool | None = Field(
        default=None,
        description="whether the UEFI firmware has Secure Boot on; a PXE install needs it off (unsigned iPXE)",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_inline_password(cls, data: Any) -> Any:
        if isinstance(data, dict) and "password" in data:
            raise ValueError(
                "inline BMC passwords are not allowed; use password_env (an environment "
                "variable name) or password_file"
            )
        return data

    @field_validator("address", mode="before")
    @classmethod
    def _address(cls, v: Any) -> Any:
        if not isinstance(v, str):
            return v  # null, a number, a list: the str type check reports it
        try:
            return str(ipaddress.IPv4Address(v))
        except ValueError:
            pass
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$", v):
            raise ValueError(f"{v!r} is neither an IPv4 address nor a host name")
        return v

    @property
    def ipv4(self) -> ipaddress.IPv4Address | None:
        try:
            return ipaddress.IPv4Address(self.address)
        except ValueError:
            return None

    @model_validator(mode="after")
    def _one_secret(self) -> Bmc:
        if (self.password_env is None) == (self.password_file is None):
            raise ValueError("give exactly one of password_env or password_file")
        if self.password_file is not None and not self.password_file.startswith("/"):
            raise ValueError(f"password_file {self.password_file!r} must be an absolute path")
        if self.password_env is not None and not ENV_RE.match(self.password_env):
            raise ValueError(f"password_env {self.password_env!r} is not an environment variable name")
        return self


class Gpu(Strict):
    model: str
    count: int = Field(ge=1, le=16)
    type: str | None = Field(default=None, description="Slurm GRES type; default from the model")
    memory_gb: int | None = Field(default=None, ge=1)
    nvlink: bool = False
    nvswitch: bool = Field(default=False, description="SXM/HGX board: fabric manager needed")

    @property
    def gres_type(self) -> str:
        if self.type:
            return self.type
        slug = re.sub(r"[^a-z0-9]+", "_", self.model.lower()).strip("_")
        for prefix in ("nvidia_", "geforce_"):
            slug = slug.removeprefix(prefix)
        return slug or "gpu"

    @field_validator("type")
    @classmethod
    def _type(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[a-z0-9_]+$", v):
            raise ValueError(f"{v!r}: a GRES type uses lower-case letters, digits and '_'")
        return v


class Cpu(Strict):
    model: str | None = None
    sockets: int = Field(default=1, ge=1, le=16)
    cores_per_socket: int = Field(ge=1, le=512)
    threads_per_core: int = Field(default=1, ge=1, le=8)

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def threads(self) -> int:
        return self.cores * self.threads_per_core


class Disk(Strict):
    id: str = Field(description="name under /dev/disk/by-id")
    size_gb: int | None = Field(default=None, ge=1)
    kind: Literal["nvme", "ssd", "hdd"] = "hdd"
    use: Literal["os", "scratch", "zfs", "none"] = "none"

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if "/" in v or not v:
            raise ValueError(f"{v!r}: give the name under /dev/disk/by-id, without a path")
        return v


class Scratch(Strict):
    """How a node's ``use: scratch`` disks become its local scratch file system: one disk
    as it is, several as RAID 0 (``mdadm``) or a striped logical volume (``lvm``)."""

    path: AbsPath = Field(default="/scratch", description="mount point")
    fs: Literal["xfs", "ext4"] = "xfs"
    raid: Literal["mdadm", "lvm"] = Field(default="mdadm", description="several disks: RAID 0 or a striped LV")
    options: list[str] = Field(default_factory=list, description="mount options added to noatime,nofail")
    force: bool = Field(default=False, description="format disks that hold data (partitions, signatures)")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if v == "/" or v.split("/")[1] in ("boot", "dev", "etc", "proc", "run", "sys", "usr"):
            raise ValueError(f"{v!r} is a system path; mount scratch elsewhere (e.g. /scratch)")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        for opt in v:
            if not opt or any(c.isspace() or c == "," for c in opt):
                raise ValueError(f"{opt!r}: give one mount option per list item, without spaces or commas")
        return v


class Hardware(Strict):
    cpu: Cpu
    memory_gb: int = Field(ge=1, le=65536)
    gpu: Gpu | None = None
    disks: list[Disk] = Field(default_factory=list)

    @property
    def real_memory_mb(self) -> int:
        """Memory Slurm may hand out: the manifest's size less a reserve for the kernel and
        the OS. The kernel keeps a share of RAM that grows with it (struct page alone is 1/64
        of RAM; firmware reservations, crashkernel and page tables add more: a 2 TB node
        reports ~98 % as MemTotal), so the reserve is a share of RAM too: 5 %, at least
        2 GiB (a quarter of a node below 8 GiB). No cap: a capped reserve falls below the
        kernel's share on large nodes, and slurmd would report less than RealMemory."""
        total = self.memory_gb * 1024
        reserve = max(total // 20, min(2048, total // 4))
        return total - reserve


class Node(Strict):
    name: HostPattern
    roles: list[Role] = Field(min_length=1)
    os: OsName = "ubuntu-22.04"
    install: Literal["manual", "pxe"] = Field(
        default="manual",
        description="pxe: while its state is new, apply installs the OS over BMC + PXE (wiping "
        "install_disks); manual: installed by hand, apply only configures it",
    )
    install_method: InstallMethod | None = Field(
        default=None, description="image or installer; default: cluster.install_method")
    install_disks: list[str] = Field(default_factory=list, max_length=2)
    interfaces: Annotated[dict[NetworkName, Interface], BeforeValidator(_nic_lists)]
    bmc: Bmc | None = None
    hardware: Hardware
    bonds: dict[str, Bond] = Field(
        default_factory=dict, description="bonds by name (bond0); an interface on management or data names one "
        "as its interface")
    scratch: Scratch | None = Field(
        default=None, description="settings of the scratch file system on the disks with use: scratch")
    _source_index: int = PrivateAttr(default=-1)

    @property
    def source_index(self) -> int:
        return self._source_index

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: list[Role]) -> list[Role]:
        if len(set(v)) != len(v):
            raise ValueError("a role is listed twice")
        return v

    @field_validator("bonds")
    @classmethod
    def _bond_names(cls, v: dict[str, Bond]) -> dict[str, Bond]:
        for name in v:
            if not IFNAME_RE.match(name):
                raise ValueError(f"{name!r} is not a network interface name (bond0)")
        return v

    @field_validator("interfaces")
    @classmethod
    def _mgmt(cls, v: dict[str, Interface]) -> dict[str, Interface]:
        if "management" not in v:
            raise ValueError("every node needs a 'management' interface")
        return v

    @property
    def ip(self) -> ipaddress.IPv4Address:
        return self.interfaces["management"].ip

    def all_nics(self) -> list[tuple[NetworkName, int, Nic]]:
        """(network, index on it, NIC) of every NIC of the node; index 0 is the network's
        interface, 1... its further NICs."""
        return [(net, i, nic) for net, iface in self.interfaces.items() for i, nic in enumerate(iface.nics())]

    def has_role(self, role: str) -> bool:
        return role in self.roles

    @property
    def gpu_count(self) -> int:
        return self.hardware.gpu.count if self.hardware.gpu else 0


# --------------------------------------------------------------------------- storage
class VdevGroup(Strict):
    type: Literal["mirror", "raidz1", "raidz2", "raidz3", "stripe"] = "mirror"
    width: int = Field(default=2, ge=1, le=32)
    disks: list[str] = Field(min_length=1)


class SnapshotPolicy(Strict):
    """How many snapshots of each frequency a dataset keeps (0: none taken). The frequencies
    are provisioner.areas.storage.snapshots.PERIODS (a unit test keeps the two equal)."""

    hourly: int = Field(default=0, ge=0, le=10000)
    daily: int = Field(default=0, ge=0, le=10000)
    weekly: int = Field(default=0, ge=0, le=10000)
    monthly: int = Field(default=0, ge=0, le=10000)

    def kept(self) -> dict[str, int]:
        """The frequencies kept, with their counts (empty: no snapshots)."""
        return {f: n for f, n in self.model_dump().items() if n > 0}


class Dataset(Strict):
    name: str
    properties: dict[str, PropertyValue] = Field(default_factory=dict)
    snapshots: SnapshotPolicy | None = Field(
        default=None, description="snapshot retention; unset: the pool's snapshots, {}: none")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*(/[A-Za-z0-9][A-Za-z0-9_.:-]*)*$", v):
            raise ValueError(f"{v!r} is not a dataset name relative to the pool (e.g. data/imagenet)")
        return v


def _default_pool_properties() -> dict[str, str | int]:
    return {"compression": "lz4", "atime": "off", "xattr": "sa", "acltype": "posixacl"}


class ZfsPool(Strict):
    name: str
    node: str
    purpose: Literal["training-data", "general", "backup", "scratch"] = "general"
    vdevs: VdevGroup
    log: list[str] = Field(default_factory=list, description="SLOG devices; two or more are mirrored")
    cache: list[str] = Field(default_factory=list, description="L2ARC devices")
    special: VdevGroup | None = None
    ashift: int = Field(default=12, ge=9, le=16)
    force: bool = Field(default=False, description="allow creating the pool on disks with data")
    properties: dict[str, PropertyValue] = Field(default_factory=_default_pool_properties)
    datasets: list[Dataset] = Field(default_factory=list)
    snapshots: SnapshotPolicy | None = Field(
        default=None, description="snapshot retention of the datasets that set none of their own")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$", v) or v in {"mirror", "raidz", "spare", "log"}:
            raise ValueError(f"{v!r} is not a valid pool name")
        return v


class Zfs(Strict):
    arc_max_percent: int = Field(default=50, ge=5, le=90, description="ARC maximum, percent of RAM")
    # YAML 1.1 reads a bare `off` as false
    scrub: Annotated[Literal["weekly", "monthly", "off"], BeforeValidator(lambda v: "off" if v is False else v)] = (
        "monthly"
    )
    pools: list[ZfsPool] = Field(default_factory=list)


class NfsExport(Strict):
    name: str
    node: str
    path: AbsPath | None = None
    dataset: str | None = Field(default=None, description="pool/dataset; exported at its mountpoint")
    clients: list[str] = Field(default_factory=lambda: ["data"], description="network names or CIDRs")
    rw: bool = True
    root_squash: bool = True
    sync: bool = True
    options: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _path_or_dataset(self) -> NfsExport:
        if (self.path is None) == (self.dataset is None):
            raise ValueError("give exactly one of path or dataset")
        return self

    # The path of a dataset export is the dataset's ZFS mountpoint, which the zfs section
    # decides: provisioner.areas.storage.decide.export_path.


class NfsMount(Strict):
    export: str = Field(description="name of an nfs.exports entry")
    path: AbsPath
    nodes: list[str] = Field(min_length=1, description="node names, ranges or @role")
    vers: Literal["4.2", "4.1", "3"] = "4.2"
    nconnect: int = Field(default=8, ge=1, le=16)
    rsize: int = Field(default=1048576, ge=4096, le=1048576)
    wsize: int = Field(default=1048576, ge=4096, le=1048576)
    hard: bool = True
    proto: Literal["auto", "tcp", "rdma"] = "auto"
    automount: bool = False
    options: list[str] = Field(default_factory=list)


class Nfs(Strict):
    threads: int | None = Field(default=None, ge=8, le=1024, description="nfsd threads; default from cores")
    exports: list[NfsExport] = Field(default_factory=list)
    mounts: list[NfsMount] = Field(default_factory=list)


class MergerfsUnion(Strict):
    path: AbsPath
    branches: list[AbsPath] = Field(min_length=2)
    nodes: list[str] = Field(min_length=1)
    create_policy: Literal["epmfs", "mfs", "lfs", "pfrd", "rand", "ff", "epff", "eplfs", "lus"] = "pfrd"
    minfreespace: str = "50G"
    options: list[str] = Field(default_factory=list)

    @field_validator("minfreespace")
    @classmethod
    def _size(cls, v: str) -> str:
        if not SIZE_RE.match(v):
            raise ValueError(f"{v!r} is not a size like 50G or 500M")
        return v


# --------------------------------------------------------------------------- services
class AddressPool(Strict):
    base: ipaddress.IPv4Network
    size: int = Field(default=24, ge=16, le=30)


class Docker(Strict):
    enabled: bool = True
    nodes: list[str] = Field(default_factory=lambda: ["@compute"])
    source: Literal["auto", "docker-ce", "distro"] = "auto"
    data_root: AbsPath = "/var/lib/docker"
    log_max_size: str = "100m"
    log_max_file: int = Field(default=5, ge=1, le=100)
    live_restore: bool = True
    address_pools: list[AddressPool] = Field(
        default_factory=lambda: [AddressPool(base=ipaddress.IPv4Network("172.31.0.0/16"), size=24)]
    )
    nvidia_runtime: bool = True
    nvidia_runtime_default: bool = False
    users: list[str] = Field(default_factory=list, description="admin users added to the docker group")


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


class SlurmContainers(Strict):
    """Containers in Slurm jobs: enroot + pyxis on the compute and login nodes
    (provisioner/areas/slurm/containers.py; docs/containers.md)."""

    enabled: bool = False
    source_mirror: str | None = Field(
        default=None, description="http(s):// or file:// folder holding the pinned enroot and pyxis source "
        "tarballs under their upstream file names; unset: download them from GitHub")

    @field_validator("source_mirror")
    @classmethod
    def _mirror(cls, v: str | None) -> str | None:
        if v is not None and not URL_BASE_RE.match(v):
            raise ValueError(f"{v!r} is not an http(s):// or file:// URL")
        return v


class Slurm(Strict):
    enabled: bool = True
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


class NvidiaDriver(Strict):
    # a current branch of every driver source (provisioner/areas/gpu/versions.yaml)
    branch: str = "580"
    source: Literal["auto", "ubuntu-signed", "cuda-repo", "debian"] = "auto"
    open_kernel_modules: bool | None = Field(default=None, description="None: open on branch 560+")

    @field_validator("branch", mode="before")
    @classmethod
    def _branch(cls, v: Any) -> Any:
        if isinstance(v, int):
            v = str(v)
        if not isinstance(v, str) or not re.match(r"^\d{3}$", v):
            raise ValueError(f"{v!r} is not a driver branch like 550")
        return v


class Cuda(Strict):
    versions: list[str] | None = Field(
        default=None, min_length=1, description="None: the default toolkit of the node's OS and CUDA source")
    default: str | None = None
    cudnn: bool = False
    source: Literal["auto", "cuda-repo", "debian"] = "auto"

    @field_validator("versions", mode="before")
    @classmethod
    def _versions(cls, v: Any) -> Any:
        if isinstance(v, list):
            for x in v:
                if isinstance(x, float):
                    raise ValueError(
                        f"quote CUDA versions ('{x}'): unquoted, YAML reads them as numbers and 12.10 becomes 12.1"
                    )
            v = [str(x) for x in v]
            for x in v:
                if not re.match(r"^\d+\.\d+$", x):
                    raise ValueError(f"{x!r} is not a CUDA version like 12.4")
        return v

    @field_validator("default", mode="before")
    @classmethod
    def _default(cls, v: Any) -> Any:
        if isinstance(v, float):
            raise ValueError(f"quote the CUDA version ('{v}'): unquoted, YAML reads it as a number")
        return None if v is None else str(v)

    @model_validator(mode="after")
    def _default_listed(self) -> Cuda:
        if self.default is not None and self.versions is None:
            raise ValueError(f"default {self.default} needs versions (list the toolkits to install)")
        if self.default is not None and self.versions is not None and self.default not in self.versions:
            raise ValueError(f"default {self.default} is not one of versions {self.versions}")
        return self


class Nccl(Strict):
    version: str = "2.21.5"
    source: Literal["auto", "apt", "pypi"] = "auto"

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        v = str(v)
        if not re.match(r"^\d+\.\d+\.\d+(-\d+)?$", v):
            raise ValueError(f"{v!r} is not an NCCL version like 2.21.5")
        return v


class Ofed(Strict):
    source: Literal["inbox", "doca"] = "inbox"
    doca_version: str | None = None


class Software(Strict):
    nvidia_driver: NvidiaDriver = Field(default_factory=NvidiaDriver)
    cuda: Cuda = Field(default_factory=Cuda)
    nccl: Nccl = Field(default_factory=Nccl)
    ofed: Ofed = Field(default_factory=Ofed)


# --------------------------------------------------------------------------- monitoring
PROM_DURATION_RE = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
PROM_SIZE_RE = re.compile(r"^\d+(B|KB|MB|GB|TB|PB|EB)$")


def _prom_duration(value: str) -> str:
    if not value or not PROM_DURATION_RE.match(value):
        raise ValueError(f"{value!r} is not a Prometheus duration like 30s, 15d or 1w")
    return value


PromDuration = Annotated[str, AfterValidator(_prom_duration)]


def _secret_ref(owner: str, field: str, env: str | None, file: str | None) -> None:
    """At most one of ``<field>_env`` / ``<field>_file``; a name and an absolute path."""
    if env is not None and file is not None:
        raise ValueError(f"{owner}: give only one of {field}_env or {field}_file")
    if env is not None and not ENV_RE.match(env):
        raise ValueError(f"{field}_env {env!r} is not an environment variable name")
    if file is not None and not file.startswith("/"):
        raise ValueError(f"{field}_file {file!r} must be an absolute path")


def _no_inline(data: Any, keys: tuple[str, ...], what: str) -> Any:
    if isinstance(data, dict):
        for key in keys:
            if key in data:
                raise ValueError(f"inline {what} ({key}) is not allowed; use {key}_env (an environment "
                                 f"variable name) or {key}_file")
    return data


class EmailReceiver(Strict):
    to: list[EmailAddress] = Field(min_length=1)
    sender: EmailAddress = Field(description="From: address")
    smarthost: str = Field(description="SMTP server as host:port")
    require_tls: bool = True
    auth_username: str | None = None
    auth_password_env: str | None = None
    auth_password_file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, data: Any) -> Any:
        return _no_inline(data, ("auth_password",), "SMTP passwords")

    @field_validator("smarthost")
    @classmethod
    def _smarthost(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in v):
            raise ValueError(f"{v!r} is not host:port (e.g. mail.example.org:587)")
        return v

    @model_validator(mode="after")
    def _secret(self) -> EmailReceiver:
        _secret_ref("email", "auth_password", self.auth_password_env, self.auth_password_file)
        has_password = self.auth_password_env is not None or self.auth_password_file is not None
        if has_password and not self.auth_username:
            raise ValueError("an SMTP password needs auth_username")
        return self


class WebhookReceiver(Strict):
    url: str | None = Field(default=None, description="a URL holding no secret (e.g. an internal relay)")
    url_env: str | None = Field(default=None, description="URL with a token in it, from this variable")
    url_file: str | None = None
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s]+$", v):
            raise ValueError(f"{v!r} is not an http(s):// URL")
        return v

    @model_validator(mode="after")
    def _one_url(self) -> WebhookReceiver:
        given = [k for k in ("url", "url_env", "url_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of url, url_env or url_file")
        _secret_ref("webhook", "url", self.url_env, self.url_file)
        _secret_ref("webhook", "bearer_token", self.bearer_token_env, self.bearer_token_file)
        return self


Severity = Literal["critical", "warning"]


def _all_severities() -> list[Severity]:
    return ["critical", "warning"]


class AlertReceiver(Strict):
    name: str
    severities: list[Severity] = Field(default_factory=_all_severities, min_length=1, description="alerts sent here")
    email: EmailReceiver | None = None
    webhook: WebhookReceiver | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[a-z][a-z0-9-]{0,40}$", v):
            raise ValueError(f"{v!r}: a receiver name uses lower-case letters, digits and '-'")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> AlertReceiver:
        if (self.email is None) == (self.webhook is None):
            raise ValueError("a receiver has exactly one of email or webhook")
        return self


def _ratio(value: Any) -> Any:
    """A share in (0, 1]: a number (not a YAML boolean), not a percentage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number: give a ratio in (0, 1], e.g. 0.05 for 5%")
    if not 0 < value <= 1:
        raise ValueError(f"{value!r} is not a ratio in (0, 1] (5% is 0.05)")
    return float(value)


Ratio = Annotated[float, BeforeValidator(_ratio)]


class GpuJobIdle(Strict):
    """The GpuJobIdle alert: a Slurm job kept every GPU it holds on a node under a utilization
    for a time; optionally also mailed to the job's user."""

    utilization_below: Ratio = Field(default=0.05, description="the share of the time a GPU is busy, in (0, 1]")
    idle_for: PromDuration = Field(default="60m", description="how long every GPU of the job stays under it")
    notify_users: str | None = Field(
        default=None, description="an e-mail receiver of monitoring.receivers: the alert also goes to the job's "
        "user (users[].email) through its server, sender and login; absent: to the receivers only")


class Monitoring(Strict):
    nodes: list[str] = Field(
        default_factory=list, description="Prometheus/Alertmanager/Grafana nodes; default @services, else the head"
    )
    retention: PromDuration = "30d"
    retention_size: str | None = Field(default=None, description="cap on the TSDB size, e.g. 200GB")
    scrape_interval: PromDuration = "30s"
    gpu_metrics: Literal["dcgm", "nvidia-smi"] = Field(
        default="dcgm", description="NVIDIA's DCGM exporter, or our nvidia-smi collector"
    )
    grafana: bool = True
    receivers: list[AlertReceiver] = Field(default_factory=list)
    gpu_job_idle: GpuJobIdle = Field(default_factory=GpuJobIdle)

    @field_validator("retention_size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None and not PROM_SIZE_RE.match(v):
            raise ValueError(f"{v!r} is not a size like 500GB or 2TB")
        return v


# --------------------------------------------------------------------------- cost
class GpuCost(Strict):
    """What one GPU of a model costs per hour it is held: a price per GPU-hour (a rate that
    includes power), or its purchase price written off over a period plus the power it drew."""

    price_per_gpu_hour: float | None = Field(default=None, gt=0, description="a rate per GPU-hour held, "
                                             "power included")
    purchase_price: float | None = Field(default=None, gt=0, description="per GPU, its share of the server "
                                         "included")
    depreciation_years: float | None = Field(default=None, gt=0, le=20, description="the purchase price is "
                                             "written off evenly over this many years (8766 h each)")
    power_price_per_kwh: float | None = Field(default=None, ge=0, description="price of the energy the GPUs "
                                              "drew (measured by the GPU metrics)")

    @model_validator(mode="after")
    def _one_way(self) -> GpuCost:
        owned = (self.purchase_price, self.depreciation_years, self.power_price_per_kwh)
        if self.price_per_gpu_hour is not None:
            if any(v is not None for v in owned):
                raise ValueError("give either price_per_gpu_hour, or purchase_price with depreciation_years "
                                 "and power_price_per_kwh; not both")
            return self
        missing = [name for name, v in zip(("purchase_price", "depreciation_years", "power_price_per_kwh"),
                                           owned, strict=True) if v is None]
        if missing:
            raise ValueError("give price_per_gpu_hour, or purchase_price with depreciation_years and "
                             f"power_price_per_kwh (missing: {', '.join(missing)})")
        return self


class Cost(Strict):
    """Prices for `provision report usage`, per GPU model (the nodes' hardware.gpu.model)."""

    currency: str = Field(default="EUR", description="the currency the prices are in (shown, not converted)")
    gpus: dict[str, GpuCost] = Field(min_length=1, description="GPU model -> its price")

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z$\u20ac\u00a3\u00a5]{1,8}$", v):
            raise ValueError(f"{v!r}: a currency is a short code or sign such as EUR, USD or $")
        return v


# --------------------------------------------------------------------------- verify
class Verify(Strict):
    """Bounds and floors of `provision verify` (docs/verify.md); every field has a default."""

    command_timeout: int = Field(default=60, ge=1, le=3600, description="seconds one check's command may take")
    clock_offset_ms: float = Field(default=100.0, gt=0, description="largest |offset| chrony may report")
    busbw_floor_gbps: dict[Literal["pcie", "nvlink", "nvswitch"], float] = Field(
        default_factory=dict, description="all_reduce_perf bus bandwidth floors (GB/s) per GPU interconnect; "
        "unset kinds keep the defaults in docs/verify.md")
    ib_write_bw_fraction: float = Field(default=0.75, gt=0, le=1, description="ib_write_bw floor: this share "
                                        "of the port's link rate")
    write_bw_fraction: dict[Literal["infiniband", "roce"], float] = Field(
        default_factory=dict, description="ib_write_bw floor per fabric (a share of the port's link rate); "
        "unset fabrics keep ib_write_bw_fraction")
    multi_node_busbw_floor_gbps: dict[Literal["rdma", "infiniband", "roce", "ethernet"], float] = Field(
        default_factory=dict, description="all_reduce_perf bus bandwidth floors (GB/s) between two GPU nodes "
        "through Slurm, per fabric (rdma: both RDMA fabrics, unless infiniband or roce is given); unset "
        "kinds keep the defaults in docs/verify.md")

    @field_validator("write_bw_fraction")
    @classmethod
    def _fractions(cls, v: dict[str, float]) -> dict[str, float]:
        for fabric, share in v.items():
            if not 0 < share <= 1:
                raise ValueError(f"{fabric}: {share} is not a share of the link rate (0 < share <= 1)")
        return v
    docker_image: str | None = Field(default=None, description="an image present on the nodes for the "
                                     "`docker run --runtime nvidia` check; unset: that check says SKIP")
    burn_in_s: int = Field(default=0, ge=0, le=86400, description="seconds of GPU burn-in per GPU node "
                           "(check gpu.burn; `provision verify --burn-in` for one run); 0: none")
    burn_in_max_temp_c: int = Field(default=87, ge=40, le=110, description="gpu.burn fails a GPU that reaches "
                                    "this temperature (C)")
    dcgm_level: int = Field(default=1, ge=1, le=4, description="level of `dcgmi diag` (check gpu.dcgm): 1 "
                            "seconds, 2 minutes, 3 and 4 half an hour to two hours; `provision verify --level` "
                            "for one run")
    prolog_diag: bool = Field(default=False, description="a Slurm job prolog runs `dcgmi diag -r 1` on the job's "
                              "GPUs; a failure drains the node and requeues the job")
    gate: list[Literal["gpu.dcgm", "gpu.burn"]] = Field(
        default_factory=list, description="the acceptance gate: checks a new or rolled compute node must pass "
        "before Slurm may give it jobs (it stays drained until then); empty: no gate")


# --------------------------------------------------------------------------- backup
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
    database, slurmctld's state, the munge key (encrypted), Prometheus' TSDB snapshot."""

    destination: BackupDestination
    schedule: Literal["hourly", "daily", "weekly", "off"] = Field(
        default="daily", description="the head's timer; off: only `provision backup`")
    at: str = Field(default="02:30", description="HH:MM (UTC) of a daily or weekly backup")
    keep: int = Field(default=14, ge=1, le=1000, description="backups of ours kept at the destination")
    key_env: str | None = Field(default=None, description="environment variable holding the operator's "
                                "passphrase that encrypts the secrets")
    key_file: str | None = Field(default=None, description="file holding that passphrase (admin host)")
    prometheus: bool = Field(default=False, description="a TSDB snapshot of Prometheus on the head (needs its "
                             "--web.enable-admin-api)")
    timeout_s: int = Field(default=3600, ge=60, le=86400, description="bound on one backup or restore")

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, data: Any) -> Any:
        return _no_inline(data, ("key",), "backup key")

    @model_validator(mode="after")
    def _key(self) -> Backup:
        if self.key_env is None and self.key_file is None:
            raise ValueError("give key_env or key_file: the passphrase that encrypts the secrets, held by the "
                             "operator (never in the manifest)")
        _secret_ref("backup", "key", self.key_env, self.key_file)
        if not re.match(r"^([01]\d|2[0-3]):[0-5]\d$", self.at):
            raise ValueError(f"at {self.at!r} is not HH:MM")
        return self


# --------------------------------------------------------------------------- top level
class NodeIndex:
    """Lookups over one expanded node list: by name, by role, and resolved node selectors
    (filled by :mod:`provisioner.manifest.select`). Built once per list, so per-node code
    (role variables, checks, the plan) looks a node up in constant time instead of scanning
    the list: on a 2,000-node manifest the scans made validate and plan quadratic.

    A cache, not part of the manifest's value: any two indexes compare equal, so manifests
    compare as before whether or not theirs was built yet.
    """

    __slots__ = ("by_name", "by_role", "count", "names", "names_by_role", "nodes", "selections")

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.count = len(nodes)
        self.names: tuple[str, ...] = tuple(n.name for n in nodes)
        self.by_name: dict[str, Node] = {}
        self.by_role: dict[str, list[Node]] = {}
        for node in nodes:
            self.by_name.setdefault(node.name, node)  # the first of duplicates, as a scan finds it
            for role in node.roles:
                self.by_role.setdefault(role, []).append(node)
        self.names_by_role: dict[str, frozenset[str]] = {
            role: frozenset(n.name for n in members) for role, members in self.by_role.items()}
        # selector items -> (names in manifest order, the same as a set)
        self.selections: dict[tuple[str, ...], tuple[tuple[str, ...], frozenset[str]]] = {}

    def __eq__(self, other: object) -> bool:
        return other is None or isinstance(other, NodeIndex)


class Manifest(Strict):
    version: Literal[1]
    cluster: Cluster
    networks: Networks
    nodes: list[Node] = Field(min_length=1)
    zfs: Zfs = Field(default_factory=Zfs)
    nfs: Nfs = Field(default_factory=Nfs)
    mergerfs: list[MergerfsUnion] = Field(default_factory=list)
    docker: Docker = Field(default_factory=Docker)
    slurm: Slurm = Field(default_factory=Slurm)
    software: Software = Field(default_factory=Software)
    monitoring: Monitoring | None = Field(default=None, description="absent: no monitoring")
    cost: Cost | None = Field(default=None, description="prices per GPU model for `provision report usage`")
    verify: Verify = Field(default_factory=Verify)
    backup: Backup | None = Field(default=None, description="absent: no backups")
    groups: list[Group] = Field(default_factory=list, description="the people's groups, the same gid everywhere")
    users: list[User] = Field(default_factory=list, description="the people who use the cluster (not admins)")
    homes: Homes = Field(default_factory=Homes)
    role_vars: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="role variables the manifest does not generate, per cluster ('all'), role ('@compute') "
        "or node (names, ranges); checked against each role's meta/argument_specs.yml (provisioner/overrides.py)",
    )

    _index: NodeIndex | None = PrivateAttr(default=None)

    # ----- helpers over the expanded node list (see provisioner.manifest.load)
    def index(self) -> NodeIndex:
        """The node index of the current node list, built on first use. Nodes are treated as
        values: change a manifest's nodes by giving it a new list (``model_copy(update=...)``),
        which builds a new index, not by editing a node in place."""
        private = self.__pydantic_private__  # read directly: the attribute path costs more than the lookup
        index: NodeIndex | None = private.get("_index") if private is not None else None
        if index is None or index.nodes is not self.nodes or index.count != len(self.nodes):
            index = NodeIndex(self.nodes)
            self._index = index
        return index

    def node(self, name: str) -> Node:
        try:
            return self.index().by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def node_names(self) -> list[str]:
        return list(self.index().names)

    def with_role(self, role: str) -> list[Node]:
        return list(self.index().by_role.get(role, ()))

    def role_names(self, role: str) -> frozenset[str]:
        """The names of the nodes with ``role`` (a set: for "is this node one of them?")."""
        return self.index().names_by_role.get(role, frozenset())

    @property
    def head(self) -> Node:
        heads = self.with_role("head")
        if not heads:
            raise KeyError("head")
        return heads[0]

    @property
    def fqdn_suffix(self) -> str:
        return self.cluster.domain
