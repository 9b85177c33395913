"""Benchmark: start-up, and manifest -> validate -> inventory -> plan for clusters of growing size.

Run: .venv/bin/python bench/bench_pipeline.py [--nodes 16 64 256 1024 2000] [--repeat 3]
     [--json FILE] [--doc docs/benchmarks.md]

Three parts, each a median of ``--repeat`` runs:

* start-up: ``provision --help`` and ``provision validate examples/llm-200k.yaml`` as
  subprocesses (wall time, CPU time and peak memory of the child);
* the command as an operator runs it: ``provision plan`` of a generated manifest of 16 and of
  the largest size, as a subprocess (start-up, validation, plan and the printed table);
* in-process stages (validate, inventory, plan) for every size.

Two manifest shapes: ``plain`` (a head node and ranged GPU nodes, as the first version of this
benchmark) and ``storage``, shaped like examples/music-lab.yaml and llm-200k.yaml: two
storage servers with ZFS pools of mirrors, NFS exports mounted on every GPU node, a MergerFS
union over them, InfiniBand with RDMA, BMCs, and install disks given as ranges, so that
work repeated per node over every node (quadratic) cannot hide.

It prints each figure next to its goal (docs/benchmarks.md) and, with ``--doc``, rewrites the
results block of that file; ``--json`` writes every number. Not a test: it asserts nothing
about time, it measures (and exits 0 whether or not a goal is met).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from provisioner import inventory
from provisioner.content import project_root
from provisioner.plan import compute, load_plays
from provisioner.state import State
from provisioner.validate import load_text

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "llm-200k.yaml"
SHAPES = ("plain", "storage")
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA ops@laptop"

# Goals of issue 14 (docs/benchmarks.md)
GOAL_STARTUP_S = 0.5
GOAL_PLAN_S = 2.0
GOAL_PLAN_RATIO = 3.0
DOC_BEGIN = "<!-- bench_pipeline: begin (written by bench/bench_pipeline.py --doc) -->"
DOC_END = "<!-- bench_pipeline: end -->"


# --------------------------------------------------------------------------- manifests
def _range(nodes: int) -> str:
    width = max(2, len(str(nodes)))
    return f"[{1:0{width}d}-{nodes:0{width}d}]"


def plain_manifest(nodes: int) -> dict[str, Any]:
    """A head node and ``nodes`` ranged GPU nodes in one partition (the first benchmark's shape)."""
    return {
        "version": 1,
        "cluster": {"name": "bench", "domain": "bench.internal"},
        "networks": {"management": {"cidr": "10.0.0.0/16"}, "data": {"cidr": "10.1.0.0/16", "mtu": 9000}},
        "nodes": [
            {"name": "ctl", "roles": ["head"], "interfaces": {"management": {"ip": "10.0.0.2"}},
             "hardware": {"cpu": {"cores_per_socket": 16}, "memory_gb": 128}},
            {"name": f"gpu{_range(nodes)}", "roles": ["compute"],
             "interfaces": {"management": {"ip": "10.0.1.1", "mac": "52:54:00:00:01:01"},
                            "data": {"ip": "10.1.1.1", "interface": "enp65s0"}},
             "hardware": {"cpu": {"cores_per_socket": 32, "threads_per_core": 2}, "memory_gb": 512,
                          "gpu": {"model": "H100 SXM", "count": 8, "nvswitch": True}}},
        ],
        "slurm": {"partitions": [{"name": "gpu", "nodes": ["@compute"], "default": True}]},
    }


def storage_manifest(nodes: int) -> dict[str, Any]:
    """Like the examples: ZFS pools on two storage servers, NFS mounts and a MergerFS union
    on every GPU node, InfiniBand with RDMA, BMCs, and install disks given as ranges."""
    gpus = f"gpu{_range(nodes)}"
    bmc = {"user": "admin", "password_env": "BENCH_BMC_PASSWORD"}
    return {
        "version": 1,
        "cluster": {"name": "bench", "domain": "bench.internal",
                    "admin_users": [{"name": "ops", "ssh_keys": [SSH_KEY]}]},
        "networks": {"management": {"cidr": "10.0.0.0/16"}, "bmc": {"cidr": "10.2.0.0/16"},
                     "data": {"cidr": "10.1.0.0/16", "mtu": 9000},
                     "infiniband": {"cidr": "10.3.0.0/16", "subnet_manager": "opensm", "rdma": True}},
        "nodes": [
            {"name": "ctl", "roles": ["head"], "install_disks": ["nvme-CTL_OS_1", "nvme-CTL_OS_2"],
             "interfaces": {"management": {"ip": "10.0.0.2", "mac": "52:54:00:00:00:02"}},
             "bmc": {"type": "ipmi", "address": "10.2.0.2", **bmc},
             "hardware": {"cpu": {"cores_per_socket": 16}, "memory_gb": 128}},
            {"name": "store[1-2]", "roles": ["storage"],
             "install_disks": ["ata-SSD_870_EVO_A[1-2]", "ata-SSD_870_EVO_B[1-2]"],
             "interfaces": {"management": {"ip": "10.0.0.11", "mac": "52:54:00:00:00:11"},
                            "data": {"ip": "10.1.0.11", "interface": "enp65s0f0"},
                            "infiniband": {"ip": "10.3.0.11", "interface": "ibp65s0"}},
             "bmc": {"type": "redfish", "address": "10.2.0.11", **bmc},
             "hardware": {"cpu": {"cores_per_socket": 16, "threads_per_core": 2}, "memory_gb": 256,
                          "disks": [{"id": "wwn-0x5000c500a00000[01-30]", "size_gb": 18000, "kind": "hdd",
                                     "use": "zfs"}]}},
            {"name": gpus, "roles": ["compute"],
             "install_disks": [f"nvme-SSD_990_PRO_S7H{_range(nodes)}"],
             "interfaces": {"management": {"ip": "10.0.1.1", "mac": "52:54:00:00:01:01"},
                            "data": {"ip": "10.1.1.1", "interface": "enp65s0"},
                            "infiniband": {"ip": "10.3.1.1", "interface": "ibp65s0"}},
             "bmc": {"type": "ipmi", "address": "10.2.1.1", **bmc},
             "hardware": {"cpu": {"cores_per_socket": 32, "threads_per_core": 2}, "memory_gb": 512,
                          "gpu": {"model": "H100 SXM", "count": 8, "nvswitch": True}}},
        ],
        "zfs": {"pools": [
            {"name": "tank", "node": f"store{i}", "purpose": "training-data",
             "vdevs": {"type": "mirror", "width": 3, "disks": ["wwn-0x5000c500a00000[01-30]"]},
             "datasets": [{"name": "corpus", "properties": {"recordsize": "1M", "compression": "lz4"}}]}
            for i in (1, 2)
        ]},
        "nfs": {
            "exports": [{"name": f"corpus{i}", "node": f"store{i}", "dataset": "tank/corpus",
                         "clients": ["infiniband"]} for i in (1, 2)]
            + [{"name": "home", "node": "ctl", "path": "/srv/home", "clients": ["management"]}],
            "mounts": [{"export": f"corpus{i}", "path": f"/mnt/corpus{i}", "nodes": ["@compute"], "nconnect": 8}
                       for i in (1, 2)]
            + [{"export": "home", "path": "/home/shared", "nodes": [gpus]}],
        },
        "mergerfs": [{"path": "/corpus", "branches": ["/mnt/corpus1", "/mnt/corpus2"], "nodes": ["@compute"],
                      "create_policy": "mfs", "minfreespace": "500G"}],
        "slurm": {"partitions": [{"name": "gpu", "nodes": ["@compute"], "default": True},
                                 {"name": "all", "nodes": [gpus]}]},
    }


def manifest_text(nodes: int, shape: str = "plain") -> str:
    data = storage_manifest(nodes) if shape == "storage" else plain_manifest(nodes)
    return yaml.safe_dump(data, sort_keys=False)


# --------------------------------------------------------------------------- measuring
def median_time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def provision_command() -> list[str]:
    """The installed console script beside this Python, else the module."""
    script = Path(sys.executable).parent / "provision"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "provisioner.cli"]


