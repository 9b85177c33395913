"""`provision report usage`: who held which GPUs, how much of that they used, what idled, and
what it cost (docs/usage.md).

Two sources, joined by job id: Slurm's accounting (``sacct`` on the controller: the GPUs each
job was allocated and when it held them) and Prometheus' per-job GPU series (the Slurm prolog's
job map puts the job id into the ``hpc_job`` label of DCGM's and the nvidia-smi collector's
series). Everything here is pure: the command text, the parsers and the arithmetic; the SSH and
HTTP edges are passed in (:func:`gather`). Amounts are GPU-seconds and joules inside, GPU-hours
and kWh in :class:`Row`.

How a Prometheus range query becomes GPU-seconds: the query is evaluated every ``step``
seconds, at multiples of ``step``; the value at ``t`` (the latest sample at or before ``t``)
stands for the step that ends at ``t``, ``(t - step, t]``. A job's measured time is the part of
those steps inside the time it held its GPUs; its used GPU-seconds the utilization times that
time. Steps without a value are not measured: they count as *unmeasured*, never as idle or
busy, and the idle share is taken over measured time only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.areas.monitoring.decide import PROMETHEUS_PORT, server_names
from provisioner.areas.monitoring.usage_sources import (
    Job,
    Series,
    UsageError,
    Window,
    held,
    integrate,
    merge_series,
    parse_matrix,
    parse_sacct,
    query_points,
    sacct_command,
    step_of,
)
from provisioner.errors import ProvisionError
from provisioner.manifest.model import Manifest
from provisioner.manifest.monitoring import GpuCost

HOURS_PER_YEAR = 8766.0  # 365.25 days
GROUPINGS = ("user", "account", "partition", "node")
GAP_STEPS = 3  # unmeasured steps per GPU a job may have before it is named (its first and last steps)
TOP_IDLE = 10
LISTED = 10  # job ids named per note

# The per-job GPU series, as the prometheus role's recording rules define them
# (roles/prometheus/files/provision-records.yml; tests/areas/monitoring/test_usage.py keeps
# them equal). The report asks for the expressions, not the recorded names: they answer for
# history from before the rules existed and for data loaded into Prometheus afterwards.
UTILIZATION_EXPR = (
    'max by (node, gpu, hpc_job) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""} / 100) '
    'or max by (node, gpu, hpc_job) (provision_gpu_utilization_ratio{hpc_job!=""})'
)
POWER_EXPR = (
    'max by (node, gpu, hpc_job) (DCGM_FI_DEV_POWER_USAGE{hpc_job!=""}) '
    'or max by (node, gpu, hpc_job) (provision_gpu_power_watts{hpc_job!=""})'
)


# --------------------------------------------------------------------------- the arithmetic
@dataclass
class Amounts:
    """GPU-seconds and joules of one row, job or node share of a job."""

    allocated: float = 0.0
    measured: float = 0.0
    used: float = 0.0
    energy_j: float = 0.0
    cost: float = 0.0
    unpriced: float = 0.0  # allocated GPU-seconds without a price

    def add(self, other: Amounts) -> None:
        self.allocated += other.allocated
        self.measured += other.measured
        self.used += other.used
        self.energy_j += other.energy_j
        self.cost += other.cost
        self.unpriced += other.unpriced


@dataclass(frozen=True)
class JobUsage:
    job: Job
    held_s: float
    per_node: dict[str, Amounts]
    series: int  # GPU series found
    powered: bool  # power series found

    @property
    def amounts(self) -> Amounts:
        total = Amounts()
        for a in self.per_node.values():
            total.add(a)
        return total


def gpu_cost(m: Manifest, node: str) -> tuple[str, GpuCost | None]:
    """(GPU model, its price) of a node ("" for a node the manifest does not list or without GPUs)."""
    try:
        gpu = m.node(node).hardware.gpu
    except KeyError:
        return "", None
    if gpu is None:
        return "", None
    prices = m.cost.gpus if m.cost is not None else {}
    return gpu.model, prices.get(gpu.model)


def price(amounts: Amounts, cost: GpuCost | None) -> None:
    """Fill in the cost of ``amounts`` (allocated GPU-seconds, measured energy)."""
    hours = amounts.allocated / 3600
    if cost is None:
        amounts.unpriced = amounts.allocated
    elif cost.price_per_gpu_hour is not None:
        amounts.cost = hours * cost.price_per_gpu_hour
    else:
        assert cost.purchase_price is not None and cost.depreciation_years is not None
        assert cost.power_price_per_kwh is not None
        amounts.cost = (hours * cost.purchase_price / (cost.depreciation_years * HOURS_PER_YEAR)
                        + amounts.energy_j / 3.6e6 * cost.power_price_per_kwh)


def job_usage(m: Manifest, job: Job, win: Window, util: Sequence[Series], power: Sequence[Series],
              step: float) -> JobUsage:
    """One job's amounts per node: its allocation split evenly over its nodes (sacct gives the
    job's total), what its series measured on each node, capped at the allocation."""
    a, b = held(job, win)
    seconds = max(0.0, b - a)
    nodes = job.nodes or ("?",)
    per_node = {n: Amounts(allocated=job.gpus * seconds / len(nodes)) for n in nodes}
    for s in util:
        measured, used = integrate(s.samples, a, b, step)
        share = per_node.setdefault(s.node, Amounts())
        share.measured += measured
        share.used += used
    for s in power:
        _, joules = integrate(s.samples, a, b, step)
        per_node.setdefault(s.node, Amounts()).energy_j += joules
    for node, share in per_node.items():
        if share.measured > share.allocated:  # more series than GPUs: never more than was held
            scale = share.allocated / share.measured if share.measured else 0.0
            share.measured, share.used, share.energy_j = share.allocated, share.used * scale, share.energy_j * scale
        price(share, gpu_cost(m, node)[1])
    return JobUsage(job, seconds, per_node, len(util), bool(power))


