"""Which checks apply to which node, the command each runs and how its output is judged.

Pure: from the manifest only (docs/verify.md lists every check). A check is listed only
where the manifest says it applies (GPU checks on GPU nodes, a mount's checks on the nodes
that mount it, ...). Whether it can run there is decided per node from the context probe
(:func:`skip_reason`): kernel-bound checks in a container and GPU checks without a GPU
device say SKIP and why; they never say PASS.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from provisioner.areas.gpu import decide as gpu
from provisioner.areas.gpu.rolevars import docker_nodes
from provisioner.areas.slurm import decide as slurm
from provisioner.areas.storage import decide as storage
from provisioner.manifest.model import Manifest, Node
from provisioner.verify import parsers
from provisioner.verify.parsers import NodeContext, ParseError

Status = Literal["PASS", "FAIL", "SKIP"]
Needs = Literal["", "kernel", "gpu"]
Interconnect = Literal["pcie", "nvlink", "nvswitch"]
Fabric = Literal["rdma", "ethernet"]

# all_reduce_perf bus bandwidth floors, GB/s, for one node's GPUs (docs/verify.md):
# conservative against what healthy machines reach (PCIe 4.0 pairs ~20, NVLink bridges ~50+,
# HGX A100/H100 ~230/~450), so a pass means "not broken", not "fast".
BUSBW_FLOORS: dict[Interconnect, float] = {"pcie": 5.0, "nvlink": 20.0, "nvswitch": 150.0}
GOOD_SLURM_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
BAD_SLURM_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED", "DOWN", "NOT_RESPONDING", "FAIL", "FAILING",
                             "INVALID", "INVALID_REG", "MAINTENANCE", "REBOOT_REQUESTED", "UNKNOWN"})
BURN_BUILD_S = 240  # the burn-in check's bound beyond its seconds: nvcc, the first run, the CPU's sample
NCCL_SMOKE_GLOB = "/usr/local/share/provision/nccl-smoke/nccl-version-*"
ALL_REDUCE_GLOB = "/opt/nccl-tests/*/build/all_reduce_perf"
# the nccl role's MPI build (make MPI=1 BUILDDIR=build-mpi): one rank per node under srun --mpi=pmix
ALL_REDUCE_MPI_GLOB = "/opt/nccl-tests/*/build-mpi/all_reduce_perf"
# all_reduce_perf bus bandwidth floors, GB/s, between two nodes (one rank each, all their GPUs):
# NCCL over InfiniBand/RoCE (rdma) or over TCP sockets (ethernet). Conservative against healthy
# links (HDR/NDR ports ~20-45 GB/s, 25-100 GbE sockets ~2-10): "not broken", not "fast".
MULTI_NODE_FLOORS: dict[Fabric, float] = {"rdma": 5.0, "ethernet": 0.5}
MULTI_NODE_WAIT_S = 60  # how long the two-node job waits for its GPUs (srun --immediate)
# the generated NFS options the kernel shows in the mount table (findmnt)
SHOWN_NFS_OPTIONS = frozenset({"vers", "proto", "port", "nconnect", "rsize", "wsize", "hard", "soft"})
# The client asks for these; the kernel settles them with the server (knfsd's largest block
# size follows its memory) and the transport (NFS/RDMA caps them): less than asked is normal.
NEGOTIATED_NFS_OPTIONS = frozenset({"rsize", "wsize"})
IO_MB = 64  # the short write/read on a shared mount
FENCE_WAIT_S = 30  # how long the fencing job waits for a free GPU (srun --immediate)
WRITE_BW_PORT = 18515  # ib_write_bw's own default, named: the server side waits until it listens there
WRITE_BW_LISTEN_S = 20  # how long the server side may take to open its device and listen
# what both sides of rdma.write_bw pass (they must agree on the port and the duration)
WRITE_BW_ARGS = f"--report_gbits -D 3 -p {WRITE_BW_PORT}"
# perftest times its run by the CPU's cycle counter, calibrated against the clock at start;
# where the samples do not line up (r^2 < 0.9: a node starved of CPU, a VM under emulation)
# it measured nothing and says so. The pair is measured again, once.
WRITE_BW_CALIBRATION_FAILED = "Can't produce a report"


@dataclass(frozen=True)
class Outcome:
    status: Status
    detail: str = ""


@dataclass(frozen=True)
class Output:
    """What a command left: its exit status and text, or ``error`` when it did not run to
    its end (unreachable node, timeout)."""

    rc: int = 0
    stdout: str = ""
    stderr: str = ""
    error: str = ""


@dataclass(frozen=True)
class Command:
    host: str  # the node it runs on (the node checked, or the Slurm controller)
    text: str  # a shell command line
    timeout: int
    # started in the background on another node first (the server of a pair test)
    setup: tuple[str, str] | None = None
    # a pair test whose output says this is measured again, once, server and client: the
    # tool's own failure to measure (not a verdict on the node)
    again_if: str | None = None


Judge = Callable[[Output], Outcome]


@dataclass(frozen=True)
class Check:
    node: str
    name: str
    command: Command | None  # None: decided without running anything (``skip`` says why)
    judge: Judge
    needs: Needs = ""
    skip: str = ""  # a static SKIP: the check applies but cannot run (no peer, no image)


def skip_reason(check: Check, ctx: NodeContext) -> str:
    """Why ``check`` cannot run on its node ("" when it can)."""
    if check.skip:
        return check.skip
    if check.needs == "kernel" and ctx.container:
        return f"no kernel access ({ctx.container} container)"
    if check.needs == "gpu" and ctx.container and ctx.gpu_devices == 0:
        return f"no GPU device in this {ctx.container} container"
    return ""


def judged(parse: Callable[[str], object], verdict: Callable[..., Outcome]) -> Judge:
    """A judge that parses stdout first: a failed command or unreadable output fails."""

    def judge(out: Output) -> Outcome:
        if out.error:
            return Outcome("FAIL", out.error)
        try:
            value = parse(out.stdout)
        except ParseError as exc:
            return Outcome("FAIL", f"{exc}{_stderr_hint(out)}")
        return verdict(value)

    return judge


def _stderr_hint(out: Output) -> str:
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    if lines:
        return f" ({lines[-1][:200]})"
    return f" (exit {out.rc})" if out.rc else ""


def _not_judged(_: Output) -> Outcome:  # a static SKIP never runs its judge
    return Outcome("SKIP", "not run")


# --------------------------------------------------------------------------- verdicts
def hosts_verdict(m: Manifest) -> Callable[[parsers.HostsFile], Outcome]:
    def verdict(hosts: parsers.HostsFile) -> Outcome:
        wrong = []
        for node in m.nodes:
            want = str(node.ip)
            for name in (node.name, f"{node.name}.{m.fqdn_suffix}"):
                if want not in hosts.names.get(name, set()):
                    wrong.append(name)
        if wrong:
            return Outcome("FAIL", f"/etc/hosts lacks {', '.join(wrong[:5])}" + (" ..." if len(wrong) > 5 else ""))
        return Outcome("PASS", f"{len(m.nodes)} nodes")
    return verdict


def clock_verdict(limit_ms: float) -> Callable[[parsers.Tracking], Outcome]:
    def verdict(t: parsers.Tracking) -> Outcome:
        ms = t.offset_s * 1000
        if not t.synchronised:
            return Outcome("FAIL", f"chrony not synchronised (offset {ms:+.1f} ms)")
        if abs(ms) > limit_ms:
            return Outcome("FAIL", f"offset {ms:+.1f} ms, limit {limit_ms:g} ms")
        return Outcome("PASS", f"offset {ms:+.3f} ms")
    return verdict


def model_matches(expected: str, reported: str) -> bool:
    """'RTX A6000' matches 'NVIDIA RTX A6000'; 'H100' matches 'NVIDIA H100 80GB HBM3'."""
    def words(s: str) -> list[str]:
        return [w for w in re.split(r"[^a-z0-9]+", s.lower()) if w and w not in ("nvidia", "geforce")]
    want, got = words(expected), words(reported)
    return all(w in got for w in want)


def gpu_verdicts(node: Node, branch: str) -> dict[str, Callable[[list[parsers.GpuRow]], Outcome]]:
    hw = node.hardware.gpu
    assert hw is not None

    def count(rows: list[parsers.GpuRow]) -> Outcome:
        if len(rows) != hw.count:
            return Outcome("FAIL", f"{len(rows)} GPUs seen, manifest says {hw.count}")
        return Outcome("PASS", f"{len(rows)} GPUs")

    def model(rows: list[parsers.GpuRow]) -> Outcome:
        bad = sorted({r.name for r in rows if not model_matches(hw.model, r.name)})
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        return Outcome("FAIL", f"{', '.join(bad)}, manifest says {hw.model}") if bad else Outcome("PASS", rows[0].name)

    def driver(rows: list[parsers.GpuRow]) -> Outcome:
        versions = sorted({r.driver for r in rows})
        bad = [v for v in versions if v.split(".")[0] != branch]
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        if bad:
            return Outcome("FAIL", f"driver {', '.join(bad)}, manifest branch {branch}")
        return Outcome("PASS", ", ".join(versions))

    def persistence(rows: list[parsers.GpuRow]) -> Outcome:
        off = [str(r.index) for r in rows if not r.persistence]
        if not rows:
            return Outcome("FAIL", "no GPU seen")
        return Outcome("FAIL", f"persistence mode off on GPU {', '.join(off)}") if off else Outcome("PASS", "on")

    def ecc(rows: list[parsers.GpuRow]) -> Outcome:
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


def burn_verdict(expected: int, seconds: int, max_temp_c: int) -> Callable[[list[parsers.BurnGpu]], Outcome]:
    """Every GPU ran its ``seconds`` with no wrong result, no fault slowdown (thermal, HW
    slowdown, power brake) and under ``max_temp_c``."""
    def verdict(rows: list[parsers.BurnGpu]) -> Outcome:
        if len(rows) != expected:
            return Outcome("FAIL", f"{len(rows)} GPUs ran, manifest says {expected}")
        bad: list[str] = []
        for r in rows:
            what = (f"could not run: {r.error}" if r.error
                    else f"{r.errors} wrong results" if r.errors
                    else f"{r.cpu_mismatch} results differ from the CPU's" if r.cpu_mismatch
                    else f"slowed down ({', '.join(r.slowdown)})" if r.slowdown
                    else f"reached {r.max_temp_c} C (limit {max_temp_c})" if r.max_temp_c >= max_temp_c
                    else f"stopped after {r.seconds:g} s of {seconds}" if r.seconds < seconds * 0.9
                    else "")
            if what:
                bad.append(f"GPU {r.index} {what}")
        if bad:
            return Outcome("FAIL", "; ".join(bad))
        temps = [r.max_temp_c for r in rows if r.watched]
        watch = f", max {max(temps)} C" if temps else ", temperatures not watched (no NVML)"
        gflops = min(r.gflops for r in rows)
        return Outcome("PASS", f"{len(rows)} GPUs, {seconds} s, 0 errors, >= {gflops:g} GFLOP/s each{watch}")
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


def multi_node_verdict(pair: str, fabric: Fabric, floor: float) -> Judge:
    """all_reduce_perf across ``pair`` through srun: a job that cannot start at once (GPUs
    held by jobs) is not checked; any other refusal or failure fails."""
    summary = judged(parsers.parse_all_reduce, allreduce_verdict(f"{fabric} between {pair}", floor))

    def judge(out: Output) -> Outcome:
        busy = f"the GPUs of {pair} were not free within {MULTI_NODE_WAIT_S} s (jobs hold them)"
        return srun_refusal(out, busy, "the two-node job") or summary(out)
    return judge


def multi_node_floor(m: Manifest, a: Node, b: Node) -> tuple[Fabric, float]:
    """NCCL between ``a`` and ``b`` goes over RDMA where both sit on an InfiniBand network
    with rdma: true, else over TCP sockets."""
    both = "infiniband" in a.interfaces and "infiniband" in b.interfaces
    fabric: Fabric = "rdma" if storage.rdma_fabric(m) and both else "ethernet"
    return fabric, m.verify.multi_node_busbw_floor_gbps.get(fabric, MULTI_NODE_FLOORS[fabric])


def multi_node_command(a: str, b: str, gpus: int) -> str:
    """One rank per node, each driving ``gpus`` GPUs, started by Slurm's PMIx (the MPI build
    of all_reduce_perf)."""
    return (f"srun -w {shlex.quote(a)},{shlex.quote(b)} -N 2 --ntasks-per-node=1 --gres=gpu:{gpus} --mpi=pmix "
            f"-t 5 --immediate={MULTI_NODE_WAIT_S} " + run_first(ALL_REDUCE_MPI_GLOB, f"-b 8 -e 256M -f 2 -g {gpus}"))


def write_bw_verdict(fraction: float) -> Callable[[parsers.WriteBw], Outcome]:
    def verdict(w: parsers.WriteBw) -> Outcome:
        floor = w.link_gbps * fraction
        if w.average_gbps < floor:
            return Outcome("FAIL", f"{w.average_gbps:g} Gb/s, below {fraction:g} of the {w.link_gbps:g} Gb/s link")
        return Outcome("PASS", f"{w.average_gbps:g} Gb/s of {w.link_gbps:g} Gb/s")
    return verdict


def ping_verdict(mtu: int, peer: str) -> Callable[[parsers.Ping], Outcome]:
    def verdict(p: parsers.Ping) -> Outcome:
        if p.too_big:
            return Outcome("FAIL", f"MTU {mtu} does not pass to {peer} unfragmented (a smaller MTU on the path)")
        if p.received == 0:
            return Outcome("FAIL", f"no answer from {peer} at MTU {mtu}")
        return Outcome("PASS", f"MTU {mtu} to {peer}: {p.received}/{p.sent} answered")
    return verdict


def mount_verdict(fstypes: tuple[str, ...], options: list[str], path: str) -> Callable[[parsers.Mount | None], Outcome]:
    def verdict(mnt: parsers.Mount | None) -> Outcome:
        if mnt is None:
            return Outcome("FAIL", f"{path} is not mounted")
        if mnt.fstype not in fstypes:
            return Outcome("FAIL", f"{path} is {mnt.fstype} from {mnt.source}, expected {'/'.join(fstypes)}")
        missing, settled = [], []
        live = dict(o.split("=", 1) for o in mnt.options if "=" in o)
        for want in options:
            key, _, value = want.partition("=")
            if want in mnt.options:
                continue
            if key in NEGOTIATED_NFS_OPTIONS and live.get(key, "").isdigit() and value.isdigit() \
                    and 0 < int(live[key]) < int(value):
                settled.append(f"{key}={live[key]}")
                continue
            missing.append(want)
        if missing:
            return Outcome("FAIL", f"{path} lacks {', '.join(missing)}")
        note = f" ({', '.join(settled)}: the most the server and transport offer)" if settled else ""
        return Outcome("PASS", f"{mnt.fstype} from {mnt.source}{note}")
    return verdict


def io_verdict(path: str) -> Callable[[parsers.DdRun], Outcome]:
    def verdict(r: parsers.DdRun) -> Outcome:
        if not r.write_ok:
            return Outcome("FAIL", f"cannot write {IO_MB} MiB under {path}")
        if not r.read_ok:
            return Outcome("FAIL", f"cannot read back {IO_MB} MiB under {path}")
        return Outcome("PASS", f"write {r.write_rate or '?'}, read {r.read_rate or '?'}")
    return verdict


def pool_verdict(pool: str) -> Callable[[parsers.PoolStatus], Outcome]:
    def verdict(s: parsers.PoolStatus) -> Outcome:
        problems = []
        if s.state != "ONLINE":
            problems.append(f"state {s.state}")
        if s.device_errors:
            problems.append(f"{s.device_errors} device error counters not 0")
        if s.scan_errors:
            problems.append(f"last scan: {s.scan_errors} errors")
        if s.data_errors:
            problems.append("data errors")
        if problems:
            return Outcome("FAIL", f"{pool}: {', '.join(problems)}")
        return Outcome("PASS", f"{pool} ONLINE" + (f"; {s.scan}" if s.scan else ""))
    return verdict


def slurm_verdict(expected_gres: str, drained_by: str = "") -> Callable[[parsers.SlurmNode], Outcome]:
    """``drained_by``: a drain whose reason starts with it is expected (``apply --rolling``
    verifies a node it drained itself before resuming it); any other drain, and every other
    bad flag, still fails."""
    def verdict(n: parsers.SlurmNode) -> Outcome:
        flags = set(n.state.split("+"))
        base = n.state.split("+")[0]
        ours = bool(drained_by) and n.reason.startswith(drained_by)
        bad = sorted(flags & BAD_SLURM_FLAGS - ({"DRAIN"} if ours else set()))
        if bad or base not in GOOD_SLURM_STATES:
            why = f" ({n.reason})" if n.reason else ""
            return Outcome("FAIL", f"state {n.state}{why}")
        if expected_gres and expected_gres not in n.gres.split(","):
            return Outcome("FAIL", f"Gres {n.gres}, manifest says {expected_gres}")
        note = f" ({drained_by}: resumed after verify)" if ours and "DRAIN" in flags else ""
        return Outcome("PASS", f"{n.state}{note}" + (f", {n.gres}" if expected_gres else ""))
    return verdict


def srun_refusal(out: Output, busy: str, job: str) -> Outcome | None:
    """The outcome of an ``srun --immediate`` job that did not run to its end (None when it
    did): refused at once because its GPUs are held (``busy``: SKIP), or any other failure."""
    if out.error:
        return Outcome("FAIL", out.error)
    if out.rc != 0 and "Immediate execution impossible" in out.stdout + out.stderr:
        return Outcome("SKIP", busy)
    if out.rc != 0:
        return Outcome("FAIL", f"{job} did not run{_stderr_hint(out)}")
    return None


def fenced_verdict(node: str, total: int) -> Judge:
    """A one-GPU job on ``node`` (``nvidia-smi -L`` under ``srun --gres=gpu:1``) must see
    exactly one of its ``total`` GPUs; a node with every GPU taken is not checked."""
    def judge(out: Output) -> Outcome:
        refused = srun_refusal(out, f"no GPU of {node} was free within {FENCE_WAIT_S} s (jobs hold them)", "the job")
        if refused is not None:
            return refused
        seen = len(re.findall(r"^GPU \d+:", out.stdout, re.M))
        if seen == 1:
            return Outcome("PASS", f"a --gres=gpu:1 job sees 1 of {total} GPUs")
        if seen == 0:
            return Outcome("FAIL", "a --gres=gpu:1 job sees no GPU")
        return Outcome("FAIL", f"a --gres=gpu:1 job sees {seen} of {total} GPUs: devices are not fenced "
                               "(cgroup.conf ConstrainDevices)")
    return judge


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
            return Outcome("FAIL", f"container saw {len(gpus)} GPUs, manifest says {expected}{_stderr_hint(out)}")
        return Outcome("PASS", f"{len(gpus)} GPUs in a container")
    return judge


# --------------------------------------------------------------------------- commands
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


def burn_command(seconds: int) -> str:
    """Build the burn-in program (gpu_burn.cu, beside this module) with the node's nvcc, run it."""
    source = (resources.files("provisioner.verify") / "gpu_burn.cu").read_text()
    return ('d=$(mktemp -d) && trap \'rm -rf "$d"\' EXIT && printf %s ' + shlex.quote(source)
            + ' > "$d/burn.cu" && PATH=/usr/local/cuda/bin:$PATH nvcc -O2 -o "$d/burn" "$d/burn.cu" && '
            + f'"$d/burn" {int(seconds)}')


