#!/usr/bin/env python3
"""provision-zpool-collector: ZFS scrub and device errors for node_exporter's textfile collector.

node_exporter's zfs collector reports each pool's state (node_zfs_zpool_state) but not what
the last scrub found or which disk is throwing errors; this reads ``zpool status -p`` and
writes, atomically, one file that node_exporter serves:

  provision_zpool_scrub_errors{zpool}                errors the last scrub or resilver found
  provision_zpool_scrub_repaired_bytes{zpool}        bytes it repaired
  provision_zpool_scrub_in_progress{zpool}           1 while a scrub or resilver runs
  provision_zpool_data_errors{zpool}                 files with permanent errors ("errors:" line)
  provision_zpool_device_errors{zpool,device,type}   READ/WRITE/CKSUM counters of each disk
  provision_zpool_collector_success                  0 when zpool failed or printed nonsense
  provision_zpool_collector_last_run_timestamp_seconds

Installed by the node_exporter role on nodes that own a pool (managed by Ansible; local
edits are overwritten) and run by a systemd timer. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ZPOOL_STATUS = ["zpool", "status", "-p"]
SIZE_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>[BKMGTPE]?)(?:i?B)?$")
SCAN_DONE_RE = re.compile(
    r"(?:scrub repaired|resilvered) (?P<size>\S+) in .* with (?P<errors>\d+) errors? on")
ERRORS_RE = re.compile(r"^(?P<count>\d+) data errors?")
UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50, "E": 1 << 60}
COUNTER_TYPES = ("read", "write", "checksum")


class CollectError(Exception):
    """zpool failed, or printed something we cannot read."""


@dataclass
class Pool:
    name: str
    scrub_errors: int = 0
    repaired_bytes: int = 0
    scan_in_progress: bool = False
    data_errors: int = 0
    devices: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # leaf device -> R, W, CKSUM


def size_bytes(text: str) -> int:
    """ZFS sizes: 0B, 1.50M, 1572864 (-p), 12K -> bytes."""
    m = SIZE_RE.match(text.strip())
    if not m:
        raise CollectError(f"not a ZFS size: {text!r}")
    return int(float(m.group("num")) * UNITS[m.group("unit")])


def _counter(text: str) -> int | None:
    """READ/WRITE/CKSUM column: 0, 12, or 1.2K when not parsable (-p gives exact numbers)."""
    try:
        return size_bytes(text) if not text.isdigit() else int(text)
    except CollectError:
        return None


def _config_rows(lines: list[str]) -> list[tuple[int, str, tuple[int, int, int]]]:
    """(indent, name, counters) of every device row in a pool's config: table."""
    rows: list[tuple[int, str, tuple[int, int, int]]] = []
    for line in lines:
        body = line.lstrip("\t")
        stripped = body.lstrip(" ")
        parts = stripped.split()
        if len(parts) < 5 or parts[0] == "NAME":
            continue
        counters = [_counter(p) for p in parts[2:5]]
        if any(c is None for c in counters):
            continue
        read, write, cksum = (int(c or 0) for c in counters)
        rows.append((len(body) - len(stripped), parts[0], (read, write, cksum)))
    return rows


def _leaves(rows: list[tuple[int, str, tuple[int, int, int]]]) -> dict[str, tuple[int, int, int]]:
    """Rows that are disks: no deeper row follows them (mirror-0, raidz2-1 and the pool itself
    have their disks below them)."""
    out: dict[str, tuple[int, int, int]] = {}
    for i, (indent, name, counters) in enumerate(rows):
        nxt = rows[i + 1][0] if i + 1 < len(rows) else -1
        if nxt <= indent and i > 0:
            out[name] = counters
    return out


def parse_status(text: str) -> list[Pool]:
    """Pools from ``zpool status -p`` (every pool, in order)."""
    pools: list[Pool] = []
    current: Pool | None = None
    section = ""
    config: list[str] = []

    def close() -> None:
        if current is not None:
            current.devices = _leaves(_config_rows(config))

    for line in text.splitlines():
        key, sep, rest = line.strip().partition(":")
        if sep and key == "pool" and not line.startswith("\t"):
            close()
            current = Pool(name=rest.strip())
            pools.append(current)
            section, config = "", []
            continue
        if current is None:
            continue
        if sep and key in ("state", "status", "action", "see", "scan", "config", "errors", "remove") \
                and not line.startswith("\t"):
            section = key
            if key == "scan":
                scan = rest.strip()
                done = SCAN_DONE_RE.search(scan)
                if done:
                    current.scrub_errors = int(done.group("errors"))
                    current.repaired_bytes = size_bytes(done.group("size"))
                current.scan_in_progress = " in progress since " in scan
            elif key == "errors":
                m = ERRORS_RE.match(rest.strip())
                current.data_errors = int(m.group("count")) if m else 0
            continue
        if section == "config":
            config.append(line)
    close()
    if not pools and text.strip() and "no pools available" not in text:
        raise CollectError(f"zpool status printed no pool: {text.strip().splitlines()[0]!r}")
    return pools


# --------------------------------------------------------------------------- exposition
def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**items: str) -> str:
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in items.items())
    return "{" + inner + "}" if inner else ""


def block(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    samples = list(samples)
    if not samples:
        return []
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines.extend(f"{name}{lbl} {int(v) if float(v).is_integer() else repr(float(v))}" for lbl, v in samples)
    return lines


def render(pools: list[Pool] | None, now: float) -> str:
    out: list[str] = []
    for p in pools or []:
        if not p.name:
            raise CollectError("a pool without a name")
    ps = pools or []
    out += block("provision_zpool_scrub_errors", "gauge", "Errors the last completed scrub or resilver found.",
                 [(labels(zpool=p.name), p.scrub_errors) for p in ps])
    out += block("provision_zpool_scrub_repaired_bytes", "gauge", "Bytes the last scrub or resilver repaired.",
                 [(labels(zpool=p.name), p.repaired_bytes) for p in ps])
    out += block("provision_zpool_scrub_in_progress", "gauge", "1 while a scrub or resilver runs.",
                 [(labels(zpool=p.name), int(p.scan_in_progress)) for p in ps])
    out += block("provision_zpool_data_errors", "gauge", "Permanent data errors zpool status reports.",
                 [(labels(zpool=p.name), p.data_errors) for p in ps])
    out += block("provision_zpool_device_errors", "gauge", "READ/WRITE/CKSUM error counters of each disk.",
                 [(labels(zpool=p.name, device=dev, type=kind), counters[i])
                  for p in ps for dev, counters in p.devices.items() for i, kind in enumerate(COUNTER_TYPES)])
    out += block("provision_zpool_collector_success", "gauge", "1 when zpool status answered on the last run.",
                 [("", int(pools is not None))])
    out += block("provision_zpool_collector_last_run_timestamp_seconds", "gauge", "When the collector last ran.",
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


def collect(timeout: float) -> tuple[list[Pool] | None, str]:
    try:
        proc = subprocess.run(ZPOOL_STATUS, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return None, "zpool is not installed"
    except subprocess.TimeoutExpired:
        return None, f"zpool status did not answer within {timeout:g}s"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, f"zpool status failed (exit {proc.returncode}): {lines[-1] if lines else ''}"
    try:
        return parse_status(proc.stdout + proc.stderr), ""
    except CollectError as exc:
        return None, str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the .prom file to write")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    pools, error = collect(args.timeout)
    write_atomic(args.out, render(pools, time.time()))
    if error:
        print(f"provision-zpool-collector: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