def child_stats(argv: Sequence[str], cwd: Path, repeat: int, timeout: float = 300.0) -> dict[str, float]:
    """Median wall and CPU seconds over ``repeat`` runs, and the largest peak memory (MiB)."""
    walls: list[float] = []
    cpus: list[float] = []
    peak = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = start + timeout
        while True:  # wait4 gives this child's own rusage (not the sum of all children)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{' '.join(argv)}: still running after {timeout:.0f} s")
            time.sleep(0.002)
        walls.append(time.perf_counter() - start)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read() if proc.stderr else b""
        if proc.stderr:
            proc.stderr.close()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
        cpus.append(usage.ru_utime + usage.ru_stime)
        peak = max(peak, usage.ru_maxrss / 1024)  # KiB on Linux
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "peak_mib": peak}


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "load_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


# --------------------------------------------------------------------------- parts
def startup(repeat: int) -> dict[str, dict[str, float]]:
    cmd = provision_command()
    return {
        "provision --help": child_stats([*cmd, "--help"], ROOT, repeat),
        "provision validate examples/llm-200k.yaml": child_stats([*cmd, "validate", str(EXAMPLE)], ROOT, repeat),
    }


def cli_plans(sizes: Sequence[int], shapes: Sequence[str], repeat: int) -> dict[str, dict[str, float]]:
    """``provision plan`` as a subprocess, in a scratch folder (no state: every node is new)."""
    out: dict[str, dict[str, float]] = {}
    cmd = provision_command()
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        for shape in shapes:
            for n in sizes:
                path = Path(tmp) / f"{shape}-{n}.yaml"
                path.write_text(manifest_text(n, shape))
                out[f"{shape}/{n}"] = child_stats([*cmd, "plan", path.name], Path(tmp), repeat)
    return out