@dataclass(frozen=True)
class Row:
    key: str
    jobs: int
    allocated_h: float
    measured_h: float
    used_h: float
    unmeasured_h: float
    idle_share: float | None  # of the measured GPU-hours; None: nothing measured
    energy_kwh: float
    cost: float
    unpriced_h: float

    @classmethod
    def of(cls, key: str, jobs: int, a: Amounts) -> Row:
        return cls(key, jobs, a.allocated / 3600, a.measured / 3600, a.used / 3600,
                   max(0.0, a.allocated - a.measured) / 3600,
                   (1 - a.used / a.measured) if a.measured > 0 else None, a.energy_j / 3.6e6, a.cost,
                   a.unpriced / 3600)


@dataclass(frozen=True)
class IdleJob:
    job_id: str
    user: str
    account: str
    gpus: int
    held_h: float
    mean_utilization: float
    idle_gpu_h: float


@dataclass(frozen=True)
class Timeline:
    """Allocated and used GPUs per account, averaged over equal bins of the window."""

    edges: tuple[float, ...]  # bin boundaries, len = bins + 1
    allocated: dict[str, tuple[float, ...]]
    used: dict[str, tuple[float, ...]]


@dataclass(frozen=True)
class Report:
    cluster: str
    window: Window
    by: str
    step: float
    currency: str
    rows: tuple[Row, ...]
    total: Row
    capacity_h: float  # the manifest's GPUs x the window
    top_idle: tuple[IdleJob, ...]
    timeline: Timeline
    notes: tuple[str, ...]
    sources: dict[str, str] = field(default_factory=dict)


def _keys(job: Job, by: str, node: str) -> str:
    return {"user": job.user, "account": job.account, "partition": job.partition, "node": node}[by]


def _these(jobs: Sequence[JobUsage], one: str, many: str) -> str:
    """'1 job has' / '3 jobs have'."""
    return f"1 job {one}" if len(jobs) == 1 else f"{len(jobs)} jobs {many}"


