"""roles/slurm/templates/provision-dcgm-prolog.sh.j2: the job prolog's DCGM level-1 diagnostic
(manifest verify.prolog_diag), run for real with stand-ins for dcgmi, scontrol and logger."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest

from provisioner.areas.slurm import rolevars
from provisioner.gate import is_gate_reason, resume_refusal

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "roles" / "slurm" / "templates" / "provision-dcgm-prolog.sh.j2"


def render(tmp_path: Path, timeout: int = 90) -> Path:
    text = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined).from_string(
        TEMPLATE.read_text()).render(slurm_prolog_dcgm_timeout=timeout)
    path = tmp_path / "20-provision-dcgm-diag"
    path.write_text(text)
    path.chmod(0o755)
    subprocess.run(["sh", "-n", str(path)], check=True, timeout=10)  # it parses as POSIX sh
    return path


def stand_in(folder: Path, name: str, body: str) -> None:
    """A command on the prolog's PATH that logs its arguments to <folder>/calls."""
    path = folder / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> {folder}/calls\n{body}\n')
    path.chmod(0o755)


def run(prolog: Path, bin_dir: Path, gpus: str | None = "0,1") -> tuple[int, list[str]]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu01"}
    if gpus is not None:
        env["SLURM_JOB_GPUS"] = gpus
    rc = subprocess.run([str(prolog)], env=env, capture_output=True, text=True, timeout=30, check=False).returncode
    calls = bin_dir / "calls"
    return rc, calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    stand_in(folder, "logger", "")
    stand_in(folder, "scontrol", "")
    return folder


def test_a_passing_diagnostic_lets_the_job_start(tmp_path: Path, bin_dir: Path) -> None:
    stand_in(bin_dir, "dcgmi", "exit 0")
    assert run(render(tmp_path), bin_dir) == (0, ["dcgmi diag -r 1 -i 0,1"])


def test_a_failure_drains_the_node_with_the_gates_reason_and_fails_the_prolog(tmp_path: Path, bin_dir: Path) -> None:
    stand_in(bin_dir, "dcgmi", "echo 'Persistence mode for GPU 1 is disabled.'; exit 226")
    rc, calls = run(render(tmp_path), bin_dir)
    assert rc == 1  # Slurm requeues the job of a failed prolog
    assert calls[0] == "dcgmi diag -r 1 -i 0,1"
    assert calls[1].startswith("logger -t provision-dcgm-prolog -- job 42: dcgmi diag -r 1 -i 0,1 exited 226: "
                               "Persistence mode for GPU 1 is disabled.")
    reason = "provision gate: prolog gpu.dcgm failed: dcgmi diag -r 1 -i 0,1 exited 226 (job 42)"
    assert calls[2] == f"scontrol update NodeName=gpu01 State=DRAIN Reason={reason}"
    assert is_gate_reason(reason) and resume_refusal("gpu01", reason)  # provision resume keeps it drained


def test_a_hung_diagnostic_is_bounded_and_counts_as_failed(tmp_path: Path, bin_dir: Path) -> None:
    stand_in(bin_dir, "dcgmi", "exec sleep 30")
    rc, calls = run(render(tmp_path, timeout=1), bin_dir)
    assert rc == 1 and "exited 124" in calls[-1] and calls[-1].startswith("scontrol update NodeName=gpu01")


def test_nothing_to_check_without_gpus_or_dcgm(tmp_path: Path, bin_dir: Path) -> None:
    prolog = render(tmp_path)
    assert run(prolog, bin_dir, gpus=None) == (0, [])  # a CPU job: no GPU to check
    assert run(prolog, bin_dir, gpus="") == (0, [])
    rc, calls = run(prolog, bin_dir)  # no dcgmi on the PATH: logged, the job starts
    assert rc == 0 and calls == ["logger -t provision-dcgm-prolog -- job 42: no dcgmi (DCGM is not installed): "
                                 "GPUs 0,1 not checked"]


def test_the_manifest_turns_it_on(kit: Any) -> None:
    assert rolevars.cluster_vars(kit.load(kit.base()).manifest)["slurm_prolog_dcgm"] is False
    data = kit.base()
    data["verify"] = {"prolog_diag": True}
    assert rolevars.cluster_vars(kit.load(data).manifest)["slurm_prolog_dcgm"] is True
    assert "slurm_prolog_dcgm" in rolevars.LIGHT_KEYS  # rendered by the light config play, on every apply
