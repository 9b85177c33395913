"""The usage report (:mod:`provisioner.areas.monitoring.usage`) as JSON, CSV, a text table and
one self-contained HTML file (inline CSS and SVG: no script, nothing fetched)."""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import json
from collections.abc import Sequence
from typing import Any

from provisioner.areas.monitoring.usage import Report, Row, Timeline

COLUMNS = ("jobs", "gpu_h_allocated", "gpu_h_used", "gpu_h_measured", "gpu_h_unmeasured", "idle_share",
           "energy_kwh", "cost")


def when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def row_dict(row: Row) -> dict[str, Any]:
    return {"jobs": row.jobs, "gpu_h_allocated": _r(row.allocated_h), "gpu_h_used": _r(row.used_h),
            "gpu_h_measured": _r(row.measured_h), "gpu_h_unmeasured": _r(row.unmeasured_h),
            "idle_share": _r(row.idle_share), "energy_kwh": _r(row.energy_kwh), "cost": _r(row.cost, 2),
            "gpu_h_unpriced": _r(row.unpriced_h)}


def to_json(r: Report) -> str:
    data = {
        "cluster": r.cluster, "since": when(r.window.since), "until": when(r.window.until),
        "since_epoch": r.window.since, "until_epoch": r.window.until, "by": r.by, "step_s": r.step,
        "currency": r.currency, "sources": r.sources,
        "rows": [{r.by: row.key, **row_dict(row)} for row in r.rows],
        "total": {**row_dict(r.total), "gpu_h_capacity": _r(r.capacity_h),
                  "allocated_share": _r(r.total.allocated_h / r.capacity_h) if r.capacity_h else None},
        "top_idle_jobs": [{"job": i.job_id, "user": i.user, "account": i.account, "gpus": i.gpus,
                           "hours_held": _r(i.held_h), "mean_utilization": _r(i.mean_utilization),
                           "idle_gpu_h": _r(i.idle_gpu_h)} for i in r.top_idle],
        "unknown": list(r.notes),
    }
    return json.dumps(data, indent=2)


def to_csv(r: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([r.by, *COLUMNS])
    for row in (*r.rows, r.total):
        d = row_dict(row)
        w.writerow([row.key, *("" if d[c] is None else d[c] for c in COLUMNS)])
    return buf.getvalue()


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value * 100:.0f}%"


def _cells(row: Row, currency: str) -> list[str]:
    cost = f"{row.cost:,.2f} {currency}".strip() if currency else "-"
    if row.unpriced_h > 0 and currency:
        cost += " +?"
    return [row.key, str(row.jobs), f"{row.allocated_h:.2f}", f"{row.used_h:.2f}", _share(row.idle_share),
            f"{row.unmeasured_h:.2f}", f"{row.energy_kwh:.2f}", cost]


HEADERS = ("", "jobs", "GPU-h held", "GPU-h used", "idle", "GPU-h unmeasured", "kWh", "cost")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    fmt = [(str.ljust if i == 0 else str.rjust) for i in range(len(header))]
    return ["  ".join(f(str(c), w) for f, c, w in zip(fmt, row, widths, strict=True)).rstrip()
            for row in (header, *rows)]


def to_table(r: Report) -> str:
    lines = [f"GPU usage of {r.cluster}, {when(r.window.since)} to {when(r.window.until)}, by {r.by}"]
    header = (r.by, *HEADERS[1:])
    lines += _table(header, [_cells(row, r.currency) for row in (*r.rows, r.total)])
    if r.capacity_h:
        lines.append(f"held {r.total.allocated_h:.2f} of {r.capacity_h:.2f} GPU-h the manifest's GPUs had in the "
                     f"window ({r.total.allocated_h / r.capacity_h * 100:.0f}%)")
    if r.top_idle:
        lines += ["", "top idle jobs"]
        lines += _table(("job", "user", "account", "GPUs", "hours held", "mean util", "idle GPU-h"),
                        [(i.job_id, i.user, i.account, str(i.gpus), f"{i.held_h:.2f}",
                          _share(i.mean_utilization), f"{i.idle_gpu_h:.2f}") for i in r.top_idle])
    if r.notes:
        lines += ["", "what the report could not know"]
        lines += [f"- {n}" for n in r.notes]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- HTML
PANEL_W, PANEL_H, LEFT, BOTTOM, TOP = 760, 150, 48, 22, 10