def first_of(glob: str) -> str:
    """A shell line that runs the first executable matching ``glob`` (exit 127 when none)."""
    return f'for f in {glob}; do [ -x "$f" ] && exec "$f" "$@"; done; echo "nothing matches {glob}" >&2; exit 127'


def run_first(glob: str, args: str = "") -> str:
    return f"sh -c {shlex.quote(first_of(glob))} sh {args}".rstrip()


def io_command(path: str, node: str) -> str:
    f = shlex.quote(f"{path.rstrip('/')}/.provision-verify-{node}")
    return (f"dd if=/dev/zero of={f} bs=1M count={IO_MB} conv=fsync 2>&1; echo \"write rc=$?\"; "
            f"dd if={f} of=/dev/null bs=1M 2>&1; echo \"read rc=$?\"; rm -f {f}")


@dataclass(frozen=True)
class ClusterFacts:
    """What every node's checks share, decided once per plan (each reads every node)."""

    unfenced: str  # see unfenced_cluster
    rings: dict[str, list[Node]]  # per network, its nodes in manifest order; GPU_RING: Slurm's GPU nodes
    positions: dict[str, dict[str, int]]  # per ring, node name -> index in it


GPU_RING = "slurm-gpu"  # the ring of the multi-node NCCL check: Slurm compute nodes with GPUs


