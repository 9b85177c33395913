"""The ``verify:`` section: bounds and floors of `provision verify` and the acceptance gate."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from provisioner.manifest.fields import Strict


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
