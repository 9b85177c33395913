#!/usr/bin/env python3
"""provision-slurm-healthcheck: Slurm's HealthCheckProgram on compute nodes (role slurm).

slurmd runs it every HealthCheckInterval seconds (and when it starts). It compares the node
with what the manifest promises (the JSON file the role renders: node name, GPU count, the
shared mounts the node must have, the XID codes that mean broken hardware) and

* drains the node with a reason starting "healthcheck:" when it sees fewer /dev/nvidiaN than
  the manifest's GPU count, a shared mount missing, or such an XID in the kernel log of this
  boot (checked only where the NVIDIA driver is loaded: otherwise it says "XID: skipped");
* resumes the node when all is well again, but only if the drain is its own (a reason an
  operator or Slurm gave is never touched).

It prints one line saying what it saw and did. Every command it runs is bounded. Installed
by Ansible (local edits are overwritten). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "healthcheck: "
MAX_REASON = 200
COMMAND_TIMEOUT = 20
GPU_RE = re.compile(r"^nvidia(\d+)$")
XID_RE = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<xid>\d+)")
JOURNAL_ARGS = ["journalctl", "-k", "-b", "-o", "cat", "--no-pager", "-q", "--grep", "NVRM: Xid"]


@dataclass(frozen=True)
class Config:
    node: str
    gpu_count: int
    mounts: tuple[str, ...]
    xids: frozenset[int]


@dataclass(frozen=True)
class Observed:
    gpus: frozenset[int]  # N of every /dev/nvidiaN
    mounts: frozenset[str]  # mount points
    xids: tuple[int, ...] | None  # XID codes of this boot; None: not checked (no driver)


@dataclass(frozen=True)
class Action:
    kind: str  # "drain", "resume" or "none"
    reason: str = ""
    why: str = ""


def load_config(text: str) -> Config:
    data = json.loads(text)
    return Config(node=str(data["node"]), gpu_count=int(data.get("gpu_count", 0)),
                  mounts=tuple(str(p) for p in data.get("mounts", [])),
                  xids=frozenset(int(x) for x in data.get("xids", [])))


def gpu_indexes(names: Iterable[str]) -> frozenset[int]:
    """GPU indexes of /dev entries: nvidia0, nvidia7 (not nvidiactl, nvidia-uvm)."""
    return frozenset(int(m.group(1)) for m in (GPU_RE.match(n) for n in names) if m)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_points(proc_mounts: str) -> frozenset[str]:
    """Mount points listed in /proc/self/mounts (octal escapes such as \\040 decoded)."""
    return frozenset(_unescape(line.split()[1]) for line in proc_mounts.splitlines() if len(line.split()) > 1)


def parse_xids(kernel_log: str) -> tuple[int, ...]:
    """XID codes of the "NVRM: Xid (PCI:...): N, ..." lines, in log order."""
    return tuple(int(m.group("xid")) for m in map(XID_RE.search, kernel_log.splitlines()) if m)


def findings(config: Config, seen: Observed) -> list[str]:
    """What is wrong with the node, one short sentence each (empty: healthy)."""
    out: list[str] = []
    missing = [f"/dev/nvidia{i}" for i in range(config.gpu_count) if i not in seen.gpus]
    if missing:
        found = len([i for i in seen.gpus if i < config.gpu_count])
        out.append(f"{found} of {config.gpu_count} GPUs ({', '.join(missing)} missing)")
    out += [f"shared mount {path} missing" for path in config.mounts if path not in seen.mounts]
    bad = sorted({x for x in seen.xids or () if x in config.xids})
    if bad:
        out.append(f"XID {', '.join(map(str, bad))} in the kernel log since boot")
    return out


def reason_text(problems: Sequence[str]) -> str:
    text = PREFIX + "; ".join(problems)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def parse_node_state(sinfo: str) -> tuple[str, str]:
    """(state, reason) from `sinfo -h -N -n NODE -o '%T|%E'` (a line per partition)."""
    for line in sinfo.splitlines():
        state, sep, reason = line.partition("|")
        if sep:
            return state.strip().lower(), "" if reason.strip() == "none" else reason.strip()
    return "", ""


def decide(problems: Sequence[str], state: str, reason: str) -> Action:
    """Drain with our reason, resume our own drain, or leave the node alone."""
    drained = "drain" in state
    ours = reason.startswith(PREFIX)
    if problems:
        wanted = reason_text(problems)
        if drained and not ours:
            return Action("none", why=f"already drained by someone else ({reason or 'no reason'})")
        if drained and reason == wanted:
            return Action("none", why="already drained for this")
        return Action("drain", reason=wanted)
    if drained and ours:
        return Action("resume", why="all checks pass again")
    return Action("none", why="all checks pass")


def scontrol_args(node: str, action: Action) -> list[str]:
    if action.kind == "drain":
        return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={action.reason}"]
    if action.kind == "resume":
        return ["scontrol", "update", f"nodename={node}", "state=resume"]
    return []


def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)


def observe(dev_dir: Path, proc_mounts: Path, driver_dir: Path) -> Observed:
    xids: tuple[int, ...] | None = None
    if driver_dir.exists():
        try:
            xids = parse_xids(run(JOURNAL_ARGS).stdout)  # journalctl exits 1 when nothing matches
        except (OSError, subprocess.TimeoutExpired):
            xids = None
    names = [p.name for p in dev_dir.iterdir()] if dev_dir.is_dir() else []
    return Observed(gpus=gpu_indexes(names), mounts=mount_points(proc_mounts.read_text()), xids=xids)


def _attempt(cmd: list[str]) -> tuple[subprocess.CompletedProcess[str] | None, str]:
    """``run(cmd)``, and None with why when it could not start, timed out or failed."""
    try:
        done = run(cmd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        return None, done.stderr.strip()
    return done, ""


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("/etc/slurm/provision-healthcheck.json"))
    ap.add_argument("--dev", type=Path, default=Path("/dev"))
    ap.add_argument("--mounts", type=Path, default=Path("/proc/self/mounts"))
    ap.add_argument("--driver", type=Path, default=Path("/proc/driver/nvidia"))
    ap.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    args = ap.parse_args(argv)
    config = load_config(args.config.read_text())
    seen = observe(args.dev, args.mounts, args.driver)
    problems = findings(config, seen)
    xid_note = "XID: skipped (no NVIDIA driver loaded)" if seen.xids is None else "XID: checked"
    summary = f"{config.node}: {'; '.join(problems) or 'healthy'}; {xid_note}"
    sinfo, error = _attempt(["sinfo", "-h", "-N", "-n", config.node, "-o", "%T|%E"])
    if sinfo is None:
        print(f"{summary}; sinfo failed: {error}")
        return 1
    state, reason = parse_node_state(sinfo.stdout)
    action = decide(problems, state, reason)
    if action.kind == "none" or args.dry_run:
        print(f"{summary}; {action.kind if args.dry_run else 'no change'} ({action.why or action.reason})")
        return 0
    done, error = _attempt(scontrol_args(config.node, action))
    if done is None:
        print(f"{summary}; {action.kind} failed: {error}")
        return 1
    print(f"{summary}; resumed" if action.kind == "resume" else f"{summary}; drained ({action.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
