"""The ``networks:`` section: management, BMC, data and the RDMA fabrics (InfiniBand, RoCE)."""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from provisioner.manifest.fields import NETWORK_NAMES, RDMA_NETWORKS, NetworkName, Strict


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