def cluster_facts(m: Manifest) -> ClusterFacts:
    rings = {net: [n for n in m.nodes if net in n.interfaces] for net in ("management", "data", "infiniband")}
    rings[GPU_RING] = [n for n in slurm.slurm_nodes(m) if n.hardware.gpu is not None] if m.slurm.enabled else []
    positions = {net: {n.name: i for i, n in enumerate(ring)} for net, ring in rings.items()}
    return ClusterFacts(unfenced_cluster(m), rings, positions)


def write_bw_server(wait_s: int = WRITE_BW_LISTEN_S) -> str:
    """The peer side of rdma.write_bw: start an ib_write_bw server that waits for one client
    (90 s at most) and return once it listens on WRITE_BW_PORT, so the client never races its start
    (opening a device takes seconds on a loaded node). A server that exits or does not listen
    within ``wait_s`` fails the setup with its own output (and is stopped)."""
    port = WRITE_BW_PORT
    return (f"log=$(mktemp); nohup timeout 90 ib_write_bw {WRITE_BW_ARGS} >\"$log\" 2>&1 </dev/null & "
            f"pid=$!; i=0; while [ $i -lt {wait_s * 2} ]; do "
            f"if ss -Hltn 'sport = :{port}' | grep -q .; then rm -f \"$log\"; exit 0; fi; "
            "kill -0 $pid 2>/dev/null || break; sleep 0.5; i=$((i + 1)); done; "
            f"echo \"ib_write_bw server not listening on port {port} after {wait_s} s or exited: "
            "$(cat \"$log\")\" >&2; "
            "kill $pid 2>/dev/null; rm -f \"$log\"; exit 1")


