"""Terminal output with rich: plan tables, live apply progress, recap, BMC and install tables.

(Diagnostics are printed by ``provisioner.commands.common``: validate needs nothing else.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from provisioner.manifest.ranges import contract

if TYPE_CHECKING:  # types only: the plan command must not import paramiko, the BMC drivers, ...
    from provisioner.areas.registry import InstallOutcome
    from provisioner.bmc import BmcRow
    from provisioner.live import LiveRead
    from provisioner.plan import Plan
    from provisioner.runner import RunResult, Tracker

STATUS_STYLE = {"new": "green", "changed": "yellow", "unchanged": "dim", "removed": "red"}


PlanRow = tuple[str, str, str, str, str, str]  # node(s), status, lifecycle, install, changed sections, plays


def plan_rows(plan: Plan) -> list[PlanRow]:
    """One row per run of consecutive nodes that share every other column, named by a range
    (``gpu[0001-2000]``, as --limit takes it): a 2,000-node plan is a few rows to read, and
    to render."""
    rows: list[PlanRow] = []
    run: list[str] = []
    last: tuple[str, str, str, str, str] | None = None

    def close() -> None:
        if last is not None:
            rows.extend((name, *last) for name in contract(run))

    for node in plan.nodes:
        sections = ", ".join(node.sections) if node.status == "changed" else ""
        install = node.install or "-"
        cells = (node.status, node.lifecycle, install, sections, ", ".join(node.plays) if node.plays else "-")
        if cells != last:
            close()
            run, last = [], cells
        run.append(node.name)
    close()
    return rows


def plan_table(plan: Plan, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("node")
    table.add_column("status")
    table.add_column("lifecycle")
    if plan.installs:
        table.add_column("install (destructive)")
    table.add_column("changed sections")
    table.add_column("plays that will run")
    for nodes, status, lifecycle, install, sections, plays in plan_rows(plan):
        style = STATUS_STYLE.get(status, "")
        cells = [f"[bold red]{escape(install)}[/]" if install != "-" else install] if plan.installs else []
        table.add_row(escape(nodes), f"[{style}]{status}[/]", lifecycle, *cells, sections, plays)
    return table


def print_plan(console: Console, plan: Plan, cluster: str) -> None:
    console.print(plan_table(plan, f"plan for cluster {cluster}"))
    counts = {s: sum(1 for n in plan.nodes if n.status == s) for s in STATUS_STYLE}
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    files = "cluster-wide files change" if plan.cluster_files_change else "cluster-wide files unchanged"
    heavy = ", ".join(plan.targets) if plan.targets else "none"
    console.print(f"{summary}; {files}; node-local plays on: {heavy}", highlight=False)
    if plan.installs:
        console.print(f"PXE installs (they wipe the install disks): {', '.join(plan.installs)}",
                      style="bold red", markup=False, highlight=False)
    by_text: dict[str, list[str]] = {}
    for node in plan.nodes:
        if node.formats:
            by_text.setdefault(node.formats, []).append(node.name)
    for text, names in by_text.items():  # destructive where the disks are blank (or forced)
        console.print(f"{', '.join(contract(names))}: {text}", style="bold red", markup=False, highlight=False)
    left: dict[str, list[str]] = {}
    for node in plan.nodes:
        if node.install_only:
            left.setdefault(node.install_only, []).append(node.name)
    for text, names in left.items():  # what this apply does not build (a management bond)
        console.print(f"{', '.join(contract(names))}: {text}", style="yellow", markup=False, highlight=False)
    for upgrade in plan.upgrades:
        if upgrade.steps:
            console.print(f"{upgrade.area} upgrade, in this order:", highlight=False, markup=False)
        for n, step in enumerate(upgrade.steps, start=1):
            console.print(f"  {n}. {step}", highlight=False, markup=False)
        if upgrade.refusal:
            console.print(f"{upgrade.area} upgrade refused: {upgrade.refusal}", style="bold red", markup=False,
                          highlight=False)


def print_live(console: Console, reads: Sequence[LiveRead]) -> None:
    """What plan read from running services: each one's drift, or why it was not read."""
    for r in reads:
        where = f"{r.service} (read on {r.node})"
        if r.error:
            console.print(f"{r.service}: not read: {r.error}", style="yellow", markup=False, highlight=False)
        elif not r.changes:
            console.print(f"{where}: matches the manifest", markup=False, highlight=False)
        else:
            console.print(f"{where}: apply would make {r.pending} change(s):", markup=False, highlight=False)
            for _, line in r.changes:
                console.print(f"  {line}", markup=False, highlight=False)


