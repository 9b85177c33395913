"""Pure parsers of the commands `provision verify` runs on the nodes.

Each takes a command's text output and returns plain data; a text it cannot read raises
:class:`ParseError` with what was expected, which the check reports as a failure (a check
never passes on output it did not understand).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field


class ParseError(ValueError):
    """The output is not what the command prints."""


# --------------------------------------------------------------------------- context
@dataclass(frozen=True)
class NodeContext:
    """What a node is, from the context probe: a container (no kernel access), GPU devices."""

    container: str = ""  # systemd-detect-virt --container: "" on bare metal or a VM
    gpu_devices: int = 0  # /dev/nvidia<N> device files


CONTEXT_COMMAND = ("printf 'container=%s\\n' \"$(systemd-detect-virt --container 2>/dev/null || true)\"; "
                   "printf 'gpu_devices=%s\\n' \"$(ls /dev 2>/dev/null | grep -cE '^nvidia[0-9]+$')\"")


def parse_context(text: str) -> NodeContext:
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if "container" not in values or "gpu_devices" not in values:
        raise ParseError("expected container= and gpu_devices= lines")
    container = values["container"].strip()
    try:
        devices = int(values["gpu_devices"].strip() or "0")
    except ValueError:
        raise ParseError(f"gpu_devices={values['gpu_devices']!r} is not a number") from None
    return NodeContext("" if container == "none" else container, devices)


# --------------------------------------------------------------------------- nvidia-smi
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


# --------------------------------------------------------------------------- CUDA, NCCL
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


@dataclass(frozen=True)
class AllReduce:
    busbw_gbps: float  # nccl-tests' "Avg bus bandwidth", GB/s
    out_of_bounds: int  # wrong results


def parse_all_reduce(text: str) -> AllReduce:
    """nccl-tests' ``all_reduce_perf`` summary lines."""
    bw = re.search(r"^# Avg bus bandwidth\s*:\s*([0-9.]+)", text, re.MULTILINE)
    if not bw:
        raise ParseError("no '# Avg bus bandwidth' line (did all_reduce_perf finish?)")
    oob = re.search(r"^# Out of bounds values\s*:\s*(\d+)", text, re.MULTILINE)
    return AllReduce(float(bw.group(1)), int(oob.group(1)) if oob else 0)


@dataclass(frozen=True)
class BurnGpu:
    """One GPU's line of the burn-in program (provisioner/verify/gpu_burn.cu)."""

    index: int
    error: str = ""  # CUDA's words when the GPU could not run; the rest is then unset
    seconds: float = 0.0
    iterations: int = 0
    errors: int = 0  # results that differed from the first run's
    cpu_mismatch: int = 0  # sampled results of the first run that differed from the CPU's
    gflops: float = 0.0
    max_temp_c: int = -1  # -1: not watched (no NVML)
    max_power_w: float = -1.0
    slowdown: tuple[str, ...] = ()  # the fault slowdowns NVML reported during the run
    watched: bool = False


_BURN_INTS = ("iterations", "errors", "cpu_mismatch", "max_temp_c")
_BURN_FLOATS = ("seconds", "gflops", "max_power_w")


def parse_burn(text: str) -> list[BurnGpu]:
    """``gpu N key=value ...`` lines, then ``burn-in done gpus=N`` (every GPU must have a line)."""
    done = re.search(r"^burn-in done gpus=(\d+)$", text, re.MULTILINE)
    if not done:
        no_gpu = re.search(r"^no usable GPU: (.*)$", text, re.MULTILINE)
        raise ParseError(f"no usable GPU: {no_gpu.group(1)}" if no_gpu else "no 'burn-in done' line (did it finish?)")
    rows: list[BurnGpu] = []
    for m in re.finditer(r"^gpu (\d+) (.*)$", text, re.MULTILINE):
        index, rest = int(m.group(1)), m.group(2)
        if rest.startswith("error="):
            rows.append(BurnGpu(index, error=rest.removeprefix("error=")))
            continue
        fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        try:
            ints = {k: int(fields[k]) for k in _BURN_INTS}
            floats = {k: float(fields[k]) for k in _BURN_FLOATS}
        except (KeyError, ValueError) as exc:
            raise ParseError(f"GPU {index}: unreadable burn-in line {m.group(0)!r}") from exc
        slowdown = () if fields.get("slowdown", "none") == "none" else tuple(fields["slowdown"].split(","))
        rows.append(BurnGpu(index, "", floats["seconds"], ints["iterations"], ints["errors"], ints["cpu_mismatch"],
                            floats["gflops"], ints["max_temp_c"], floats["max_power_w"], slowdown,
                            fields.get("watch") == "nvml"))
    if len(rows) != int(done.group(1)):
        raise ParseError(f"{len(rows)} GPU lines for gpus={done.group(1)}")
    return rows


