"""The ``nodes:`` section: one node's roles, OS, NICs and bonds, BMC and hardware."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, PrivateAttr, field_validator, model_validator

from provisioner.manifest.cluster import InstallMethod
from provisioner.manifest.fields import ENV_RE, AbsPath, HostPattern, Mac, NetworkName, OsName, Role, Strict
from provisioner.manifest.ranges import normalize_mac


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


def _disk_id(v: str) -> str:
    if "/" in v or not v:
        raise ValueError(f"{v!r}: give the name under /dev/disk/by-id, without a path")
    return v


class Disk(Strict):
    """A disk of the node by its name under /dev/disk/by-id (a range: several disks of the
    node); on a ranged node entry whose nodes' disks differ (serials), ``per_node`` instead:
    one id per node of the entry, in its order. Expanded nodes carry ``id`` only."""

    id: str = Field(default="", description="name under /dev/disk/by-id")
    per_node: list[str] | None = Field(
        default=None, min_length=1, description="instead of id: one by-id name per node of a ranged entry, "
        "in its order (each may be a range: that node's several disks)")
    size_gb: int | None = Field(default=None, ge=1)
    kind: Literal["nvme", "ssd", "hdd"] = "hdd"
    use: Literal["os", "scratch", "zfs", "none"] = "none"

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return _disk_id(v)

    @field_validator("per_node")
    @classmethod
    def _per_node(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [_disk_id(item) for item in v]

    @model_validator(mode="after")
    def _one_way(self) -> Disk:
        if self.per_node is not None and self.id:
            raise ValueError("give id or per_node, not both")
        if self.per_node is None and not self.id:
            raise ValueError("give the disk's id (or per_node: one id per node of a ranged entry)")
        return self


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
