"""ZFS snapshots on a schedule with retention: which snapshots are ours, which to destroy,
how old the newest is; and the node program that takes and prunes them.

This one file is both a module of the storage area (verify and the unit tests import its
pure functions) and the program the zfs role installs on storage nodes as
``/usr/local/lib/provision/provision_zfs_snapshot.py`` (the role's filter
``zfs_program_path`` hands Ansible this file), so the pruning that runs on a node is the
pruning the unit tests check. Hence: standard library only, Python 3.10 (Ubuntu 22.04),
no import of the rest of the package; the side effects (``zfs``, the metrics file, the
lock) are in the functions under "the node program" below.

Ours are exactly the snapshots named ``provision-<frequency>-<YYYYmmddTHHMMSSZ>``; any
other snapshot of a dataset (an operator's, a replication tool's, a name that only starts
like ours) is never destroyed.

A run for one frequency (``hourly``...): for each dataset whose policy keeps that
frequency, take ``<dataset>@provision-<frequency>-<UTC now>`` and destroy that frequency's
snapshots of ours beyond the count, oldest first. ``--missing`` instead takes the first
snapshot (of its shortest frequency) of each dataset that has none of ours, and destroys
nothing (the role runs it once after creating the datasets). Then it writes node_exporter's
textfile metrics:

  provision_zfs_snapshot_newest_timestamp_seconds{dataset}  newest snapshot of ours (0: none)
  provision_zfs_snapshot_max_age_seconds{dataset}           2 x the shortest period kept
  provision_zfs_snapshot_run_success{frequency}             0 when a snapshot or destroy failed
  provision_zfs_snapshot_run_timestamp_seconds{frequency}
"""

from __future__ import annotations

import argparse
import calendar
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# The frequencies a policy may keep, with their period in seconds. Each name is also the
# systemd OnCalendar word of its timer (hourly, daily, weekly, monthly); monthly counts 31 days.
PERIODS: dict[str, int] = {"hourly": 3600, "daily": 86400, "weekly": 7 * 86400, "monthly": 31 * 86400}
PREFIX = "provision"
STAMP = "%Y%m%dT%H%M%SZ"
OURS_RE = re.compile(rf"^{PREFIX}-(?P<frequency>{'|'.join(PERIODS)})-(?P<stamp>\d{{8}}T\d{{6}}Z)$")
LATE_FACTOR = 2  # a dataset is late when its newest snapshot is older than this x its shortest period
ZFS_TIMEOUT = 300  # seconds one zfs command may take
METRICS_FILE = "provision_zfs_snapshots.prom"


@dataclass(frozen=True, order=True)
class Ours:
    """One snapshot of ours: when it was taken (from its name), its frequency and full name."""

    taken: int  # seconds since the epoch, UTC
    frequency: str
    name: str  # dataset@provision-<frequency>-<stamp>


# --------------------------------------------------------------------------- pure
def snapshot_name(dataset: str, frequency: str, now: float) -> str:
    """``dataset@provision-<frequency>-<UTC stamp>`` for a snapshot taken at ``now``."""
    if frequency not in PERIODS:
        raise ValueError(f"unknown frequency {frequency!r}; known: {', '.join(PERIODS)}")
    return f"{dataset}@{PREFIX}-{frequency}-{time.strftime(STAMP, time.gmtime(now))}"


def ours(dataset: str, names: Iterable[str]) -> list[Ours]:
    """The snapshots of ``dataset`` among ``names`` (``dataset@snap``) that we took, oldest
    first. Another dataset's snapshots and names that are not exactly ours are left out."""
    found: list[Ours] = []
    for name in names:
        head, sep, snap = name.strip().partition("@")
        if not sep or head != dataset:
            continue
        m = OURS_RE.match(snap)
        if m is None:
            continue
        try:
            taken = calendar.timegm(time.strptime(m.group("stamp"), STAMP))
        except ValueError:  # 20261399T...: looks like ours, is not
            continue
        found.append(Ours(taken, m.group("frequency"), name.strip()))
    return sorted(found)


def to_destroy(dataset: str, names: Iterable[str], frequency: str, keep: int) -> list[str]:
    """Our ``frequency`` snapshots of ``dataset`` beyond the newest ``keep``, oldest first.
    Nothing else is ever listed: not another frequency's, not a snapshot we did not take."""
    if keep < 0:
        raise ValueError(f"keep must be 0 or more, not {keep}")
    mine = [s for s in ours(dataset, names) if s.frequency == frequency]
    return [s.name for s in mine[: max(len(mine) - keep, 0)]]


