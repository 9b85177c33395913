"""Pure parsers shared by several areas' verify checks (and the context probe of every node).

Each takes a command's text output and returns plain data; a text it cannot read raises
:class:`ParseError` with what was expected, which the check reports as a failure (a check
never passes on output it did not understand). A parser of one area's commands lives in
that area's ``verify.py``, and follows the same rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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


# --------------------------------------------------------------------------- nccl-tests (gpu, slurm)
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
