"""CUDA on the real GPUs: the cuda role's smoke program built with the role's nvcc command,
and verify's device query (the ``cuda`` check's command), both against nvidia-smi's count."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from gpukit import ROLES, Gpu, nvcc_release, role_argv, run

from provisioner.areas.gpu import verify as gpu_verify


def test_smoke_program_adds_vectors_on_every_gpu(gpus: list[Gpu], cuda_home: Path, tmp_path: Path) -> None:
    release = nvcc_release(cuda_home)
    shutil.copy(ROLES / "cuda" / "files" / "smoke.cu", tmp_path / "smoke.cu")
    argv = role_argv("cuda", "smoke.yml", "Compile the smoke program",
                     {"item": release, "cuda_smoke_dir": str(tmp_path), "__cuda_smoke_tag": "gpu-suite"})
    # the role runs /usr/local/cuda-<release>/bin/nvcc; this machine's toolkit may live elsewhere
    assert argv[0] == f"/usr/local/cuda-{release}/bin/nvcc", argv
    argv[0] = str(cuda_home / "bin" / "nvcc")
    built = run(argv, 300)
    assert built.returncode == 0, built.stdout + built.stderr
    binary = Path(argv[argv.index("-o") + 1])
    ran = run([str(binary)], 120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == f"CUDA runtime {release}", lines
    verdicts = dict(re.findall(r"^GPU (\d+) .*: (.*)$", ran.stdout, re.MULTILINE))
    assert verdicts == {str(g.index): "ok" for g in gpus}, ran.stdout


def test_verify_device_query_counts_every_gpu(gpus: list[Gpu], cuda_home: Path) -> None:
    env = {**os.environ, "PATH": f"{cuda_home / 'bin'}:{os.environ.get('PATH', '')}"}
    proc = run(["bash", "-c", gpu_verify.device_query_command()], 300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert gpu_verify.parse_device_query(proc.stdout) == len(gpus)
