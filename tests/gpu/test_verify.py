"""verify's GPU checks on the local node: the checks ``provision verify`` plans for a node
described as this machine (gpukit.local_manifest), run by verify's own runner with a local
executor instead of SSH, and judged by verify's own judges."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from gpukit import Gpu, header_version, local_manifest, nvcc_release

from provisioner.areas.gpu import burn as gpu_burn
from provisioner.areas.gpu import verify as gpu_verify
from provisioner.areas.gpu.decide import CUDA_REPO_VERSIONS, NCCL_WHEEL_RANGE
from provisioner.nodecheck.check import Check, Output
from provisioner.validate import load_text
from provisioner.verify import catalog, run

NODE = "gpu-suite"
GPU_CHECKS = ("gpu.count", "gpu.model", "gpu.driver", "gpu.persistence", "gpu.ecc", "gpu.xid", "cuda")


def local_executor(env: dict[str, str]) -> run.Execute:
    def execute(host: str, text: str, timeout: int) -> Output:
        assert host == NODE, f"a check for another host ({host}) would leave this machine"
        try:
            proc = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=timeout,
                                  env=env, check=False)
        except subprocess.TimeoutExpired:
            return Output(error=f"{run.TIMED_OUT} {timeout}s")
        return Output(proc.returncode, proc.stdout, proc.stderr)
    return execute


def manifest_cuda(release: str) -> str:
    """The local toolkit's release, or the newest the manifest knows of its major (the checks
    run here use the local toolkit; the manifest's release only has to validate)."""
    known = CUDA_REPO_VERSIONS["ubuntu-24.04"]
    same_major = [v for v in known if v.split(".")[0] == release.split(".")[0]]
    return release if release in known else same_major[-1]


def planned(gpus: list[Gpu], cuda: str, nccl: str, verify: dict[str, int] | None = None) -> list[Check]:
    data = local_manifest(NODE, gpus[0].name, len(gpus), gpus[0].driver.split(".")[0], manifest_cuda(cuda), nccl,
                          verify)
    return catalog.plan(load_text(yaml.safe_dump(data)).manifest)


def any_nccl(cuda_home: Path) -> str:
    """An NCCL the manifest accepts with this CUDA (for the checks that run no NCCL)."""
    return ".".join(map(str, NCCL_WHEEL_RANGE[int(nvcc_release(cuda_home).split(".")[0])][0]))


def test_burn_in_passes_on_this_node(gpus: list[Gpu], cuda_home: Path) -> None:
    seconds = int(os.environ.get("GPU_SUITE_BURN_S", "20"))
    checks = planned(gpus, nvcc_release(cuda_home), any_nccl(cuda_home), {"burn_in_s": seconds})
    (check,) = [c for c in checks if c.name == "gpu.burn"]
    assert check.command is not None
    env = {**os.environ, "PATH": f"{cuda_home / 'bin'}:{os.environ.get('PATH', '')}"}
    out = local_executor(env)(NODE, check.command.text, check.command.timeout)
    print(out.stdout, out.stderr, out.error)
    outcome = check.judge(out)
    print(f"gpu.burn {outcome.status} {outcome.detail}")
    assert outcome.status == "PASS", outcome
    for row in gpu_burn.parse_burn(out.stdout):  # what the judge read is real: it ran, watched, drew power
        assert row.iterations > 0 and row.errors == 0 and row.cpu_mismatch == 0, row
        assert row.watched and row.max_temp_c > 0 and row.max_power_w > 0, row


def results(checks: list[Check], env: dict[str, str]) -> dict[str, run.Result]:
    got = run.verify(checks, [NODE], local_executor(env), 60)
    for r in got:
        print(f"{r.node:10} {r.check:16} {r.status:5} {r.seconds:6.1f}s  {r.detail}")
    return {r.check: r for r in got}


def test_gpu_checks_pass_on_this_node(gpus: list[Gpu], cuda_home: Path) -> None:
    checks = [c for c in planned(gpus, nvcc_release(cuda_home), any_nccl(cuda_home)) if c.name in GPU_CHECKS]
    assert sorted(c.name for c in checks) == sorted(GPU_CHECKS)
    env = {**os.environ, "PATH": f"{cuda_home / 'bin'}:{os.environ.get('PATH', '')}"}
    got = results(checks, env)
    assert got["reach"].status == "PASS", got["reach"]
    for name in ("gpu.count", "gpu.model", "gpu.driver", "cuda"):
        assert got[name].status == "PASS", got[name]
    assert got["gpu.xid"].status in ("PASS", "SKIP"), got["gpu.xid"]  # SKIP: a container, no kernel log
    assert got["gpu.ecc"].status in ("PASS", "SKIP"), got["gpu.ecc"]  # SKIP: GPUs without ECC
    smi = subprocess.run(["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60, check=False).stdout.split()
    want = "PASS" if all(s == "Enabled" for s in smi) else "FAIL"  # a node setting: both are right answers
    assert got["gpu.persistence"].status == want, (got["gpu.persistence"], smi)


def test_nccl_checks_pass_on_this_node(gpus: list[Gpu], cuda_home: Path, nccl_prefix: Path, nccl_smoke: Path,
                                       request: pytest.FixtureRequest) -> None:
    version = header_version(nccl_prefix / "include")
    checks = [c for c in planned(gpus, nvcc_release(cuda_home), version) if c.name.startswith("nccl.")]
    globs = {gpu_verify.NCCL_SMOKE_GLOB: str(nccl_smoke.parent / "nccl-version-*")}
    if len(gpus) >= 2:  # verify plans all_reduce_perf only where a node has several GPUs
        globs[gpu_verify.ALL_REDUCE_GLOB] = str(request.getfixturevalue("all_reduce_perf"))
    for glob, here in globs.items():  # the nodes' install paths -> this suite's builds
        checks = [replace(c, command=replace(c.command, text=c.command.text.replace(glob, here)))
                  if c.command else c for c in checks]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{nccl_prefix / 'lib'}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    got = results(checks, env)
    assert got["nccl.version"].status == "PASS", got["nccl.version"]
    if len(gpus) >= 2:
        assert got["nccl.all_reduce"].status == "PASS", got["nccl.all_reduce"]


def test_dcgm_diag_level_1_on_this_node(gpus: list[Gpu], cuda_home: Path) -> None:
    """gpu.dcgm (``dcgmi diag -r 1 -j``) where DCGM is installed and its host engine runs: the
    JSON of a real DCGM is read per test and judged (a GPU DCGM finds at fault is a FAIL)."""
    if subprocess.run(["bash", "-c", "command -v dcgmi"], capture_output=True, timeout=10).returncode != 0:
        pytest.skip("DCGM is not installed here (no dcgmi)")
    engine = subprocess.run(["dcgmi", "discovery", "-l"], capture_output=True, text=True, timeout=60, check=False)
    if engine.returncode != 0:
        pytest.skip(f"DCGM's host engine does not answer: {(engine.stdout + engine.stderr).strip()[:200]}")
    (check,) = [c for c in planned(gpus, nvcc_release(cuda_home), any_nccl(cuda_home)) if c.name == "gpu.dcgm"]
    got = results([check], dict(os.environ))
    print(got["gpu.dcgm"])
    assert got["gpu.dcgm"].status in ("PASS", "FAIL"), got["gpu.dcgm"]  # it ran and DCGM's JSON was read
    assert not got["gpu.dcgm"].detail.startswith(("not dcgmi's JSON", "no 'DCGM")), got["gpu.dcgm"]
