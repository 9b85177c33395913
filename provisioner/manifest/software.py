"""The software the nodes run: ``docker:`` and ``software:`` (NVIDIA driver, CUDA, NCCL, OFED)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from provisioner.manifest.fields import AbsPath, Strict


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