def newest(dataset: str, names: Iterable[str]) -> int:
    """When the newest snapshot of ours of ``dataset`` was taken (0: there is none)."""
    mine = ours(dataset, names)
    return mine[-1].taken if mine else 0


def max_age(policy: Mapping[str, int]) -> int:
    """Seconds after which a dataset's newest snapshot is late: LATE_FACTOR x the shortest
    period the policy keeps (0: the policy keeps nothing)."""
    periods = [PERIODS[f] for f, count in policy.items() if count > 0]
    return LATE_FACTOR * min(periods) if periods else 0


def shortest(policy: Mapping[str, int]) -> str | None:
    """The policy's most frequent schedule (None: it keeps nothing)."""
    kept = [f for f in PERIODS if policy.get(f, 0) > 0]
    return kept[0] if kept else None


def late(policy: Mapping[str, int], newest_taken: int, now: float) -> bool:
    limit = max_age(policy)
    return limit > 0 and now - newest_taken > limit


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def metrics_text(newest_by_dataset: Mapping[str, int], policies: Mapping[str, Mapping[str, int]],
                 results: Mapping[str, tuple[bool, float]]) -> str:
    """The textfile: the newest snapshot and the lateness limit of each dataset, and the last
    run of each frequency (``results``: frequency -> (succeeded, when))."""
    lines = [
        "# HELP provision_zfs_snapshot_newest_timestamp_seconds When the newest snapshot of ours was taken (0: none).",
        "# TYPE provision_zfs_snapshot_newest_timestamp_seconds gauge",
    ]
    lines += [f'provision_zfs_snapshot_newest_timestamp_seconds{{dataset="{escape(d)}"}} {newest_by_dataset[d]}'
              for d in sorted(newest_by_dataset)]
    lines += [
        "# HELP provision_zfs_snapshot_max_age_seconds Age after which the newest snapshot is late.",
        "# TYPE provision_zfs_snapshot_max_age_seconds gauge",
    ]
    lines += [f'provision_zfs_snapshot_max_age_seconds{{dataset="{escape(d)}"}} {max_age(policies[d])}'
              for d in sorted(policies)]
    lines += [
        "# HELP provision_zfs_snapshot_run_success 1 when the last run of a frequency took and pruned every snapshot.",
        "# TYPE provision_zfs_snapshot_run_success gauge",
    ]
    lines += [f'provision_zfs_snapshot_run_success{{frequency="{f}"}} {int(results[f][0])}' for f in sorted(results)]
    lines += [
        "# HELP provision_zfs_snapshot_run_timestamp_seconds When a frequency's last run ended.",
        "# TYPE provision_zfs_snapshot_run_timestamp_seconds gauge",
    ]
    lines += [f'provision_zfs_snapshot_run_timestamp_seconds{{frequency="{f}"}} {results[f][1]:.0f}'
              for f in sorted(results)]
    return "\n".join(lines) + "\n"


def read_results(text: str) -> dict[str, tuple[bool, float]]:
    """The run results of an earlier metrics file (kept for the frequencies not run now)."""
    success: dict[str, bool] = {}
    when: dict[str, float] = {}
    for m in re.finditer(r'^provision_zfs_snapshot_run_(success|timestamp_seconds)\{frequency="(\w+)"\} (\S+)$',
                         text, re.MULTILINE):
        kind, freq, value = m.groups()
        if freq not in PERIODS:
            continue
        if kind == "success":
            success[freq] = value == "1"
        else:
            when[freq] = float(value)
    return {f: (success[f], when.get(f, 0.0)) for f in success}


def parse_policies(data: object) -> dict[str, dict[str, int]]:
    """The config file's ``datasets``: {dataset: {frequency: count}}, checked."""
    if not isinstance(data, dict) or not isinstance(data.get("datasets"), dict):
        raise ValueError("the config needs a 'datasets' mapping")
    out: dict[str, dict[str, int]] = {}
    for dataset, policy in data["datasets"].items():
        if not isinstance(policy, dict) or any(f not in PERIODS or not isinstance(n, int) or n < 0
                                               for f, n in policy.items()):
            raise ValueError(f"{dataset}: a policy is {{frequency: count}} with frequencies {', '.join(PERIODS)}")
        out[str(dataset)] = {str(f): int(n) for f, n in policy.items()}
    return out


