"""The nccl-tests release the nccl role builds (roles/nccl, tasks_from: tests) builds with every
CUDA major the manifest may ask for."""

from __future__ import annotations

from pathlib import Path

import yaml

from provisioner.areas.gpu.decide import CUDA_REPO_VERSIONS, OS_NAMES

ROOT = Path(__file__).resolve().parents[3]
# The first nccl-tests release whose default build works with CUDA 13 (NVIDIA/nccl-tests
# tags): v2.13.11's GPU architectures for CUDA >= 11 include sm_60/61/70, which nvcc 13 no
# longer compiles for; v2.13.13 gave CUDA >= 13 its own list but v2.15.2 put sm_70 back,
# v2.16.1 took it out again, and v2.16.9 compiles as C++14 instead of C++11.
FIRST_FOR_CUDA_13 = (2, 16, 9)


def version(tag: str) -> tuple[int, ...]:
    return tuple(int(p) for p in tag.removeprefix("v").split("."))


def test_the_default_nccl_tests_build_with_every_offered_cuda() -> None:
    defaults = yaml.safe_load((ROOT / "roles/nccl/defaults/main.yml").read_text())
    specs = yaml.safe_load((ROOT / "roles/nccl/meta/argument_specs.yml").read_text())
    default = defaults["nccl_tests_version"]
    assert specs["argument_specs"]["tests"]["options"]["nccl_tests_version"]["default"] == default
    offers_13 = [os_ for os_ in OS_NAMES if any(v.startswith("13.") for v in CUDA_REPO_VERSIONS[os_])]
    assert offers_13 == list(OS_NAMES)  # CUDA 13 on all three OSes, as the issue says
    assert version(default) >= FIRST_FOR_CUDA_13, f"{default} does not build with CUDA 13"
