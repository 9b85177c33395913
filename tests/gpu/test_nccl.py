"""NCCL on the real GPUs: the nccl role's smoke program (what verify's ``nccl.version`` check
runs) and nccl-tests' all_reduce_perf, each built with the role's own command line against
the NCCL found here (conftest.py), read by verify's parsers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from gpukit import Gpu, header_version, linked, run

from provisioner.areas.gpu import verify as gpu_verify
from provisioner.nodecheck import check, parsers


def test_smoke_program_reports_the_nccl_it_was_built_against(
        gpus: list[Gpu], nccl_prefix: Path, nccl_smoke: Path) -> None:
    # verify's nccl.version check runs the first smoke program it finds: here, ours
    command = check.run_first(gpu_verify.NCCL_SMOKE_GLOB).replace(
        gpu_verify.NCCL_SMOKE_GLOB, str(nccl_smoke.parent / "nccl-version-*"))
    proc = run(["bash", "-c", command], 60, env=linked(nccl_prefix))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert gpu_verify.parse_nccl_version(proc.stdout) == header_version(nccl_prefix / "include")


def test_all_reduce_perf_runs_clean_on_every_gpu(gpus: list[Gpu], nccl_prefix: Path, all_reduce_perf: Path) -> None:
    proc = run([str(all_reduce_perf), "-b", "8", "-e", "64M", "-f", "2", "-g", str(len(gpus))], 600,
               env=linked(nccl_prefix))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    result = parsers.parse_all_reduce(proc.stdout)
    assert result.out_of_bounds == 0, proc.stdout
    # size count type redop root | time algbw busbw #wrong (out of place) | the same in place
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert rows and all(len(r) >= 13 for r in rows), proc.stdout
    assert all(float(r[8]) == 0 and float(r[12]) == 0 for r in rows), proc.stdout


@pytest.mark.skipif(not shutil.which("dcgmi"), reason="DCGM is not installed here (no dcgmi on PATH)")
def test_dcgm_diag_level_1_passes(gpus: list[Gpu]) -> None:
    proc = run(["dcgmi", "diag", "-r", "1"], 300)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Fail" not in proc.stdout, proc.stdout
