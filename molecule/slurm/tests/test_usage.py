"""`provision report usage` against the scenario's real slurmdbd: two GPU jobs of known size
(2 GPUs x `sleep 4`, 1 GPU x `sleep 2`) run, then the report's own sacct command runs on the
head and its parser and arithmetic give their allocated GPU-hours: GPUs x the time held,
which is the sleep plus Slurm's start and the prolog (a few seconds at most).

Kept apart from test_slurm.py (other changes of the scenario's verifier land there). With
PROVISION_USAGE_CAPTURE=FILE the raw sacct output is written to FILE: that is how
tests/areas/monitoring/data/usage/sacct-slurm-22.05.txt was captured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.monitoring import usage
from provisioner.areas.monitoring import usage_sources as sources
from provisioner.validate import load_manifest

testinfra_hosts = ["ansible://slurm-head"]

MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "added.yml"
JOBS = {"slurm-gpu02": (2, 4), "slurm-gpu03": (1, 2)}  # node: (GPUs, seconds of sleep)
SLACK = 5  # seconds Slurm may add to a job's sleep (start, prolog, epilog)


def submit(host: Any, node: str, gpus: int, seconds: int) -> str:
    return str(host.check_output(
        f"sbatch --parsable --time=2 -w {node} --gres=gpu:{gpus} -o /dev/null --wrap 'sleep {seconds}'").strip())


def test_the_report_s_sacct_query_gives_the_gpu_hours_of_known_jobs(host: Any) -> None:
    start = time.time()
    ids = {node: submit(host, node, gpus, seconds) for node, (gpus, seconds) in JOBS.items()}
    deadline = time.monotonic() + 90
    while True:  # both ran to their end, and slurmdbd has their end
        states = host.check_output(f"sacct -n -X -P -j {','.join(ids.values())} -o State").split()
        if states == ["COMPLETED", "COMPLETED"]:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the usage jobs did not complete in time: {states}")
        time.sleep(1)
    now = time.time()
    win = sources.Window(start - 5, now)
    out = host.run(sources.sacct_command(win, now))  # what `provision report usage` runs on the controller
    assert out.rc == 0, out.stderr
    capture = os.environ.get("PROVISION_USAGE_CAPTURE")
    if capture:
        Path(capture).write_text(out.stdout)
    jobs, problems = sources.parse_sacct(out.stdout)
    assert problems == []
    by_id = {j.job_id: j for j in jobs}
    for node, (gpus, seconds) in JOBS.items():
        job = by_id[ids[node]]
        assert (job.nodes, job.gpus, job.state) == ((node,), gpus, "COMPLETED"), job
        assert job.end is not None and seconds <= job.end - job.start <= seconds + SLACK, job

    m = load_manifest(MANIFEST).manifest
    ours = [by_id[i] for i in ids.values()]
    report = usage.build(m, ours, None, None, win, "node", 30)
    rows = {r.key: r for r in report.rows}
    for node, (gpus, seconds) in JOBS.items():  # GPU-hours = GPUs x the time held
        assert gpus * seconds / 3600 <= rows[node].allocated_h <= gpus * (seconds + SLACK) / 3600, rows[node]
        assert rows[node].jobs == 1 and rows[node].measured_h == 0.0
    assert report.total.allocated_h == pytest.approx(sum(r.allocated_h for r in rows.values()))
    assert report.total.cost == 0.0  # the scenario's manifest has no cost section
