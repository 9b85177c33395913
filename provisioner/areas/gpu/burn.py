"""The GPU area's burn-in check (``gpu.burn``): our stress program (gpu_burn.cu, beside this
module) built with the node's nvcc and run on every GPU at once, its lines read and judged."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from provisioner.nodecheck.check import Outcome
from provisioner.nodecheck.parsers import ParseError

BUILD_S = 240  # the check's bound beyond its seconds: nvcc, the first run, the CPU's sample


@dataclass(frozen=True)
class BurnGpu:
    """One GPU's line of the burn-in program."""

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


_INTS = ("iterations", "errors", "cpu_mismatch", "max_temp_c")
_FLOATS = ("seconds", "gflops", "max_power_w")


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
            ints = {k: int(fields[k]) for k in _INTS}
            floats = {k: float(fields[k]) for k in _FLOATS}
        except (KeyError, ValueError) as exc:
            raise ParseError(f"GPU {index}: unreadable burn-in line {m.group(0)!r}") from exc
        slowdown = () if fields.get("slowdown", "none") == "none" else tuple(fields["slowdown"].split(","))
        rows.append(BurnGpu(index, "", floats["seconds"], ints["iterations"], ints["errors"], ints["cpu_mismatch"],
                            floats["gflops"], ints["max_temp_c"], floats["max_power_w"], slowdown,
                            fields.get("watch") == "nvml"))
    if len(rows) != int(done.group(1)):
        raise ParseError(f"{len(rows)} GPU lines for gpus={done.group(1)}")
    return rows


def _fault(r: BurnGpu, seconds: int, max_temp_c: int) -> str:
    """What is wrong with one GPU's run ("" when nothing)."""
    if r.error:
        return f"could not run: {r.error}"
    if r.errors:
        return f"{r.errors} wrong results"
    if r.cpu_mismatch:
        return f"{r.cpu_mismatch} results differ from the CPU's"
    if r.slowdown:
        return f"slowed down ({', '.join(r.slowdown)})"
    if r.max_temp_c >= max_temp_c:
        return f"reached {r.max_temp_c} C (limit {max_temp_c})"
    if r.seconds < seconds * 0.9:
        return f"stopped after {r.seconds:g} s of {seconds}"
    return ""


def burn_verdict(expected: int, seconds: int, max_temp_c: int) -> Callable[[list[BurnGpu]], Outcome]:
    """Every GPU ran its ``seconds`` with no wrong result, no fault slowdown (thermal, HW
    slowdown, power brake) and under ``max_temp_c``."""
    def verdict(rows: list[BurnGpu]) -> Outcome:
        if len(rows) != expected:
            return Outcome("FAIL", f"{len(rows)} GPUs ran, manifest says {expected}")
        bad = [f"GPU {r.index} {what}" for r in rows if (what := _fault(r, seconds, max_temp_c))]
        if bad:
            return Outcome("FAIL", "; ".join(bad))
        temps = [r.max_temp_c for r in rows if r.watched]
        watch = f", max {max(temps)} C" if temps else ", temperatures not watched (no NVML)"
        gflops = min(r.gflops for r in rows)
        return Outcome("PASS", f"{len(rows)} GPUs, {seconds} s, 0 errors, >= {gflops:g} GFLOP/s each{watch}")
    return verdict


def burn_command(seconds: int) -> str:
    """Build the burn-in program with the node's nvcc in a temporary folder, run it."""
    source = (resources.files("provisioner.areas.gpu") / "gpu_burn.cu").read_text()
    return ('d=$(mktemp -d) && trap \'rm -rf "$d"\' EXIT && printf %s ' + shlex.quote(source)
            + ' > "$d/burn.cu" && PATH=/usr/local/cuda/bin:$PATH nvcc -O2 -o "$d/burn" "$d/burn.cu" && '
            + f'"$d/burn" {int(seconds)}')
