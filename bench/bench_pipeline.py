"""Benchmark: manifest -> validate -> inventory -> plan for clusters of growing size.

Run: .venv/bin/python bench/bench_pipeline.py [--nodes 16 64 256 1024]
Prints one line per size with the median of several runs for each stage. Not a test: it
asserts nothing about time, it measures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import yaml

from provisioner import inventory
from provisioner.plan import PlaySpec, compute
from provisioner.state import State
from provisioner.validate import load_text

PLAYS = [
    PlaySpec("common - base", "all:&{{ provision_targets | default('all') }}", "base.yml"),
    PlaySpec("common - hosts", "all", "base.yml"),
    PlaySpec("slurm - compute", "slurm_compute:&{{ provision_targets | default('all') }}", "slurm.yml"),
]


def manifest_text(nodes: int) -> str:
    width = len(str(nodes))
    data: dict[str, Any] = {
        "version": 1,
        "cluster": {"name": "bench", "domain": "bench.internal"},
        "networks": {"management": {"cidr": "10.0.0.0/16"}, "data": {"cidr": "10.1.0.0/16", "mtu": 9000}},
        "nodes": [
            {"name": "ctl", "roles": ["head"], "interfaces": {"management": {"ip": "10.0.0.2"}},
             "hardware": {"cpu": {"cores_per_socket": 16}, "memory_gb": 128}},
            {"name": f"gpu[{1:0{width}d}-{nodes:0{width}d}]", "roles": ["compute"],
             "interfaces": {"management": {"ip": "10.0.1.1", "mac": "52:54:00:00:01:01"},
                            "data": {"ip": "10.1.1.1", "interface": "enp65s0"}},
             "hardware": {"cpu": {"cores_per_socket": 32, "threads_per_core": 2}, "memory_gb": 512,
                          "gpu": {"model": "H100 SXM", "count": 8, "nvswitch": True}}},
        ],
        "slurm": {"partitions": [{"name": "gpu", "nodes": ["@compute"], "default": True}]},
    }
    return yaml.safe_dump(data)


def median_time(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'nodes':>6} {'validate ms':>12} {'inventory ms':>13} {'plan ms':>9}")
    for n in args.nodes:
        text = manifest_text(n)
        loaded = load_text(text, "bench.yaml")
        m = loaded.manifest
        t_load = median_time(lambda text=text: load_text(text, "bench.yaml"), args.repeat)
        t_inv = median_time(lambda m=m: inventory.build(m, source="bench.yaml"), args.repeat)
        t_plan = median_time(lambda m=m: compute(m, State(), PLAYS), args.repeat)
        print(f"{len(m.nodes):>6} {t_load * 1000:>12.1f} {t_inv * 1000:>13.1f} {t_plan * 1000:>9.1f}")


if __name__ == "__main__":
    main()
