"""What ``provision report usage`` reads, pure: the report's window (``--since``, ``--until``),
Slurm's accounting records (the ``sacct`` command on the controller and its parser) and
Prometheus' per-job GPU series (the range query's points, its parser, the integral of a
series over the time a job held its GPUs). The arithmetic that joins them is
:mod:`provisioner.areas.monitoring.usage`.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioner.areas.slurm.hostlist import expand_hostlist
from provisioner.errors import ProvisionError
from provisioner.manifest.model import Manifest

MAX_POINTS = 10_000  # per series and query (Prometheus refuses more than 11,000)

# sacct's fields, in the order of its output. JobIDRaw is the id the prolog writes into the
# job map (an array task's own id, where JobID shows 123_4).
SACCT_FIELDS = ("JobIDRaw", "JobID", "User", "Account", "Partition", "NodeList", "AllocTRES", "Start", "End",
                "State")
SACCT_MARGIN = 60  # seconds sacct's window is wider on each side than the report's (clocks differ)


class UsageError(ProvisionError):
    """The report cannot be made (no Slurm accounting to read, a bad --since)."""


# --------------------------------------------------------------------------- the window
_AGO_RE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, now: float, what: str) -> float:
    """``7d`` (that long before now; s, m, h, d, w), ``now``, or a date or date and time in ISO
    form (``2026-11-01``, ``2026-11-01T08:00``; local time unless it names a zone) -> epoch."""
    text = text.strip()
    if text == "now":
        return now
    m = _AGO_RE.match(text)
    if m:
        return now - int(m.group(1)) * _UNITS[m.group(2)]
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{what} {text!r}: give a duration before now (30m, 12h, 7d, 2w), 'now', or a date "
                         "(2026-11-01, 2026-11-01T08:00)") from None
    return when.timestamp()  # a naive time is local time


@dataclass(frozen=True)
class Window:
    since: float
    until: float

    @property
    def seconds(self) -> float:
        return self.until - self.since


def window(since: str, until: str, now: float) -> Window:
    start, end = parse_when(since, now, "--since"), parse_when(until, now, "--until")
    end = min(end, now)
    if end <= start:
        raise UsageError(f"--since {since} is not before --until {until}: the window is empty")
    return Window(start, end)


def prom_seconds(duration: str) -> float:
    """A Prometheus duration (``30s``, ``1m30s``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
    total = sum(int(n) * units[u] for n, u in re.findall(r"(\d+)(ms|[smhdwy])", duration))
    if total <= 0:
        raise ValueError(f"not a Prometheus duration: {duration!r}")
    return float(total)


def step_of(m: Manifest) -> float:
    """The query step: the scrape interval (finer steps only repeat samples)."""
    return prom_seconds(m.monitoring.scrape_interval) if m.monitoring is not None else 30.0


# --------------------------------------------------------------------------- sacct
@dataclass(frozen=True)
class Job:
    job_id: str  # JobIDRaw: the GPU series' hpc_job
    shown_id: str  # JobID as sacct shows it (array tasks: 123_4)
    user: str
    account: str
    partition: str
    nodes: tuple[str, ...]
    gpus: int
    start: float
    end: float | None  # None: still running
    state: str


def sacct_command(win: Window, now: float) -> str:
    """sacct on the controller: every job allocation of the window, times as epoch seconds.
    Its -S/-E are relative to the controller's own clock ("now-N"), a minute wider than the
    window on both sides (the controller's clock and time zone need not be ours); the report
    clamps every job to the window itself."""
    start_ago = math.ceil(now - win.since) + SACCT_MARGIN
    end_ago = math.floor(now - win.until) - SACCT_MARGIN
    end = f"now-{end_ago}" if end_ago > 0 else "now"
    return ("SLURM_TIME_FORMAT=%s sacct --allusers --allocations --parsable2 --noheader "
            f"--format={','.join(SACCT_FIELDS)} --starttime=now-{start_ago} --endtime={end}")


def hostlist(text: str) -> tuple[str, ...]:
    """Slurm's node list (``gpu[01-03,07],head``) -> the names; () for none."""
    text = text.strip()
    if text in ("", "None assigned", "(null)", "None"):
        return ()
    return tuple(expand_hostlist(text))


def tres_gpus(text: str) -> int:
    """Allocated GPUs from AllocTRES (``cpu=2,gres/gpu:a100=2,gres/gpu=2,...``): the untyped
    count where sacct gives one, else the sum of the typed ones."""
    counts: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            counts[key.strip()] = value.strip()
    if "gres/gpu" in counts:
        return int(counts["gres/gpu"])
    return sum(int(v) for k, v in counts.items() if k.startswith("gres/gpu:"))


def _epoch(text: str) -> float | None:
    """sacct's time under SLURM_TIME_FORMAT=%s; None for Unknown/None (not started, running)."""
    text = text.strip()
    if text.isdigit():
        return float(text)
    if text in ("Unknown", "None", ""):
        return None
    raise ValueError(f"time {text!r} is not epoch seconds (SLURM_TIME_FORMAT=%s)")


def parse_sacct(text: str) -> tuple[list[Job], list[str]]:
    """Jobs that held GPUs from ``sacct_command``'s output, and a problem per line it could
    not read (``sacct line N: ...``). Jobs that never started or held no GPU are left out."""
    jobs: list[Job] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) != len(SACCT_FIELDS):
            problems.append(f"sacct line {number}: {len(cells)} fields, not {len(SACCT_FIELDS)}: {line.strip()[:120]}")
            continue
        row = dict(zip(SACCT_FIELDS, (c.strip() for c in cells), strict=True))
        try:
            start, end = _epoch(row["Start"]), _epoch(row["End"])
            gpus = tres_gpus(row["AllocTRES"])
            nodes = hostlist(row["NodeList"])
        except ValueError as exc:
            problems.append(f"sacct line {number}: {exc}")
            continue
        if start is None or gpus <= 0:
            continue
        jobs.append(Job(row["JobIDRaw"], row["JobID"], row["User"] or "?", row["Account"] or "?",
                        row["Partition"] or "?", nodes, gpus, start, end, row["State"].split(" ")[0]))
    return jobs, problems