def _peer(facts: ClusterFacts, node: Node, net: str) -> Node | None:
    """The next node in manifest order with an interface on ``net`` (a ring; or GPU_RING)."""
    on = facts.rings[net]
    i = facts.positions[net].get(node.name)
    if len(on) < 2 or i is None:
        return None
    return on[(i + 1) % len(on)]


def unfenced_cluster(m: Manifest) -> str:
    """Why this cluster's Slurm does not fence GPU devices at all ("" when it does); the same
    for every node, so :func:`cluster_facts` decides it once (it looks at every slurmd node)."""
    if slurm.cgroup_plan(m).constrain_devices:
        return ""
    if not slurm.cgroups_usable(m):
        return "this cluster's Slurm cannot fence devices (a slurmd node's Slurm has no cgroup v2; validate warns)"
    return "slurm.constrain_devices is off in the manifest"


def fencing_skip(gpus: int, drained_by: str, unfenced: str) -> str:
    """Why the GPU fencing job is not run on a node ("" when it is); ``unfenced``: see
    :func:`unfenced_cluster`."""
    if gpus < 2:
        return "one GPU: nothing to fence a job from"
    if drained_by:
        return f"drained by {drained_by}: no job starts there until it is resumed"
    return unfenced


def checks_for(m: Manifest, node: Node, drained_by: str, facts: ClusterFacts) -> list[Check]:
    """Every check that applies to ``node``, in table order (``drained_by``: see slurm_verdict;
    ``facts``: :func:`cluster_facts` of ``m``)."""
    t = m.verify.command_timeout
    name = node.name
    out: list[Check] = []

    def add(check: str, text: str, judge: Judge, needs: Needs = "", host: str | None = None,
            setup: tuple[str, str] | None = None, timeout: int | None = None, again_if: str | None = None) -> None:
        out.append(Check(name, check, Command(host or name, text, timeout or t, setup, again_if), judge, needs))

    def static_skip(check: str, why: str) -> None:
        out.append(Check(name, check, None, _not_judged, skip=why))

    add("hosts", "cat /etc/hosts", judged(parsers.parse_hosts, hosts_verdict(m)))
    add("clock", "chronyc -n tracking", judged(parsers.parse_chrony_tracking, clock_verdict(m.verify.clock_offset_ms)))

    hw = node.hardware.gpu
    if hw is not None:
        query = f"nvidia-smi --query-gpu={parsers.GPU_QUERY} --format=csv,noheader,nounits"
        for check, verdict in gpu_verdicts(node, m.software.nvidia_driver.branch).items():
            add(check, query, judged(parsers.parse_gpu_query, verdict), "gpu")
        add("gpu.xid", "journalctl -k -b 0 --no-pager -o cat | grep 'NVRM: Xid' | tail -n 50; true",
            judged(parsers.parse_xid, xid_verdict), "kernel")
        if gpu.has_nvswitch(hw.model, hw.count, hw.nvswitch):
            add("fabricmanager", "systemctl is-active nvidia-fabricmanager", active_verdict("nvidia-fabricmanager"),
                "gpu")
        add("cuda", device_query_command(), judged(parsers.parse_device_query, count_verdict(hw.count)), "gpu",
            timeout=max(t, 180))
        version = gpu.nccl_base_version(m.software.nccl.version)
        add("nccl.version", run_first(NCCL_SMOKE_GLOB), judged(parsers.parse_nccl_version, nccl_verdict(version)),
            "gpu")
        if m.verify.burn_in_s:
            add("gpu.burn", burn_command(m.verify.burn_in_s),
                judged(parsers.parse_burn, burn_verdict(hw.count, m.verify.burn_in_s, m.verify.burn_in_max_temp_c)),
                "gpu", timeout=max(t, m.verify.burn_in_s + BURN_BUILD_S))
        if hw.count >= 2:
            kind, floor = busbw_floor(m, node)
            add("nccl.all_reduce", run_first(ALL_REDUCE_GLOB, f"-b 8 -e 256M -f 2 -g {hw.count}"),
                judged(parsers.parse_all_reduce, allreduce_verdict(kind, floor)), "gpu", timeout=max(t, 300))

    for net in ("management", "data", "infiniband"):
        network = getattr(m.networks, net)
        if network is None or net not in node.interfaces:
            continue
        peer = _peer(facts, node, net)
        check = f"mtu.{net}"
        if peer is None:
            static_skip(check, f"no other node on the {net} network")
            continue
        peer_ip = str(peer.interfaces[net].ip)
        add(check, f"ping -M do -s {network.mtu - 28} -c 3 -i 0.2 -W 2 {peer_ip} 2>&1",
            judged(parsers.parse_ping, ping_verdict(network.mtu, peer.name)), "kernel")

    ib = m.networks.infiniband
    if ib is not None and ib.rdma and "infiniband" in node.interfaces:
        peer = _peer(facts, node, "infiniband")
        if peer is None:
            static_skip("rdma.write_bw", "no other node on the infiniband network")
        else:
            # one try: the server listens already (its setup waited for that) and serves one
            # client, so a failed try leaves nothing to try again against
            client = ("for r in /sys/class/infiniband/*/ports/1/rate; do echo \"rate=$(cat \"$r\")\"; break; done; "
                      f"ib_write_bw {WRITE_BW_ARGS} {peer.interfaces['infiniband'].ip}")
            bw = write_bw_verdict(m.verify.ib_write_bw_fraction)
            add("rdma.write_bw", client, judged(parsers.parse_write_bw, bw), "kernel",
                setup=(peer.name, write_bw_server()), again_if=WRITE_BW_CALIBRATION_FAILED)

    for mount in storage.mounts_for(m, node):
        proto = storage.mount_proto(m, mount, node)
        want = [o for o in storage.mount_options(mount, proto) if o.split("=")[0] in SHOWN_NFS_OPTIONS]
        fstypes = ("nfs",) if mount.vers == "3" else ("nfs4",)
        add(f"mount:{mount.path}", f"findmnt -J -o SOURCE,FSTYPE,OPTIONS --mountpoint {shlex.quote(mount.path)}; true",
            judged(parsers.parse_findmnt, mount_verdict(fstypes, want, mount.path)), "kernel")
        add(f"io:{mount.path}", io_command(mount.path, name), judged(parsers.parse_io, io_verdict(mount.path)),
            "kernel")
    for union in storage.unions_for(m, node):
        add(f"mount:{union.path}", f"findmnt -J -o SOURCE,FSTYPE,OPTIONS --mountpoint {shlex.quote(union.path)}; true",
            judged(parsers.parse_findmnt, mount_verdict(("fuse.mergerfs",), [], union.path)), "kernel")
        add(f"io:{union.path}", io_command(union.path, name), judged(parsers.parse_io, io_verdict(union.path)),
            "kernel")

    for pool in m.zfs.pools:
        if pool.node == name:
            add(f"zfs:{pool.name}", f"zpool status -v {shlex.quote(pool.name)}",
                judged(parsers.parse_zpool_status, pool_verdict(pool.name)), "kernel")

    if m.slurm.enabled and node.has_role("compute"):
        gres = f"gpu:{hw.gres_type}:{hw.count}" if hw is not None else ""
        add("slurm.node", f"scontrol show node {shlex.quote(name)} --oneliner",
            judged(parsers.parse_scontrol_node, slurm_verdict(gres, drained_by)), host=m.head.name)
        if hw is not None:
            why = fencing_skip(hw.count, drained_by, facts.unfenced)
            if why:
                static_skip("slurm.gpu_fence", why)
            else:
                add("slurm.gpu_fence", f"srun -w {shlex.quote(name)} -N 1 -n 1 --gres=gpu:1 -t 2 "
                    f"--immediate={FENCE_WAIT_S} nvidia-smi -L", fenced_verdict(name, hw.count), "gpu",
                    host=m.head.name, timeout=max(t, FENCE_WAIT_S + 60))
            gpu_peer = _peer(facts, node, GPU_RING)
            if gpu_peer is None:
                static_skip("nccl.multi_node", "no other GPU compute node to pair with")
            elif drained_by:
                static_skip("nccl.multi_node", f"drained by {drained_by}: no job starts there until it is resumed")
            else:
                assert gpu_peer.hardware.gpu is not None
                gpus = min(hw.count, gpu_peer.hardware.gpu.count)
                fabric, floor = multi_node_floor(m, node, gpu_peer)
                add("nccl.multi_node", multi_node_command(name, gpu_peer.name, gpus),
                    multi_node_verdict(f"{name} and {gpu_peer.name}", fabric, floor), "gpu", host=m.head.name,
                    timeout=max(t, MULTI_NODE_WAIT_S + 360))

    if name in docker_nodes(m):
        want_nvidia = m.docker.nvidia_runtime and hw is not None
        add("docker.runtime", "docker info --format '{{json .Runtimes}}'",
            judged(parsers.parse_docker_runtimes, runtime_verdict(want_nvidia)))
        if want_nvidia and hw is not None:
            if m.docker.nvidia_runtime and m.verify.docker_image:
                image = shlex.quote(m.verify.docker_image)
                add("docker.gpu_run", f"docker run --rm --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=all {image} "
                    "nvidia-smi -L", docker_run_verdict(hw.count), "gpu", timeout=max(t, 120))
            else:
                static_skip("docker.gpu_run", "no verify.docker_image in the manifest (an image present on the nodes)")
    return out


def plan(m: Manifest, names: list[str] | None = None, drained_by: str = "") -> list[Check]:
    """The checks of ``names`` (every node when None), node by node in manifest order;
    ``drained_by``: a Slurm drain with a reason starting so is expected (slurm_verdict)."""
    facts = cluster_facts(m)
    return [c for node in m.nodes if names is None or node.name in names
            for c in checks_for(m, node, drained_by, facts)]
