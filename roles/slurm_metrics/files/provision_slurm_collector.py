#!/usr/bin/env python3
"""provision-slurm-collector: Slurm metrics for node_exporter's textfile collector.

Installed by the slurm_metrics role on the Slurm controller (managed by Ansible; local edits
are overwritten) and run by a systemd timer. It asks `sinfo` for every node's state, GPUs
and drain reason and `squeue` for every job's state, partition, GPUs and pending reason, and
writes, atomically, one file that node_exporter serves:

  provision_slurm_node_state{slurm_node,state[,reason]} 1 per node (base state: idle, mixed,
                                                       allocated, drained, draining, down, ...)
  provision_slurm_node_not_responding{slurm_node}      1 when slurmctld lost the node's slurmd
  provision_slurm_node_gpus{slurm_node}                GPUs configured (gres gpu)
  provision_slurm_node_gpus_allocated{slurm_node}      GPUs held by jobs
  provision_slurm_jobs{state,partition}                jobs by state
  provision_slurm_jobs_pending{partition,reason}       pending jobs by reason
  provision_slurm_job_gpus{state,partition}            GPUs asked for by those jobs
  provision_slurm_job_info{job_id,user,account,partition} 1 per running job (array tasks each): who
                                                       runs it (job_id as the GPU job map's hpc_job)
  provision_slurm_collector_success                    0 when sinfo or squeue failed
  provision_slurm_collector_last_run_timestamp_seconds

On a failure the old node and job series are dropped (stale numbers are worse than none) and
the error is logged to the journal. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SINFO = ["sinfo", "--noheader", "--Node", "--Format=NodeList:|,StateLong:|,Gres:|,GresUsed:|,Reason:"]
SQUEUE = ["squeue", "--noheader", "--all", "--array",
          "--Format=JobID:|,State:|,Partition:|,tres-per-job:|,tres-per-node:|,NumNodes:|,Reason:"]
# sinfo appends these to a state: * not responding, ~ powered off, # powering up, ! pending
# power down, % powering down, $ maintenance reservation, @ pending reboot, ^ rebooting,
# - planned (backfill)
STATE_FLAGS = "*~#!%$@^-"
# running jobs' owners; JobID is the raw id (an array task's own), as the prolog's SLURM_JOB_ID
OWNERS = ["squeue", "--noheader", "--all", "--array", "--states=RUNNING",
          "--Format=JobID:|,UserName:|,Account:|,Partition:"]
GPU_COUNT_RE = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


class CollectError(Exception):
    """A command failed or printed something we cannot read."""


@dataclass(frozen=True)
class NodeRow:
    name: str
    state: str
    not_responding: bool
    reason: str
    gpus: int
    gpus_allocated: int


@dataclass(frozen=True)
class JobRow:
    state: str
    partition: str
    reason: str
    gpus: int


@dataclass(frozen=True)
class Owner:
    job_id: str
    user: str
    account: str  # "" where Slurm has none ((null): no accounting, no --account)
    partition: str


# --------------------------------------------------------------------------- parsing
def _split_top(text: str) -> list[str]:
    """Split a gres list at commas outside parentheses: gpu:a:2(S:0-1),gpu:b:1 -> two items."""
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def gpu_count(gres: str) -> int:
    """GPUs in a gres/tres string: gpu:tesla_t4:2, gpu:2(S:0), gres:gpu:1, gpu:a:1(IDX:0),gpu:b:2;
    0 for (null), N/A or none."""
    total = 0
    for item in _split_top(gres):
        item = item.removeprefix("gres:").removeprefix("gres/")
        m = GPU_COUNT_RE.match(item)
        if m:
            total += int(m.group(1))
    return total


def base_state(raw: str) -> tuple[str, bool]:
    """(state without flags, not responding) of sinfo's StateLong: "down*" -> ("down", True)."""
    state = raw.strip().lower()
    not_responding = "*" in state
    return state.rstrip(STATE_FLAGS) or "unknown", not_responding


def parse_sinfo(text: str) -> list[NodeRow]:
    """Nodes from SINFO's output, once each (sinfo prints a node once per partition)."""
    rows: dict[str, NodeRow] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|", 4)
        if len(fields) != 5:
            raise CollectError(f"sinfo line {number}: expected 5 fields separated by '|': {line!r}")
        name, state_raw, gres, gres_used, reason = (f.strip() for f in fields)
        if not name:
            raise CollectError(f"sinfo line {number}: no node name: {line!r}")
        state, not_responding = base_state(state_raw)
        rows.setdefault(name, NodeRow(
            name=name, state=state, not_responding=not_responding,
            reason="" if reason.lower() in ("none", "(null)") else reason,
            gpus=gpu_count(gres), gpus_allocated=gpu_count(gres_used),
        ))
    return list(rows.values())


def _int(text: str, default: int = 1) -> int:
    return int(text) if text.isdigit() else default