class LiveProgress:
    """A live per-host table while a playbook runs (plain lines when not a terminal)."""

    def __init__(self, console: Console, title: str, *, enabled: bool = True) -> None:
        self.console = console
        self.title = title
        self.enabled = enabled  # off with -v: Ansible's own output goes to the terminal instead
        self.live: Live | None = None
        self._last = 0.0
        self._seen_errors: dict[str, int] = {}

    def render(self, tracker: Tracker) -> Table:
        table = Table(title=f"{self.title} — {tracker.play}", title_justify="left")
        for col in ("host", "role", "task", "time", "ok", "changed", "failed", "state"):
            table.add_column(col)
        now = tracker.clock()
        for p in tracker.hosts.values():
            state = {"ok": "[green]running[/]", "failed": "[red]failed[/]", "unreachable": "[red]unreachable[/]"}
            took = f"{p.elapsed(now):.0f}s" if p.task_started is not None else ""
            if p.attempt:
                took += f" (retry {p.attempt})"
            table.add_row(p.host, p.role, p.task[:60], took, str(p.ok), str(p.changed), str(p.failed),
                          state[p.status])
        return table

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal and self.enabled:
            self.live = Live(console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            with contextlib.suppress(OSError):  # the terminal may be gone (SIGHUP)
                self.live.__exit__(None, None, None)

    def update(self, tracker: Tracker) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            now = time.monotonic()
            if now - self._last > 0.2:
                self.live.update(self.render(tracker))
                self._last = now
            return
        for p in tracker.hosts.values():  # not a terminal: print each new failure once
            seen = self._seen_errors.get(p.host, 0)
            for err in p.errors[seen:]:
                with contextlib.suppress(OSError):
                    self.console.print(f"{p.host}: FAILED {err}", style="red", markup=False, highlight=False)
            self._seen_errors[p.host] = len(p.errors)


def install_table(results: Sequence[InstallOutcome]) -> Table:
    table = Table(title="bare-metal installs", title_justify="left")
    for col in ("node", "result", "stage", "seconds", "reason"):
        table.add_column(col)
    for r in results:
        style = "green" if r.ok else "red"
        table.add_row(r.node, f"[{style}]{'ok' if r.ok else 'failed'}[/]", r.stage, f"{r.seconds:.0f}",
                      "; ".join([r.reason, *r.warnings]))
    return table


def bmc_table(rows: Sequence[BmcRow], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("node", "bmc", "address", "power", "next boot", "result"):
        table.add_column(col)
    for row in rows:
        result = "[green]ok[/]" if row.ok else f"[red]{row.message}[/]"
        if row.ok and row.warnings:
            result += " [yellow]" + "; ".join(row.warnings) + "[/]"
        table.add_row(row.node, row.type, row.address, row.power or "", row.boot or "", result)
    return table


RESULT_STYLE = {"ok": "green", "not run": "yellow", "interrupted": "yellow"}


def recap_table(result: RunResult, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("host", "ok", "changed", "failed", "skipped", "time", "result", "first error"):
        table.add_column(col)
    for name in sorted(result.hosts):
        p = result.hosts[name]
        outcome = result.result_of(name)
        style = RESULT_STYLE.get(outcome, "red")
        table.add_row(
            escape(name), str(p.ok), str(p.changed), str(p.failed), str(p.skipped), f"{p.busy:.0f}s",
            f"[{style}]{outcome}[/]", escape(p.errors[0]) if p.errors else "",
        )
    return table


def print_diffs(console: Console, result: RunResult, secrets: Sequence[str] = ()) -> None:
    """What a check run would change, per node and task, as unified diffs (Ansible's
    --diff). A diff that shows a known secret value is withheld."""
    needles = [s for s in secrets if len(s) >= 4]
    for name in sorted(result.hosts):
        for task, text in result.hosts[name].diffs:
            if not text.strip():
                continue
            console.print(f"--- {name}: {task}", style="bold", markup=False, highlight=False)
            if any(n in text for n in needles):
                console.print("(diff withheld: it shows a secret)", markup=False, highlight=False)
                continue
            console.print(text.rstrip("\n"), markup=False, highlight=False)