def _points(values: Sequence[float], top: float, edges: Sequence[float]) -> str:
    """An SVG polygon's points: a step line over the bins, closed along the axis."""
    width = PANEL_W - LEFT - 10
    height = PANEL_H - BOTTOM - TOP
    n = len(values)
    pts: list[tuple[float, float]] = [(LEFT, TOP + height)]
    for i, v in enumerate(values):
        y = TOP + height - (v / top) * height if top else TOP + height
        pts += [(LEFT + width * i / n, y), (LEFT + width * (i + 1) / n, y)]
    pts.append((LEFT + width, TOP + height))
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)


def panel(account: str, allocated: Sequence[float], used: Sequence[float], edges: Sequence[float]) -> str:
    top = max([*allocated, *used, 1.0])
    width, height = PANEL_W - LEFT - 10, PANEL_H - BOTTOM - TOP
    ticks = []
    for frac in (0.0, 0.5, 1.0):
        y = TOP + height - frac * height
        ticks.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + width}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{top * frac:.1f}</text>')
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        x = LEFT + width * frac
        t = edges[0] + (edges[-1] - edges[0]) * frac
        ticks.append(f'<text x="{x:.1f}" y="{PANEL_H - 6}" text-anchor="{anchor}">{html.escape(when(t))}</text>')
    return (f'<figure><figcaption>{html.escape(account)}: GPUs held (light) and used (dark)</figcaption>'
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{PANEL_W}" height="{PANEL_H}" role="img" '
            f'aria-label="GPUs held and used by {html.escape(account, quote=True)}">'
            f'{"".join(ticks)}'
            f'<polygon class="held" points="{_points(allocated, top, edges)}"/>'
            f'<polygon class="used" points="{_points(used, top, edges)}"/>'
            f'</svg></figure>')


def plots(t: Timeline) -> str:
    return "\n".join(panel(acct, t.allocated[acct], t.used.get(acct, ()) or [0.0] * len(t.allocated[acct]),
                           t.edges) for acct in t.allocated)


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.total td { font-weight: bold; border-top: 2px solid #888; }
svg text { font-size: 11px; fill: #555; }
svg .grid { stroke: #eee; }
svg .held { fill: #9ecae1; }
svg .used { fill: #08519c; fill-opacity: 0.85; }
figure { margin: 0 0 1em; }
figcaption { font-weight: bold; }
"""


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], total: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    if total is not None:
        body += '<tr class="total">' + "".join(f"<td>{html.escape(c)}</td>" for c in total) + "</tr>"
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def to_html(r: Report) -> str:
    title = f"GPU usage of {r.cluster}"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(when(r.window.since))} to {html.escape(when(r.window.until))}; allocations from Slurm's "
        "accounting, use and power from Prometheus' per-job GPU series "
        f"(step {r.step:g} s). Idle share: of the measured GPU-hours.</p>",
        f"<h2>By {html.escape(r.by)}</h2>",
        _html_table((r.by, *HEADERS[1:]), [_cells(row, r.currency) for row in r.rows],
                    _cells(r.total, r.currency)),
    ]
    if r.capacity_h:
        parts.append(f"<p>Held {r.total.allocated_h:.2f} of the {r.capacity_h:.2f} GPU-hours the manifest's GPUs "
                     f"had in the window ({r.total.allocated_h / r.capacity_h * 100:.0f}%).</p>")
    parts += ["<h2>GPUs held and used over time, per account</h2>", plots(r.timeline) or "<p>No GPU jobs.</p>"]
    if r.top_idle:
        parts += ["<h2>Top idle jobs</h2>", _html_table(
            ("job", "user", "account", "GPUs", "hours held", "mean utilization", "idle GPU-h"),
            [(i.job_id, i.user, i.account, str(i.gpus), f"{i.held_h:.2f}", _share(i.mean_utilization),
              f"{i.idle_gpu_h:.2f}") for i in r.top_idle])]
    parts.append("<h2>What the report could not know</h2>")
    parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in r.notes) + "</ul>" if r.notes
                 else "<p>Nothing: every job's GPUs had series for all of the time they were held.</p>")
    if r.sources:
        parts.append("<p>Sources: " + html.escape("; ".join(f"{k}: {v}" for k, v in r.sources.items())) + "</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