# --------------------------------------------------------------------------- RDMA, network
@dataclass(frozen=True)
class WriteBw:
    link_gbps: float  # the port's rate (sysfs), Gb/s
    average_gbps: float  # ib_write_bw --report_gbits, the largest message size's average


def parse_link_rate(text: str) -> float:
    """``/sys/class/infiniband/<dev>/ports/<n>/rate``: ``100 Gb/sec (4X EDR)``."""
    m = re.search(r"^rate=([0-9.]+) Gb/sec", text, re.MULTILINE)
    if not m:
        raise ParseError("no 'rate=N Gb/sec' line (no RDMA device?)")
    return float(m.group(1))


def parse_write_bw(text: str) -> WriteBw:
    rate = parse_link_rate(text)
    rows = [line.split() for line in text.splitlines()]
    data = [r for r in rows if len(r) >= 4 and r[0].isdigit() and _is_number(r[3])]
    if not data:
        raise ParseError("no ib_write_bw result row (#bytes #iterations peak average ...)")
    return WriteBw(rate, float(data[-1][3]))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Ping:
    sent: int
    received: int
    too_big: bool  # "message too long" / "Frag needed": the path's MTU is smaller


def parse_ping(text: str) -> Ping:
    too_big = bool(re.search(r"message too long|Frag needed", text))
    m = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", text)
    if not m:
        if too_big:
            return Ping(0, 0, True)
        raise ParseError("no 'N packets transmitted, M received' line")
    return Ping(int(m.group(1)), int(m.group(2)), too_big)


# --------------------------------------------------------------------------- storage
@dataclass(frozen=True)
class Mount:
    source: str
    fstype: str
    options: frozenset[str]


def parse_findmnt(text: str) -> Mount | None:
    """``findmnt -J -o SOURCE,FSTYPE,OPTIONS --mountpoint PATH`` (empty: not mounted)."""
    if not text.strip():
        return None
    try:
        systems = json.loads(text)["filesystems"]
        first = systems[0]
        return Mount(str(first["source"]), str(first["fstype"]), frozenset(str(first["options"]).split(",")))
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ParseError(f"not findmnt's JSON ({exc})") from None


@dataclass(frozen=True)
class DdRun:
    write_ok: bool
    read_ok: bool
    write_rate: str = ""
    read_rate: str = ""


def parse_io(text: str) -> DdRun:
    """Our short write/read: ``write rc=N`` / ``read rc=N`` lines after each dd's summary."""
    rates = re.findall(r"copied, [0-9.]+ s, ([0-9.]+ [kMGT]?B/s)", text)
    w = re.search(r"^write rc=(\d+)", text, re.MULTILINE)
    r = re.search(r"^read rc=(\d+)", text, re.MULTILINE)
    if not w:
        raise ParseError("no 'write rc=N' line")
    write_ok = w.group(1) == "0"
    read_ok = bool(r and r.group(1) == "0")
    return DdRun(write_ok, read_ok, rates[0] if rates else "", rates[1] if len(rates) > 1 else "")