def held(job: Job, win: Window) -> tuple[float, float]:
    """The part of the window in which the job held its GPUs (empty: end <= start)."""
    end = job.end if job.end is not None else win.until
    return max(job.start, win.since), min(end, win.until)


# --------------------------------------------------------------------------- Prometheus
@dataclass(frozen=True)
class Series:
    job_id: str
    node: str
    gpu: str
    samples: tuple[tuple[float, float], ...]  # (t, value), t ascending


def query_points(win: Window, step: float) -> list[tuple[float, float]]:
    """(start, end) of each range query over the window: points at multiples of ``step``, from
    the first after ``since`` to the first at or after ``until``, at most MAX_POINTS each."""
    first = (math.floor(win.since / step) + 1) * step
    last = math.ceil(win.until / step) * step
    out: list[tuple[float, float]] = []
    start = first
    while start <= last:
        end = min(last, start + (MAX_POINTS - 1) * step)
        out.append((start, end))
        start = end + step
    return out


def parse_matrix(payload: Mapping[str, Any]) -> list[Series]:
    """A query_range answer's series that carry hpc_job; raises ValueError on an error answer."""
    if payload.get("status") != "success":
        raise ValueError(f"{payload.get('errorType', 'error')}: {payload.get('error', 'no status success')}")
    data = payload.get("data") or {}
    if data.get("resultType") != "matrix":
        raise ValueError(f"expected a matrix, got {data.get('resultType')!r}")
    out: list[Series] = []
    for item in data.get("result") or []:
        labels = item.get("metric") or {}
        job = labels.get("hpc_job", "")
        if not job:
            continue
        samples = []
        for t, v in item.get("values") or []:
            value = float(v)
            if math.isfinite(value):
                samples.append((float(t), value))
        out.append(Series(job, labels.get("node", "?"), labels.get("gpu", "?"), tuple(samples)))
    return out


def merge_series(parts: Iterable[Series]) -> list[Series]:
    """The pieces of each (job, node, gpu) series from several range queries, joined."""
    merged: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for s in parts:
        merged.setdefault((s.job_id, s.node, s.gpu), []).extend(s.samples)
    return [Series(j, n, g, tuple(sorted(dict(samples).items()))) for (j, n, g), samples in sorted(merged.items())]


def integrate(samples: Sequence[tuple[float, float]], a: float, b: float, step: float) -> tuple[float, float]:
    """(measured seconds, value x seconds) of the steps ``(t - step, t]`` inside ``[a, b]``."""
    measured = weighted = 0.0
    for t, value in samples:
        lo, hi = max(t - step, a), min(t, b)
        if hi > lo:
            measured += hi - lo
            weighted += value * (hi - lo)
    return measured, weighted
