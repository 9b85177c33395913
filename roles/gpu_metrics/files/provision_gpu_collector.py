#!/usr/bin/env python3
"""provision-gpu-collector: GPU metrics from nvidia-smi for node_exporter's textfile collector.

The fallback of the gpu_metrics role where NVIDIA's DCGM exporter is not installed (NVIDIA's
repository unreachable, or ``monitoring.gpu_metrics: nvidia-smi``). Installed by Ansible (local
edits are overwritten) and run by a systemd timer; it writes, atomically, one file:

  provision_gpu_info{gpu,uuid,name,pci_bus_id}             1 per GPU nvidia-smi lists
  provision_gpu_temperature_celsius{gpu,uuid[,hpc_job]}    core temperature
  provision_gpu_utilization_ratio{...}                     0..1
  provision_gpu_memory_used_bytes / _memory_total_bytes{...}
  provision_gpu_power_watts{...}
  provision_gpu_ecc_corrected_volatile_total{...}          since the driver loaded (GPUs with ECC)
  provision_gpu_ecc_uncorrected_volatile_total{...}
  provision_gpu_last_xid{gpu,pci_bus_id}                   code of the last XID since boot, 0: none
  provision_gpu_xid_errors_total{gpu,pci_bus_id,xid}       XIDs since boot, per code
  provision_gpu_collector_success                          0 when nvidia-smi failed or listed errors
  provision_gpu_collector_last_run_timestamp_seconds

XIDs come from the kernel log of this boot (``journalctl -k -b``: "NVRM: Xid (PCI:...): N, ...").
A GPU that fell off the bus is missing from nvidia-smi's list, so its XIDs carry its PCI
address as ``gpu`` (``pci:0000:3b:00``). GPUs listed in the job map directory (one file per
GPU index holding job ids, written by the Slurm prolog; the same directory DCGM's
``--hpc-job-mapping-dir`` reads) get an ``hpc_job`` label per job, like DCGM's metrics.
Standard library only.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FIELDS = [
    "index", "uuid", "name", "pci.bus_id", "temperature.gpu", "utilization.gpu", "memory.used",
    "memory.total", "power.draw", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
]
NVIDIA_SMI_ARGS = [f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"]
JOURNAL_ARGS = ["journalctl", "-k", "-b", "-o", "cat", "--no-pager", "-q", "--grep", "NVRM: Xid"]
XID_RE = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.\d)?\): (?P<xid>\d+)")
MIB = 1024 * 1024


class CollectError(Exception):
    """nvidia-smi failed, or printed something we cannot read."""


@dataclass
class Gpu:
    index: str
    uuid: str
    name: str
    pci: str  # 0000:3b:00 (domain:bus:device, lower case), as the kernel log writes it
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SmiResult:
    gpus: list[Gpu]
    errors: list[str]  # lines nvidia-smi printed that are not GPUs (a lost GPU, a driver problem)


# --------------------------------------------------------------------------- parsing
def pci_key(bus_id: str) -> str:
    """00000000:3B:00.0 (nvidia-smi) or 0000:3b:00 (kernel) -> 0000:3b:00."""
    text = bus_id.strip().lower()
    text = text.split(".")[0]
    parts = text.split(":")
    if len(parts) != 3:
        return text
    domain, bus, device = parts
    return f"{domain[-4:].rjust(4, '0')}:{bus.rjust(2, '0')}:{device.rjust(2, '0')}"


def number(text: str) -> float | None:
    """A value of nvidia-smi's CSV: "41", "69.85", "0 %", "81559 MiB"; None for [N/A],
    [Not Supported], [Unknown Error], ERR! and anything else that is not a number."""
    text = text.strip()
    for unit in (" MiB", " W", " %", " C"):
        text = text.removesuffix(unit)
    try:
        value = float(text)
    except ValueError:
        return None
    return value


def parse_query(text: str) -> SmiResult:
    """GPUs from ``nvidia-smi NVIDIA_SMI_ARGS``; lines that are not a GPU become errors."""
    gpus: list[Gpu] = []
    errors: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = next(csv.reader([line], skipinitialspace=True))
        if len(row) != len(FIELDS) or not row[0].strip().isdigit():
            errors.append(line.strip())
            continue
        cells = dict(zip(FIELDS, (c.strip() for c in row), strict=True))
        gpu = Gpu(index=cells["index"], uuid=cells["uuid"], name=cells["name"], pci=pci_key(cells["pci.bus_id"]))
        conversions = {
            "temperature_celsius": ("temperature.gpu", 1.0),
            "utilization_ratio": ("utilization.gpu", 0.01),
            "memory_used_bytes": ("memory.used", MIB),
            "memory_total_bytes": ("memory.total", MIB),
            "power_watts": ("power.draw", 1.0),
            "ecc_corrected_volatile_total": ("ecc.errors.corrected.volatile.total", 1.0),
            "ecc_uncorrected_volatile_total": ("ecc.errors.uncorrected.volatile.total", 1.0),
        }
        for metric, (source, factor) in conversions.items():
            value = number(cells[source])
            if value is not None:
                gpu.values[metric] = value * factor
        gpus.append(gpu)
    return SmiResult(gpus, errors)


def parse_xids(text: str) -> list[tuple[str, int]]:
    """(pci key, XID code) per "NVRM: Xid" line of the kernel log, in log order."""
    out: list[tuple[str, int]] = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if m:
            out.append((pci_key(m.group("pci")), int(m.group("xid"))))
    return out


def read_job_map(folder: Path) -> dict[str, list[str]]:
    """GPU index -> job ids, from the files the Slurm prolog writes (one per GPU index)."""
    out: dict[str, list[str]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.iterdir()):
        if not path.name.isdigit() or not path.is_file():
            continue
        try:
            jobs = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except OSError:
            continue
        if jobs:
            out[path.name] = jobs
    return out


# --------------------------------------------------------------------------- exposition
HELP = {
    "temperature_celsius": "GPU core temperature (nvidia-smi temperature.gpu).",
    "utilization_ratio": "Fraction of time a kernel ran on the GPU (nvidia-smi utilization.gpu).",
    "memory_used_bytes": "GPU memory in use.",
    "memory_total_bytes": "GPU memory in all.",
    "power_watts": "Power draw.",
    "ecc_corrected_volatile_total": "Corrected ECC errors since the driver loaded.",
    "ecc_uncorrected_volatile_total": "Uncorrected ECC errors since the driver loaded.",
}


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**items: str) -> str:
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in items.items() if v != "")
    return "{" + inner + "}" if inner else ""


def fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def block(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    samples = list(samples)
    if not samples:
        return []
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines.extend(f"{name}{lbl} {fmt(value)}" for lbl, value in samples)
    return lines


def render(smi: SmiResult | None, xids: Sequence[tuple[str, int]], jobs: dict[str, list[str]],
           ok: bool, now: float) -> str:
    out: list[str] = []
    gpus = smi.gpus if smi is not None else []
    out += block("provision_gpu_info", "gauge", "GPUs nvidia-smi lists (value 1).",
                 [(labels(gpu=g.index, uuid=g.uuid, name=g.name, pci_bus_id=g.pci), 1) for g in gpus])
    for metric, help_text in HELP.items():
        samples = []
        for g in gpus:
            if metric not in g.values:
                continue
            for job in jobs.get(g.index, [""]):
                samples.append((labels(gpu=g.index, uuid=g.uuid, hpc_job=job), g.values[metric]))
        kind = "counter" if metric.endswith("_total") else "gauge"
        out += block(f"provision_gpu_{metric}", kind, help_text, samples)
    by_pci = {g.pci: g.index for g in gpus}
    last: dict[str, int] = {g.pci: 0 for g in gpus}
    counts: dict[tuple[str, int], int] = {}
    for pci, code in xids:
        last[pci] = code
        counts[(pci, code)] = counts.get((pci, code), 0) + 1

    def gpu_of(pci: str) -> str:
        return by_pci.get(pci, f"pci:{pci}")

    out += block("provision_gpu_last_xid", "gauge", "Code of the GPU's last XID error this boot (0: none).",
                 [(labels(gpu=gpu_of(pci), pci_bus_id=pci), code) for pci, code in last.items()])
    out += block("provision_gpu_xid_errors_total", "counter", "XID errors this boot, by code.",
                 [(labels(gpu=gpu_of(pci), pci_bus_id=pci, xid=str(code)), n)
                  for (pci, code), n in sorted(counts.items())])
    out += block("provision_gpu_collector_success", "gauge",
                 "1 when nvidia-smi answered for every GPU on the last run.", [("", int(ok))])
    out += block("provision_gpu_collector_last_run_timestamp_seconds", "gauge", "When the collector last ran.",
                 [("", round(now, 3))])
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
def run_smi(nvidia_smi: str, timeout: float) -> tuple[SmiResult | None, str]:
    """(result, error): nvidia-smi's GPUs, and why the run is not a success ("" when it is)."""
    try:
        proc = subprocess.run([nvidia_smi, *NVIDIA_SMI_ARGS], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except FileNotFoundError:
        return None, f"{nvidia_smi} is not installed"
    except subprocess.TimeoutExpired:
        return None, f"{nvidia_smi} did not answer within {timeout:g}s (driver hung?)"
    result = parse_query(proc.stdout + "\n" + proc.stderr)
    if proc.returncode != 0 or result.errors:
        detail = "; ".join(result.errors) or f"exit status {proc.returncode}"
        return result, f"nvidia-smi: {detail}"
    return result, ""


def run_journal(timeout: float) -> tuple[str, str]:
    """(kernel log lines with XIDs of this boot, error). journalctl exits 1 when nothing matches."""
    try:
        proc = subprocess.run(JOURNAL_ARGS, capture_output=True, text=True, timeout=timeout, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return "", f"journalctl: {exc}"
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and proc.stdout.strip()):
        return "", f"journalctl failed (exit {proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the .prom file to write")
    parser.add_argument("--job-map-dir", type=Path, default=Path("/run/provision/gpu-jobs"))
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per command")
    args = parser.parse_args(argv)
    smi, smi_error = run_smi(args.nvidia_smi, args.timeout)
    journal, journal_error = run_journal(args.timeout)
    xids = parse_xids(journal)
    text = render(smi, xids, read_job_map(args.job_map_dir), ok=not smi_error, now=time.time())
    write_atomic(args.out, text)
    for error in (smi_error, journal_error):
        if error:
            print(f"provision-gpu-collector: {error}", file=sys.stderr)
    return 1 if smi_error else 0


if __name__ == "__main__":
    sys.exit(main())