@dataclass(frozen=True)
class PoolStatus:
    state: str
    data_errors: bool  # "errors:" says anything but "No known data errors"
    device_errors: int  # READ/WRITE/CKSUM counters that are not 0 (zpool prints 1.2K for large ones)
    scan: str = ""
    scan_errors: int = 0  # "... with N errors" of the last scrub/resilver


COUNTER_RE = re.compile(r"^\d+(\.\d+)?[KMGT]?$")


def parse_zpool_status(text: str) -> PoolStatus:
    state = re.search(r"^\s*state:\s*(\S+)", text, re.MULTILINE)
    if not state:
        raise ParseError("no 'state:' line (is the pool imported?)")
    errors = re.search(r"^\s*errors:\s*(.*)$", text, re.MULTILINE)
    scan = re.search(r"^\s*scan:\s*(.*)$", text, re.MULTILINE)
    scan_text = scan.group(1).strip() if scan else ""
    scan_err = re.search(r"with (\d+) errors", scan_text)
    device_errors = 0
    in_config = False
    for line in text.splitlines():
        cells = line.split()
        if cells[:1] == ["NAME"] and "CKSUM" in cells:
            in_config = True
            continue
        if in_config:
            if not cells:  # a blank line ends the table
                in_config = False
            elif len(cells) >= 5 and all(COUNTER_RE.match(c) for c in cells[2:5]):
                device_errors += sum(c != "0" for c in cells[2:5])
    return PoolStatus(
        state=state.group(1),
        data_errors=not (errors and errors.group(1).strip() == "No known data errors"),
        device_errors=device_errors,
        scan=scan_text,
        scan_errors=int(scan_err.group(1)) if scan_err else 0,
    )


# --------------------------------------------------------------------------- Slurm, Docker, time
@dataclass(frozen=True)
class SlurmNode:
    state: str  # e.g. IDLE, MIXED, ALLOCATED, DOWN+NOT_RESPONDING, IDLE+DRAIN
    gres: str  # e.g. gpu:rtx_a6000:2, "(null)"
    reason: str = ""


def parse_scontrol_node(text: str) -> SlurmNode:
    """``scontrol show node NAME --oneliner``."""
    state = re.search(r"\bState=(\S+)", text)
    if not state:
        raise ParseError("no State= in scontrol's answer")
    gres = re.search(r"\bGres=(\S+)", text)
    reason = re.search(r"\bReason=(.*?)(?= [A-Za-z]+=|$)", text.strip())
    return SlurmNode(state.group(1), gres.group(1) if gres else "(null)", reason.group(1) if reason else "")


def parse_docker_runtimes(text: str) -> set[str]:
    """``docker info --format '{{json .Runtimes}}'``."""
    try:
        data = json.loads(text)
    except ValueError:
        raise ParseError("not docker info's JSON runtimes") from None
    if not isinstance(data, dict):
        raise ParseError("docker info's runtimes are not an object")
    return set(data)


@dataclass(frozen=True)
class Tracking:
    synchronised: bool
    offset_s: float  # system time minus NTP time (positive: fast)
    reference: str = ""


def parse_chrony_tracking(text: str) -> Tracking:
    """``chronyc -n tracking``."""
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v}
    if "System time" not in fields or "Leap status" not in fields:
        raise ParseError("no 'System time' / 'Leap status' lines (is chronyd running?)")
    m = re.match(r"([0-9.]+) seconds (fast|slow) of NTP time", fields["System time"])
    if not m:
        raise ParseError(f"System time {fields['System time']!r} is not 'N seconds fast|slow of NTP time'")
    offset = float(m.group(1)) * (1 if m.group(2) == "fast" else -1)
    return Tracking(fields["Leap status"] != "Not synchronised", offset, fields.get("Reference ID", ""))


@dataclass(frozen=True)
class HostsFile:
    names: dict[str, set[str]] = field(default_factory=dict)  # name -> addresses


def parse_hosts(text: str) -> HostsFile:
    names: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = line.split("#", 1)[0].split()
        for name in cells[1:]:
            names.setdefault(name, set()).add(cells[0])
    return HostsFile(names)
