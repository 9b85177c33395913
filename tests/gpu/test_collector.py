"""The gpu_metrics role's nvidia-smi collector (roles/gpu_metrics/files/provision_gpu_collector.py)
run against the real driver: one info sample per GPU, the memory nvidia-smi reports, success 1."""

from __future__ import annotations

import sys
from pathlib import Path

from gpukit import ROLES, Gpu, run

COLLECTOR = ROLES / "gpu_metrics" / "files" / "provision_gpu_collector.py"
MIB = 1024 * 1024


def samples(text: str) -> dict[str, float]:
    """'name{labels}' -> value of every sample line of an exposition text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_collector_writes_every_gpu(gpus: list[Gpu], tmp_path: Path) -> None:
    out = tmp_path / "gpu.prom"
    proc = run([sys.executable, str(COLLECTOR), "--out", str(out), "--job-map-dir", str(tmp_path / "jobs")], 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    print(text)
    got = samples(text)
    info = sorted(k for k in got if k.startswith("provision_gpu_info{"))
    assert len(info) == len(gpus), info
    for g in gpus:
        labels = f'{{gpu="{g.index}",uuid="{g.uuid}"}}'
        assert got[f"provision_gpu_memory_total_bytes{labels}"] == g.memory_total_mib * MIB
        assert 0 <= got[f"provision_gpu_utilization_ratio{labels}"] <= 1
        assert 0 < got[f"provision_gpu_temperature_celsius{labels}"] < 110
    assert got["provision_gpu_collector_success"] == 1, proc.stderr
