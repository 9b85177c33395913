"""The GPU area's verify checks: the GPUs and their driver, CUDA, NCCL, Docker's NVIDIA runtime."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from provisioner.areas.gpu import burn, dcgm
from provisioner.areas.gpu import decide as gpu
from provisioner.areas.gpu.rolevars import docker_nodes
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck import parsers
from provisioner.nodecheck.check import (
    Check,
    CheckList,
    Judge,
    NodeChecks,
    Outcome,
    Output,
    judged,
    run_first,
    stderr_hint,
)
from provisioner.nodecheck.parsers import ParseError

Interconnect = Literal["pcie", "nvlink", "nvswitch"]

# all_reduce_perf bus bandwidth floors, GB/s, for one node's GPUs (docs/verify.md):
# conservative against what healthy machines reach (PCIe 4.0 pairs ~20, NVLink bridges ~50+,
# HGX A100/H100 ~230/~450), so a pass means "not broken", not "fast".
BUSBW_FLOORS: dict[Interconnect, float] = {"pcie": 5.0, "nvlink": 20.0, "nvswitch": 150.0}
NCCL_SMOKE_GLOB = "/usr/local/share/provision/nccl-smoke/nccl-version-*"
ALL_REDUCE_GLOB = "/opt/nccl-tests/*/build/all_reduce_perf"
# the nccl role's MPI build (make MPI=1 BUILDDIR=build-mpi): one rank per node under srun --mpi=pmix
ALL_REDUCE_MPI_GLOB = "/opt/nccl-tests/*/build-mpi/all_reduce_perf"

DEVICE_QUERY = r"""#include <cstdio>
#include <cuda_runtime.h>
int main() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) { printf("error %s\n", cudaGetErrorString(e)); return 1; }
  printf("devices %d\n", n);
  return 0;
}
"""


def device_query_command() -> str:
    return ('d=$(mktemp -d) && trap \'rm -rf "$d"\' EXIT && printf %s ' + shlex.quote(DEVICE_QUERY)
            + ' > "$d/q.cu" && PATH=/usr/local/cuda/bin:$PATH nvcc -o "$d/q" "$d/q.cu" && "$d/q"')


# --------------------------------------------------------------------------- parsers
GPU_QUERY = "index,name,driver_version,persistence_mode,ecc.errors.uncorrected.volatile.total"


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    driver: str
    persistence: bool
    ecc_uncorrected: int | None  # None: the GPU has no ECC ([N/A])


def parse_gpu_query(text: str) -> list[GpuRow]:
    """``nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits``."""
    rows: list[GpuRow] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5:
            raise ParseError(f"expected 5 comma-separated fields, found {len(cells)}: {line.strip()!r}")
        index, name, driver, persistence, ecc = cells
        if not index.isdigit():
            raise ParseError(f"GPU index {index!r} is not a number: {line.strip()!r}")
        if persistence not in ("Enabled", "Disabled"):
            raise ParseError(f"persistence mode {persistence!r} is neither Enabled nor Disabled")
        ecc_count = int(ecc) if ecc.isdigit() else None
        rows.append(GpuRow(int(index), name, driver, persistence == "Enabled", ecc_count))
    return rows


XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")


def parse_xid(text: str) -> list[tuple[str, int]]:
    """(PCI address, Xid) of every ``NVRM: Xid`` line of the kernel log."""
    return [(m.group(1), int(m.group(2))) for m in XID_RE.finditer(text)]


def parse_device_query(text: str) -> int:
    """Our device query prints ``devices N`` (or ``error <CUDA's words>``)."""
    for line in text.splitlines():
        if line.startswith("error "):
            raise ParseError(f"CUDA: {line[6:].strip()}")
        m = re.fullmatch(r"devices (\d+)", line.strip())
        if m:
            return int(m.group(1))
    raise ParseError("no 'devices N' line")


def parse_nccl_version(text: str) -> str:
    """The nccl role's smoke program prints ``NCCL 2.21.5 ...``."""
    m = re.search(r"^NCCL (\d+\.\d+\.\d+)", text, re.MULTILINE)
    if not m:
        raise ParseError("no 'NCCL x.y.z' line")
    return m.group(1)


def parse_docker_runtimes(text: str) -> set[str]:
    """``docker info --format '{{json .Runtimes}}'``."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ParseError("not docker info's JSON runtimes") from None
    if not isinstance(data, dict):
        raise ParseError("docker info's runtimes are not an object")
    return set(data)


# --------------------------------------------------------------------------- verdicts
def model_matches(expected: str, reported: str) -> bool:
    """'RTX A6000' matches 'NVIDIA RTX A6000'; 'H100' matches 'NVIDIA H100 80GB HBM3'."""
    def words(s: str) -> list[str]:
        return [w for w in re.split(r"[^a-z0-9]+", s.lower()) if w and w not in ("nvidia", "geforce")]
    want, got = words(expected), words(reported)
    return all(w in got for w in want)


def gpu_verdicts(node: Node, branch: str) -> dict[str, Callable[[list[GpuRow]], Outcome]]:
    hw = node.hardware.gpu
    assert hw is not None

    def count(rows: list[GpuRow]) -> Outcome:
        if len(rows) != hw.count:
            return Outcome("FAIL", f"{len(rows)} GPUs seen, manifest says {hw.count}")
        return Outcome("PASS", f"{len(rows)} GPUs")

    def model(rows: list[GpuRow]) -> Outcome:
        bad = sorted({r.name for r in rows if not model_matches(hw.model, r.name)})
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        return Outcome("FAIL", f"{', '.join(bad)}, manifest says {hw.model}") if bad else Outcome("PASS", rows[0].name)

    def driver(rows: list[GpuRow]) -> Outcome:
        versions = sorted({r.driver for r in rows})
        bad = [v for v in versions if v.split(".")[0] != branch]
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        if bad:
            return Outcome("FAIL", f"driver {', '.join(bad)}, manifest branch {branch}")
        return Outcome("PASS", ", ".join(versions))

    def persistence(rows: list[GpuRow]) -> Outcome:
        off = [str(r.index) for r in rows if not r.persistence]
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        return Outcome("FAIL", f"persistence mode off on GPU {', '.join(off)}") if off else Outcome("PASS", "on")

    def ecc(rows: list[GpuRow]) -> Outcome:
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        with_ecc = [r for r in rows if r.ecc_uncorrected is not None]
        if not with_ecc:
            return Outcome("SKIP", "these GPUs have no ECC ([N/A])")
        bad = [f"GPU {r.index}: {r.ecc_uncorrected}" for r in with_ecc if r.ecc_uncorrected]
        return Outcome("FAIL", f"uncorrected ECC errors since boot: {'; '.join(bad)}") if bad else Outcome(
            "PASS", "0 uncorrected")

    return {"gpu.count": count, "gpu.model": model, "gpu.driver": driver, "gpu.persistence": persistence,
            "gpu.ecc": ecc}


def xid_verdict(found: list[tuple[str, int]]) -> Outcome:
    if found:
        shown = ", ".join(f"Xid {x} on {pci}" for pci, x in found[:5])
        return Outcome("FAIL", f"{len(found)} Xid errors since boot: {shown}")
    return Outcome("PASS", "none since boot")


def active_verdict(unit: str) -> Judge:
    def judge(out: Output) -> Outcome:
        if out.error:
            return Outcome("FAIL", out.error)
        state = out.stdout.strip() or "unknown"
        return Outcome("PASS", f"{unit} active") if state == "active" else Outcome("FAIL", f"{unit} {state}")
    return judge


def count_verdict(expected: int) -> Callable[[int], Outcome]:
    def verdict(n: int) -> Outcome:
        if n != expected:
            return Outcome("FAIL", f"CUDA sees {n} devices, manifest says {expected}")
        return Outcome("PASS", f"{n} devices")
    return verdict


def nccl_verdict(expected: str) -> Callable[[str], Outcome]:
    def verdict(version: str) -> Outcome:
        if version != expected:
            return Outcome("FAIL", f"NCCL {version}, manifest says {expected}")
        return Outcome("PASS", f"NCCL {version}")
    return verdict


def interconnect(node: Node) -> Interconnect:
    hw = node.hardware.gpu
    if hw is None:
        return "pcie"
    if gpu.has_nvswitch(hw.model, hw.count, hw.nvswitch):
        return "nvswitch"
    return "nvlink" if hw.nvlink else "pcie"


def busbw_floor(m: Manifest, node: Node) -> tuple[Interconnect, float]:
    kind = interconnect(node)
    return kind, m.verify.busbw_floor_gbps.get(kind, BUSBW_FLOORS[kind])


def allreduce_verdict(kind: str, floor: float) -> Callable[[parsers.AllReduce], Outcome]:
    def verdict(r: parsers.AllReduce) -> Outcome:
        if r.out_of_bounds:
            return Outcome("FAIL", f"{r.out_of_bounds} wrong results")
        if r.busbw_gbps < floor:
            return Outcome("FAIL", f"bus bandwidth {r.busbw_gbps:g} GB/s below the {kind} floor {floor:g} GB/s")
        return Outcome("PASS", f"{r.busbw_gbps:g} GB/s (floor {floor:g}, {kind})")
    return verdict


def runtime_verdict(want_nvidia: bool) -> Callable[[set[str]], Outcome]:
    def verdict(runtimes: set[str]) -> Outcome:
        if want_nvidia and "nvidia" not in runtimes:
            return Outcome("FAIL", f"no nvidia runtime (runtimes: {', '.join(sorted(runtimes))})")
        return Outcome("PASS", ", ".join(sorted(runtimes)))
    return verdict


def docker_run_verdict(expected: int) -> Judge:
    def judge(out: Output) -> Outcome:
        if out.error:
            return Outcome("FAIL", out.error)
        gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
        if out.rc != 0 or len(gpus) != expected:
            return Outcome("FAIL", f"container saw {len(gpus)} GPUs, manifest says {expected}{stderr_hint(out)}")
        return Outcome("PASS", f"{len(gpus)} GPUs in a container")
    return judge


def gpu_checks(m: Manifest, node: Node, out: CheckList) -> None:
    """The checks of a node's GPUs (``hardware.gpu``): nvidia-smi's view, the kernel log,
    the fabric manager on NVSwitch nodes, CUDA, NCCL."""
    hw = node.hardware.gpu
    if hw is None:
        return
    t = m.verify.command_timeout
    query = f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits"
    for check, verdict in gpu_verdicts(node, m.software.nvidia_driver.branch).items():
        out.add(check, query, judged(parse_gpu_query, verdict), "gpu")
    out.add("gpu.xid", "journalctl -k -b 0 --no-pager -o cat | grep 'NVRM: Xid' | tail -n 50; true",
            judged(parse_xid, xid_verdict), "kernel")
    if gpu.has_nvswitch(hw.model, hw.count, hw.nvswitch):
        out.add("fabricmanager", "systemctl is-active nvidia-fabricmanager", active_verdict("nvidia-fabricmanager"),
                "gpu")
    out.add("cuda", device_query_command(), judged(parse_device_query, count_verdict(hw.count)), "gpu",
            timeout=max(t, 180))
    version = gpu.nccl_base_version(m.software.nccl.version)
    out.add("nccl.version", run_first(NCCL_SMOKE_GLOB), judged(parse_nccl_version, nccl_verdict(version)),
            "gpu")
    dcgm_check(m, out)
    if m.verify.burn_in_s:
        out.add("gpu.burn", burn.burn_command(m.verify.burn_in_s),
                judged(burn.parse_burn, burn.burn_verdict(hw.count, m.verify.burn_in_s, m.verify.burn_in_max_temp_c)),
                "gpu", timeout=max(t, m.verify.burn_in_s + burn.BUILD_S))
    if hw.count >= 2:
        kind, floor = busbw_floor(m, node)
        out.add("nccl.all_reduce", run_first(ALL_REDUCE_GLOB, f"-b 8 -e 256M -f 2 -g {hw.count}"),
                judged(parsers.parse_all_reduce, allreduce_verdict(kind, floor)), "gpu", timeout=max(t, 300))


def dcgm_check(m: Manifest, out: CheckList) -> None:
    """``dcgmi diag`` at the manifest's level (SKIP where DCGM or a GPU device is missing)."""
    level = m.verify.dcgm_level
    out.add("gpu.dcgm", dcgm.diag_command(level), dcgm.diag_judge(level), "gpu",
            timeout=dcgm.bound(level, m.verify.command_timeout))


def gated_compute(m: Manifest, node: Node) -> bool:
    """A compute node the acceptance gate diagnoses though the manifest gives it no GPUs:
    the gate names gpu.dcgm, so every node it gates runs it (one without a GPU says SKIP)."""
    return m.slurm.enabled and "gpu.dcgm" in m.verify.gate and node.has_role("compute")


def docker_checks(m: Manifest, node: Node, out: CheckList) -> None:
    """Docker's runtimes on a docker.nodes node; on a GPU node, a container that sees its GPUs."""
    hw = node.hardware.gpu
    want_nvidia = m.docker.nvidia_runtime and hw is not None
    out.add("docker.runtime", "docker info --format '{{json .Runtimes}}'",
            judged(parse_docker_runtimes, runtime_verdict(want_nvidia)))
    if not want_nvidia or hw is None:
        return
    if m.verify.docker_image:
        image = shlex.quote(m.verify.docker_image)
        out.add("docker.gpu_run", f"docker run --rm --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all {image} "
                "nvidia-smi -L", docker_run_verdict(hw.count), "gpu", timeout=max(m.verify.command_timeout, 120))
    else:
        out.skip("docker.gpu_run", "no verify.docker_image in the manifest (an image present on the nodes)")


def checks(m: Manifest) -> NodeChecks:
    docker = set(docker_nodes(m))

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        gpu_checks(m, node, out)
        if node.hardware.gpu is None and gated_compute(m, node):
            dcgm_check(m, out)
        if node.name in docker:
            docker_checks(m, node, out)
        return out.checks

    return node_checks