def stages(sizes: Sequence[int], shapes: Sequence[str], repeat: int) -> list[dict[str, Any]]:
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for n in sizes:
            text = manifest_text(n, shape)
            m = load_text(text, "bench.yaml").manifest
            rows.append({
                "shape": shape,
                "nodes": len(m.nodes),
                "validate_s": median_time(functools.partial(load_text, text, "bench.yaml"), repeat),
                "inventory_s": median_time(functools.partial(inventory.build, m, source="bench.yaml"), repeat),
                "plan_s": median_time(functools.partial(compute, m, State(), plays), repeat),
            })
    return rows


# --------------------------------------------------------------------------- report
def verdict(wall_ok: bool, cpu_ok: bool) -> str:
    """The goal holds for the wall time as measured; on a machine others load, the CPU time
    says whether the gap is this program's or the load's."""
    if wall_ok:
        return "met"
    return "NOT met (met in CPU time)" if cpu_ok else "NOT met"


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured: wall and CPU time, goal, verdict) rows for the table."""
    rows: list[tuple[str, str, str, str]] = []
    for name, st in result["startup"].items():
        rows.append((f"`{name}`", f"{st['wall_s']:.2f} s (CPU {st['cpu_s']:.2f} s)", f"<= {GOAL_STARTUP_S} s",
                     verdict(st["wall_s"] <= GOAL_STARTUP_S, st["cpu_s"] <= GOAL_STARTUP_S)))
    small, large = result["sizes"][0], result["sizes"][-1]
    for shape in result["shapes"]:
        a = result["plan_cli"][f"{shape}/{small}"]
        b = result["plan_cli"][f"{shape}/{large}"]
        rows.append((f"`provision plan`, {shape}, {small} GPU nodes",
                     f"{a['wall_s']:.2f} s (CPU {a['cpu_s']:.2f} s), {a['peak_mib']:.0f} MiB", "", ""))
        rows.append((f"`provision plan`, {shape}, {large} GPU nodes",
                     f"{b['wall_s']:.2f} s (CPU {b['cpu_s']:.2f} s), {b['peak_mib']:.0f} MiB", f"<= {GOAL_PLAN_S} s",
                     verdict(b["wall_s"] <= GOAL_PLAN_S, b["cpu_s"] <= GOAL_PLAN_S)))
        ratio, cpu_ratio = b["wall_s"] / a["wall_s"], b["cpu_s"] / a["cpu_s"]
        rows.append((f"plan {large} / plan {small} ({shape})", f"{ratio:.2f} x (CPU {cpu_ratio:.2f} x)",
                     f"<= {GOAL_PLAN_RATIO} x", verdict(ratio <= GOAL_PLAN_RATIO, cpu_ratio <= GOAL_PLAN_RATIO)))
    return rows


def markdown(result: dict[str, Any]) -> str:
    mach = result["machine"]
    lines = [
        f"Measured {mach['date']} on {mach['cpus']} cores ({mach['cpu_model'] or 'unknown CPU'}), load average "
        f"{mach['load_1m_start']} at the start and {mach['load_1m_end']} at the end, Python {mach['python']}; "
        f"medians of {result['repeat']} runs.",
        "",
        "| figure | measured | goal | |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in summary_rows(result)]
    lines += [
        "",
        "In-process stages (seconds; nodes counts every node of the manifest):",
        "",
        "| shape | nodes | validate | inventory | plan |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {r['shape']} | {r['nodes']} | {r['validate_s']:.3f} | {r['inventory_s']:.3f} | {r['plan_s']:.3f} |"
              for r in result["stages"]]
    return "\n".join(lines)


def write_doc(doc: Path, block: str) -> None:
    text = doc.read_text()
    start, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no block between {DOC_BEGIN!r} and {DOC_END!r} to refresh")
    doc.write_text(text[: start + len(DOC_BEGIN)] + "\n" + block + "\n" + text[end:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256, 1024, 2000],
                        help="GPU node counts (the first and the last are also planned through the CLI)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--doc", type=Path, help="refresh the results block of this Markdown file")
    args = parser.parse_args(argv)
    sizes = sorted(args.nodes)
    mach = machine()
    mach["load_1m_start"] = mach.pop("load_1m")
    print(f"machine: {mach['cpus']} cores, {mach['cpu_model']}, load {mach['load_1m_start']}", flush=True)
    result: dict[str, Any] = {"sizes": sizes, "shapes": args.shapes, "repeat": args.repeat, "machine": mach}
    result["startup"] = startup(args.repeat)
    for name, st in result["startup"].items():
        print(f"{name:<45} {st['wall_s']:6.2f} s  (CPU {st['cpu_s']:.2f} s, {st['peak_mib']:.0f} MiB)", flush=True)
    result["plan_cli"] = cli_plans(sorted({sizes[0], sizes[-1]}), args.shapes, args.repeat)
    for key, st in result["plan_cli"].items():
        print(f"provision plan {key:<30} {st['wall_s']:6.2f} s  (CPU {st['cpu_s']:.2f} s, {st['peak_mib']:.0f} MiB)",
              flush=True)
    print(f"{'shape':>8} {'nodes':>6} {'validate ms':>12} {'inventory ms':>13} {'plan ms':>9}", flush=True)
    rows = []
    for shape in args.shapes:
        for n in sizes:
            row = stages([n], [shape], args.repeat)[0]
            rows.append(row)
            print(f"{shape:>8} {row['nodes']:>6} {row['validate_s'] * 1000:>12.1f} {row['inventory_s'] * 1000:>13.1f} "
                  f"{row['plan_s'] * 1000:>9.1f}", flush=True)
    result["stages"] = rows
    mach["load_1m_end"] = round(os.getloadavg()[0], 2)
    print()
    width = max(len(r[0]) for r in summary_rows(result))
    for figure, measured, goal, ok in summary_rows(result):
        print(f"{figure:<{width}}  {measured:<38} {goal:<10} {ok}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.doc:
        write_doc(args.doc, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
