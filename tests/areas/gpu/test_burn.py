"""provisioner.areas.gpu.burn: the gpu.burn check, its program's lines and its verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.gpu import burn
from provisioner.nodecheck.check import Check, Output
from provisioner.nodecheck.parsers import ParseError
from provisioner.verify import catalog

RECORDED = Path(__file__).parent / "recorded"
BURN_OK = ("gpu 0 seconds=60.0 iterations=1530 errors=0 cpu_mismatch=0 gflops=41234 max_temp_c=71 "
           "max_power_w=412.3 slowdown=none watch=nvml\n"
           "gpu 1 seconds=60.0 iterations=1529 errors=0 cpu_mismatch=0 gflops=41200 max_temp_c=69 "
           "max_power_w=405.0 slowdown=none watch=nvml\nburn-in done gpus=2\n")


def names(checks: list[Check], node: str) -> list[str]:
    return [c.name for c in checks if c.node == node]


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def test_burn_in_is_planned_only_when_asked(kit: Any) -> None:
    assert "gpu.burn" not in names(catalog.plan(kit.load(kit.base()).manifest), "node01")
    data = kit.base()
    data["verify"] = {"burn_in_s": 600}
    checks = catalog.plan(kit.load(data).manifest)
    check = by_name(checks, "node01", "gpu.burn")
    assert check.needs == "gpu" and check.command is not None
    assert check.command.timeout == 600 + burn.BUILD_S
    assert check.command.text.endswith('"$d/burn" 600') and "__global__ void burn" in check.command.text
    assert "gpu.burn" not in names(checks, "head01")  # no GPUs there


@pytest.mark.parametrize(("stdout", "status", "detail"), [
    (BURN_OK, "PASS", "2 GPUs, 60 s, 0 errors, >= 41200 GFLOP/s each, max 71 C"),
    (BURN_OK.replace("errors=0 cpu_mismatch=0 gflops=41200", "errors=3 cpu_mismatch=0 gflops=41200"),
     "FAIL", "GPU 1 3 wrong results"),
    (BURN_OK.replace("cpu_mismatch=0 gflops=41234", "cpu_mismatch=2 gflops=41234"),
     "FAIL", "GPU 0 2 results differ from the CPU's"),
    (BURN_OK.replace("slowdown=none watch=nvml\ngpu 1", "slowdown=hw_thermal,sw_thermal watch=nvml\ngpu 1"),
     "FAIL", "GPU 0 slowed down (hw_thermal, sw_thermal)"),
    (BURN_OK.replace("max_temp_c=69", "max_temp_c=88"), "FAIL", "GPU 1 reached 88 C (limit 87)"),
    (BURN_OK.replace("seconds=60.0 iterations=1529", "seconds=20.5 iterations=1529"),
     "FAIL", "GPU 1 stopped after 20.5 s of 60"),
    (BURN_OK.replace("watch=nvml", "watch=none").replace("max_temp_c=71", "max_temp_c=-1"),
     "PASS", "2 GPUs, 60 s, 0 errors, >= 41200 GFLOP/s each, temperatures not watched (no NVML)"),
    ("gpu 0 error=out of memory\nburn-in done gpus=1\n", "FAIL", "1 GPUs ran, manifest says 2"),
    ("no usable GPU: no CUDA-capable device is detected\n", "FAIL",
     "no usable GPU: no CUDA-capable device is detected (exit 2)"),
])
def test_burn_verdict(kit: Any, stdout: str, status: str, detail: str) -> None:
    data = kit.base()
    data["verify"] = {"burn_in_s": 60}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "gpu.burn")
    outcome = check.judge(Output(stdout=stdout, rc=2 if stdout.startswith("no usable") else 0))
    assert (outcome.status, outcome.detail) == (status, detail)


def test_burn_lines() -> None:
    text = ("gpu 0 seconds=60.0 iterations=1530 errors=0 cpu_mismatch=0 gflops=41234 max_temp_c=71 "
            "max_power_w=412.3 slowdown=hw_slowdown watch=nvml\ngpu 1 error=an illegal memory access was "
            "encountered\nburn-in done gpus=2\n")
    g0, g1 = burn.parse_burn(text)
    assert (g0.index, g0.iterations, g0.errors, g0.max_temp_c, g0.max_power_w, g0.slowdown, g0.watched) == (
        0, 1530, 0, 71, 412.3, ("hw_slowdown",), True)
    assert (g1.index, g1.error) == (1, "an illegal memory access was encountered")


def test_burn_recorded_on_an_h100() -> None:
    (row,) = burn.parse_burn((RECORDED / "gpu-burn-h100.txt").read_text())
    assert (row.seconds, row.iterations, row.errors, row.cpu_mismatch, row.max_temp_c, row.slowdown) == (
        30.0, 3220, 0, 0, 74, ())
    assert row.watched and row.gflops == 59006 and row.max_power_w == 554.9


@pytest.mark.parametrize(("text", "message"), [
    ("gpu 0 seconds=60.0 iterations=1\n", "no 'burn-in done' line"),
    ("no usable GPU: 0 devices\n", "no usable GPU: 0 devices"),
    ("gpu 0 seconds=60.0 iterations=x errors=0\nburn-in done gpus=1\n", "unreadable burn-in line"),
    ("burn-in done gpus=1\n", "0 GPU lines for gpus=1"),
])
def test_burn_refuses_what_it_cannot_read(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        burn.parse_burn(text)
