"""roles/slurm/templates/provision-slurm-prolog.sh.j2: the runner slurm.conf's Prolog= and
Epilog= name runs every executable script of its directory in name order, with the job's
environment, and stops with the status of the first that fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = ROOT / "roles" / "slurm" / "templates" / "provision-slurm-prolog.sh.j2"


def runner(tmp_path: Path, timeout: int = 120) -> tuple[Path, Path]:
    folder = tmp_path / "prolog.d"
    folder.mkdir()
    text = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined).from_string(
        TEMPLATE.read_text()).render(slurm_prolog_kind="prolog", slurm_prolog_kind_dir=str(folder),
                                     slurm_prolog_timeout=timeout)
    path = tmp_path / "provision-slurm-prolog"
    path.write_text(text)
    path.chmod(0o755)
    return path, folder


def script(folder: Path, name: str, body: str, executable: bool = True) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755 if executable else 0o644)


def run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(path)], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "SLURM_JOB_ID": "42"})


def test_runs_every_executable_script_in_name_order(tmp_path: Path) -> None:
    path, folder = runner(tmp_path)
    log = tmp_path / "log"
    script(folder, "50-b.sh", f'echo "b $SLURM_JOB_ID" >> {log}')
    script(folder, "10-a", f'echo "a $SLURM_JOB_ID" >> {log}')
    script(folder, "20-off.sh", f'echo off >> {log}', executable=False)
    assert run(path).returncode == 0
    assert log.read_text() == "a 42\nb 42\n"


def test_first_failure_stops_the_run_with_its_status(tmp_path: Path) -> None:
    path, folder = runner(tmp_path)
    log = tmp_path / "log"
    script(folder, "10-fails", "exit 3")
    script(folder, "20-after", f"echo ran >> {log}")
    assert run(path).returncode == 3
    assert not log.exists()


def test_empty_directory_and_a_hung_script(tmp_path: Path) -> None:
    path, folder = runner(tmp_path, timeout=1)
    assert run(path).returncode == 0
    script(folder, "10-hangs", "exec sleep 30")
    assert run(path).returncode == 124  # timeout(1): killed, counts as failed