# --------------------------------------------------------------------------- the node program
def zfs(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["zfs", *args], capture_output=True, text=True, timeout=ZFS_TIMEOUT, check=False)


def list_snapshots(dataset: str) -> list[str]:
    proc = zfs(["list", "-H", "-o", "name", "-t", "snapshot", "-d", "1", dataset])
    if proc.returncode != 0:
        raise RuntimeError(f"zfs list {dataset}: {proc.stderr.strip()}")
    return proc.stdout.splitlines()


def write_atomic(path: Path, text: str) -> None:
    """node_exporter must never read a half-written file: write beside it, then rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def run(frequency: str, policies: Mapping[str, Mapping[str, int]], textfile_dir: Path) -> int:
    """Take ``frequency``'s snapshot of each dataset that keeps it and destroy that
    frequency's snapshots of ours beyond the count, then write the metrics. Exit status 1
    when any zfs command failed (the others still ran)."""
    ok = True
    for dataset, policy in sorted(policies.items()):
        keep = policy.get(frequency, 0)
        if keep <= 0:
            continue
        try:
            names = list_snapshots(dataset)
            name = take(dataset, frequency)
            for old in to_destroy(dataset, [*names, name], frequency, keep):
                proc = zfs(["destroy", old])
                if proc.returncode != 0:
                    raise RuntimeError(f"zfs destroy {old}: {proc.stderr.strip()}")
                print(f"destroyed {old}")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            ok = False
            print(f"FAILED {dataset}: {exc}", file=sys.stderr)
    write_metrics(policies, textfile_dir, (frequency, ok))
    return 0 if ok else 1


def run_missing(policies: Mapping[str, Mapping[str, int]], textfile_dir: Path) -> int:
    """The first snapshot (of its shortest frequency) of each dataset that has none of ours
    yet, so that a freshly set-up dataset is not late before its timer first fires; destroys
    nothing. Says ``took NAME`` for each (the role reports a change from that)."""
    ok = True
    for dataset, policy in sorted(policies.items()):
        frequency = shortest(policy)
        if frequency is None:
            continue
        try:
            if not ours(dataset, list_snapshots(dataset)):
                take(dataset, frequency)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            ok = False
            print(f"FAILED {dataset}: {exc}", file=sys.stderr)
    write_metrics(policies, textfile_dir, None)
    return 0 if ok else 1


def take(dataset: str, frequency: str) -> str:
    name = snapshot_name(dataset, frequency, time.time())
    proc = zfs(["snapshot", name])
    if proc.returncode != 0:
        raise RuntimeError(f"zfs snapshot {name}: {proc.stderr.strip()}")
    print(f"took {name}")
    return name


def write_metrics(policies: Mapping[str, Mapping[str, int]], textfile_dir: Path,
                  result: tuple[str, bool] | None) -> None:
    newest_by_dataset: dict[str, int] = {}
    for dataset in policies:
        try:
            newest_by_dataset[dataset] = newest(dataset, list_snapshots(dataset))
        except (RuntimeError, subprocess.TimeoutExpired):
            newest_by_dataset[dataset] = 0
    path = textfile_dir / METRICS_FILE
    results = read_results(path.read_text()) if path.exists() else {}
    if result is not None:
        results[result[0]] = (result[1], time.time())
    write_atomic(path, metrics_text(newest_by_dataset, policies, results))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision-zfs-snapshot", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("frequency", nargs="?", choices=list(PERIODS))
    parser.add_argument("--config", type=Path, default=Path("/etc/provision/zfs-snapshots.json"))
    parser.add_argument("--textfile-dir", type=Path, default=Path("/var/lib/prometheus/node-exporter"))
    parser.add_argument("--missing", action="store_true",
                        help="instead: the first snapshot of each dataset without one of ours")
    args = parser.parse_args(argv)
    if (args.frequency is None) != args.missing:
        parser.error("give a frequency or --missing")
    try:
        policies = parse_policies(json.loads(args.config.read_text()))
    except (OSError, ValueError) as exc:
        print(f"provision-zfs-snapshot: {args.config}: {exc}", file=sys.stderr)
        return 2
    args.textfile_dir.mkdir(parents=True, exist_ok=True)
    # hourly and daily fire together at midnight: one run at a time, the other waits
    with open(args.textfile_dir / f".{METRICS_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if args.missing:
            return run_missing(policies, args.textfile_dir)
        return run(args.frequency, policies, args.textfile_dir)


if __name__ == "__main__":
    sys.exit(main())