def parse_squeue(text: str) -> list[JobRow]:
    """Jobs (array tasks each) from SQUEUE's output."""
    jobs: list[JobRow] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|", 6)
        if len(fields) != 7:
            raise CollectError(f"squeue line {number}: expected 7 fields separated by '|': {line!r}")
        _job_id, state, partition, per_job, per_node, nodes, reason = (f.strip() for f in fields)
        gpus = gpu_count(per_job) or gpu_count(per_node) * _int(nodes)
        jobs.append(JobRow(state=state.lower(), partition=partition, reason=reason, gpus=gpus))
    return jobs


def parse_owners(text: str) -> list[Owner]:
    """Running jobs' id, user, account and partition from OWNERS' output."""
    owners: list[Owner] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 4 or not fields[0].isdigit():
            raise CollectError(f"squeue (owners) line {number}: expected job id|user|account|partition: {line!r}")
        job_id, user, account, partition = fields
        owners.append(Owner(job_id, user, "" if account == "(null)" else account, partition))
    return owners


# --------------------------------------------------------------------------- exposition
def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**items: str) -> str:
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in items.items() if v != "")
    return "{" + inner + "}" if inner else ""


def number(value: float) -> str:
    """Exposition format of a sample value: integers without a fraction, floats in full."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def metric_block(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines.extend(f"{name}{lbl} {number(value)}" for lbl, value in samples)
    return lines


def render(nodes: Sequence[NodeRow] | None, jobs: Sequence[JobRow] | None, now: float,
           owners: Sequence[Owner] = ()) -> str:
    """The textfile: node and job series when both commands worked, the collector's own
    status always."""
    out: list[str] = []
    ok = nodes is not None and jobs is not None
    if nodes is not None and jobs is not None:
        out += metric_block("provision_slurm_node_state", "gauge",
                            "Slurm node state (1 for the current state; reason when set).",
                            [(labels(slurm_node=n.name, state=n.state, reason=n.reason), 1) for n in nodes])
        out += metric_block("provision_slurm_node_not_responding", "gauge",
                            "1 when slurmctld does not hear from the node's slurmd.",
                            [(labels(slurm_node=n.name), int(n.not_responding)) for n in nodes])
        out += metric_block("provision_slurm_node_gpus", "gauge", "GPUs configured on the node (gres gpu).",
                            [(labels(slurm_node=n.name), n.gpus) for n in nodes])
        out += metric_block("provision_slurm_node_gpus_allocated", "gauge", "GPUs allocated to jobs.",
                            [(labels(slurm_node=n.name), n.gpus_allocated) for n in nodes])
        by_state = Counter((j.state, j.partition) for j in jobs)
        out += metric_block("provision_slurm_jobs", "gauge", "Jobs (array tasks each) by state and partition.",
                            [(labels(state=s, partition=p), c) for (s, p), c in sorted(by_state.items())])
        pending = Counter((j.partition, j.reason) for j in jobs if j.state == "pending")
        out += metric_block("provision_slurm_jobs_pending", "gauge", "Pending jobs by partition and reason.",
                            [(labels(partition=p, reason=r), c) for (p, r), c in sorted(pending.items())])
        gpus: Counter[tuple[str, str]] = Counter()
        for j in jobs:
            gpus[(j.state, j.partition)] += j.gpus
        out += metric_block("provision_slurm_job_gpus", "gauge", "GPUs asked for by jobs, by state and partition.",
                            [(labels(state=s, partition=p), c) for (s, p), c in sorted(gpus.items())])
    if ok:
        out += metric_block("provision_slurm_job_info", "gauge",
                            "1 per running job: its owner (job_id is the GPU job map's hpc_job).",
                            [(labels(job_id=o.job_id, user=o.user, account=o.account, partition=o.partition), 1)
                             for o in owners])
    out += metric_block("provision_slurm_collector_success", "gauge",
                        "1 when sinfo and squeue answered on the last run.", [("", int(ok))])
    out += metric_block("provision_slurm_collector_last_run_timestamp_seconds", "gauge",
                        "When the collector last ran.", [("", round(now, 3))])
    return "\n".join(out) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """node_exporter must never read a half-written file: write beside it, then rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- running
def run(argv: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise CollectError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise CollectError(f"{argv[0]} did not answer within {timeout:g}s") from None
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise CollectError(f"{argv[0]} failed (exit {proc.returncode}): {message[-1] if message else ''}")
    return proc.stdout


def collect(timeout: float) -> tuple[list[NodeRow] | None, list[JobRow] | None, list[Owner], str]:
    try:
        nodes, jobs = parse_sinfo(run(SINFO, timeout)), parse_squeue(run(SQUEUE, timeout))
        return nodes, jobs, parse_owners(run(OWNERS, timeout)), ""
    except CollectError as exc:
        return None, None, [], str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the .prom file to write")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per Slurm command")
    args = parser.parse_args(argv)
    nodes, jobs, owners, error = collect(args.timeout)
    write_atomic(args.out, render(nodes, jobs, time.time(), owners))
    if error:
        print(f"provision-slurm-collector: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