def _ids(jobs: Sequence[JobUsage]) -> str:
    ids = [u.job.shown_id for u in jobs[:LISTED]]
    more = f" and {len(jobs) - LISTED} more" if len(jobs) > LISTED else ""
    return ", ".join(ids) + more


def timeline(usages: Sequence[JobUsage], util: Mapping[str, Sequence[Series]], win: Window, step: float,
             bins: int = 120) -> Timeline:
    """Mean allocated and used GPUs per account in ``bins`` equal parts of the window."""
    width = win.seconds / bins
    edges = tuple(win.since + i * width for i in range(bins + 1))
    alloc: dict[str, list[float]] = {}
    used: dict[str, list[float]] = {}

    def spread(into: list[float], lo: float, hi: float, amount_per_s: float) -> None:
        if hi <= lo:
            return
        first, last = int((lo - win.since) // width), int(min(bins - 1, (hi - win.since) // width))
        for i in range(max(0, first), last + 1):
            overlap = min(hi, edges[i + 1]) - max(lo, edges[i])
            if overlap > 0:
                into[i] += amount_per_s * overlap / width

    for u in usages:
        a, b = held(u.job, win)
        acct = u.job.account
        spread(alloc.setdefault(acct, [0.0] * bins), a, b, u.job.gpus)
        series_used = used.setdefault(acct, [0.0] * bins)
        for s in util.get(u.job.job_id, ()):
            for t, value in s.samples:
                spread(series_used, max(t - step, a), min(t, b), value)
    return Timeline(edges, {k: tuple(v) for k, v in sorted(alloc.items())},
                    {k: tuple(v) for k, v in sorted(used.items())})


def by_job(series: Sequence[Series] | None) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for s in series or ():
        out.setdefault(s.job_id, []).append(s)
    return out


def rows_of(usages: Sequence[JobUsage], by: str) -> tuple[list[Row], Row]:
    """One row per user, account, partition or node (most GPU-hours held first), and the total."""
    rows: dict[str, Amounts] = {}
    counted: dict[str, set[str]] = {}
    total = Amounts()
    for u in usages:
        for node, share in u.per_node.items():
            key = _keys(u.job, by, node)
            rows.setdefault(key, Amounts()).add(share)
            counted.setdefault(key, set()).add(u.job.job_id)
            total.add(share)
    listed = sorted((Row.of(k, len(counted[k]), a) for k, a in rows.items()), key=lambda r: (-r.allocated_h, r.key))
    return listed, Row.of("total", len(usages), total)


def idle_jobs(usages: Sequence[JobUsage]) -> list[IdleJob]:
    """Measured jobs, most idle GPU-hours (measured - used) first."""
    idle = [IdleJob(u.job.shown_id, u.job.user, u.job.account, u.job.gpus, u.held_s / 3600,
                    a.used / a.measured, (a.measured - a.used) / 3600)
            for u in usages if (a := u.amounts).measured > 0]
    return sorted(idle, key=lambda i: (-i.idle_gpu_h, i.job_id))


def series_notes(usages: Sequence[JobUsage], step: float) -> list[str]:
    """Jobs without GPU series, with gaps (more than GAP_STEPS steps per GPU unmeasured), without power."""
    out: list[str] = []
    missing = [u for u in usages if u.series == 0]
    if missing:
        hours = sum(u.amounts.allocated for u in missing) / 3600
        out.append(f"{_these(missing, f'({hours:.2f} GPU-h) has', f'({hours:.2f} GPU-h) have')} no GPU series in "
                   f"Prometheus: used GPU-hours and energy unknown ({_ids(missing)})")
    gaps = [u for u in usages if u.series and u.amounts.allocated - u.amounts.measured > GAP_STEPS * step * u.job.gpus]
    if gaps:
        lost = sum(u.amounts.allocated - u.amounts.measured for u in gaps) / 3600
        out.append(f"{_these(gaps, 'has', 'have')} gaps in GPU series: {lost:.2f} GPU-h of theirs unmeasured "
                   f"({_ids(gaps)})")
    unpowered = [u for u in usages if u.series and not u.powered]
    if unpowered:
        out.append(f"{_these(unpowered, 'has', 'have')} no GPU power series: energy unknown ({_ids(unpowered)})")
    return out


def cost_notes(m: Manifest, usages: Sequence[JobUsage]) -> list[str]:
    """GPU-hours held on GPU models without a price, or on nodes the manifest has no GPUs for
    (nothing without a cost section: no cost was asked for)."""
    if m.cost is None:
        return []
    unpriced: dict[str, float] = {}
    for u in usages:
        for node, share in u.per_node.items():
            if share.unpriced:
                model = gpu_cost(m, node)[0]
                what = (f"GPU model {model!r} has no price in cost.gpus" if model
                        else f"node {node} is not a GPU node of the manifest")
                unpriced[what] = unpriced.get(what, 0.0) + share.unpriced / 3600
    return [f"{what}: {hours:.2f} GPU-h without a cost" for what, hours in sorted(unpriced.items())]


def build(m: Manifest, jobs: Sequence[Job], util: Sequence[Series] | None, power: Sequence[Series] | None,
          win: Window, by: str, step: float, notes: Sequence[str] = (), top: int = TOP_IDLE) -> Report:
    """The report from sacct's jobs and Prometheus' series (None: Prometheus not asked or not
    answering; ``notes`` says why)."""
    if by not in GROUPINGS:
        raise UsageError(f"--by {by}: one of {', '.join(GROUPINGS)}")
    util_by_job, power_by_job = by_job(util), by_job(power)
    every = (job_usage(m, j, win, util_by_job.get(j.job_id, []), power_by_job.get(j.job_id, []), step) for j in jobs)
    usages = [u for u in every if u.held_s > 0]  # a job that held nothing in the window is not in it
    rows, total = rows_of(usages, by)
    out = [*notes, *(series_notes(usages, step) if util is not None else []), *cost_notes(m, usages)]
    return Report(
        cluster=m.cluster.name, window=win, by=by, step=step,
        currency=m.cost.currency if m.cost is not None else "",
        rows=tuple(rows), total=total, capacity_h=sum(n.gpu_count for n in m.nodes) * win.seconds / 3600,
        top_idle=tuple(idle_jobs(usages)[:top]), timeline=timeline(usages, util_by_job, win, step), notes=tuple(out))


# --------------------------------------------------------------------------- the edges, passed in
RunOnController = Callable[[str], str]  # command text -> stdout; raises UsageError when it fails
QueryRange = Callable[[str, float, float, float], Mapping[str, Any]]  # (expr, start, end, step) -> JSON


def prometheus_url(m: Manifest) -> str | None:
    """The first monitoring server's Prometheus (None without monitoring)."""
    if m.monitoring is None:
        return None
    return f"http://{m.node(server_names(m)[0]).ip}:{PROMETHEUS_PORT}"


def fetch_series(query: QueryRange, expr: str, win: Window, step: float) -> list[Series]:
    parts: list[Series] = []
    for start, end in query_points(win, step):
        parts += parse_matrix(query(expr, start, end, step))
    return merge_series(parts)


def gather(m: Manifest, win: Window, by: str, now: float, run_sacct: RunOnController, query: QueryRange | None,
           where: str = "", top: int = TOP_IDLE) -> Report:
    """Ask Slurm (required) and Prometheus (``query`` None: not asked; ``where`` says which),
    then build the report."""
    jobs, notes = parse_sacct(run_sacct(sacct_command(win, now)))
    step = step_of(m)
    util = power = None
    if query is None:
        notes.append("no Prometheus to ask (the manifest has no monitoring section; --prometheus URL names one): "
                     "used GPU-hours, idle share and energy are unknown")
    else:
        try:
            util = fetch_series(query, UTILIZATION_EXPR, win, step)
            power = fetch_series(query, POWER_EXPR, win, step)
        except (ProvisionError, ValueError) as exc:
            notes.append(f"Prometheus at {where} did not answer ({exc}): used GPU-hours, idle share and energy "
                         "are unknown")
            util = power = None
    return build(m, jobs, util, power, win, by, step, notes, top)
