"""`provision apply MANIFEST`: make the cluster match the manifest (provisioner.apply);
with ``--rolling``, Slurm compute nodes with node-local changes roll a batch at a time
(provisioner.rolling; the side effects are composed here)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from provisioner.apply import ApplyOptions, Ran, apply, settle_cluster_files
from provisioner.commands.common import guarded, limit, load
from provisioner.content import project_root
from provisioner.drain import COMMAND_TIMEOUT, drain_command, drain_node, resume_node, why_failed
from provisioner.errors import ProvisionError
from provisioner.gate import GATE_PREFIX, Admission, AdmitSteps, Finding, admit, findings
from provisioner.manifest.load import Loaded
from provisioner.plan import compute, load_plays
from provisioner.rolling import REASON_PREFIX, Roll, Steps, batches, roll
from provisioner.state import StateDir
from provisioner.verify import catalog
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor
from provisioner.verify.run import Execute, verify


@dataclass
class Report:
    """What an apply did, for ``--json`` (docs/operations.md, "Output")."""

    ran: list[Ran] = field(default_factory=list)  # each run of site.yml, in order
    roll: Roll | None = None
    gate: list[Admission] | None = None

    def to_json(self, rc: int, cluster: str, check: bool, nodes: list[str]) -> dict[str, Any]:
        last: dict[str, str] = {}
        for r in self.ran:
            last.update(r.nodes)
        return {
            "ok": rc == 0, "cluster": cluster, "check": check,
            "nodes": [{"node": n, "result": last.get(n)} for n in nodes],
            "runs": [r.to_json() for r in self.ran],
            "rolling": None if self.roll is None else {
                "ok": self.roll.ok, "stopped_at": self.roll.failed or None, "done": self.roll.done,
                "left_drained": self.roll.left_drained, "not_drained": self.roll.not_drained,
                "untouched": self.roll.untouched,
                "steps": [{"node": e.node or None, "step": e.stage, "ok": e.ok, "detail": e.detail}
                          for e in self.roll.events]},
            "gate": None if self.gate is None else [{"node": a.node, "result": a.verdict, "detail": a.detail}
                                                    for a in self.gate],
        }


REBOOT_TIMEOUT = 900  # seconds for a rebooted node to answer again
REBOOT_POLL = 10.0
BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def options(loaded: Loaded, args: argparse.Namespace, nodes: list[str] | None) -> ApplyOptions:
    return ApplyOptions(limit=nodes, check=args.check, yes=args.yes, full=args.full,
                        reinstall=limit(loaded, args.reinstall, "--reinstall") or [],
                        install_timeout=args.install_timeout, stall_timeout=args.stall_timeout,
                        strategy=args.strategy, verbosity=args.verbose)


def rolling_nodes(loaded: Loaded, state: StateDir, nodes: list[str] | None, full: bool) -> list[str]:
    """Slurm compute nodes whose node-local plays would run (the plan's targets)."""
    m = loaded.manifest
    plan = compute(m, state.load_for(m.cluster.name), load_plays(project_root() / "playbooks" / "site.yml"),
                   limit=nodes, full=full)
    return [n for n in plan.targets if m.node(n).has_role("compute")]


def gated_new_nodes(loaded: Loaded, state: StateDir, nodes: list[str] | None) -> list[str]:
    """New Slurm compute nodes of this apply, when the manifest has an acceptance gate."""
    m = loaded.manifest
    if not (m.slurm.enabled and m.verify.gate):
        return []
    plan = compute(m, state.load_for(m.cluster.name), load_plays(project_root() / "playbooks" / "site.yml"),
                   limit=nodes)
    return [n.name for n in plan.nodes if n.status == "new" and m.node(n.name).has_role("compute")]


def node_findings(loaded: Loaded, execute: Execute, node: str, drained_by: str, only_gate: bool) -> list[Finding]:
    """Verify ``node`` (only the gate's checks with ``only_gate``): what keeps it from jobs."""
    m = loaded.manifest
    checks = catalog.plan(m, [node], drained_by=drained_by)
    gate = m.verify.gate if m.slurm.enabled else []
    if only_gate:
        checks = [c for c in checks if c.name in gate]
    results = verify(checks, [node], execute, m.verify.command_timeout)
    return findings(results, gate, m.node(node).hardware.gpu is not None)


def reboot_and_wait(execute: Execute, node: str, sleep: float = REBOOT_POLL, timeout: float = REBOOT_TIMEOUT) -> str:
    before = execute(node, BOOT_ID, COMMAND_TIMEOUT)
    if before.error or before.rc != 0:
        return f"cannot read the boot id: {before.error or before.stderr.strip()}"
    execute(node, "systemctl reboot", COMMAND_TIMEOUT)  # the connection may drop: the boot id tells
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(sleep)
        now = execute(node, BOOT_ID, COMMAND_TIMEOUT)
        if not now.error and now.rc == 0 and now.stdout.strip() != before.stdout.strip():
            return ""
    return f"not back within {timeout:g} s after the reboot"


def steps(loaded: Loaded, state: StateDir, args: argparse.Namespace, out: Console, execute: Execute,
          ran: list[Ran]) -> Steps:
    m = loaded.manifest
    head = m.head.name

    def needs_reboot(node: str) -> bool:
        return execute(node, "test -e /var/run/reboot-required", COMMAND_TIMEOUT).rc == 0

    return Steps(
        drain=lambda n: drain_node(head, n, execute, args.drain_timeout, REASON_PREFIX),
        apply=lambda nodes: apply(loaded, state, options(loaded, args, nodes), out, ran),
        needs_reboot=needs_reboot,
        reboot=lambda n: reboot_and_wait(execute, n),
        # drained by this roll: that drain is expected (its reason), any other bad state fails
        verify=lambda n: node_findings(loaded, execute, n, REASON_PREFIX, only_gate=False),
        resume=lambda n: resume_node(head, n, execute),
        leave_drained=lambda n, reason: set_reason(execute, head, n, reason),
    )


def set_reason(execute: Execute, head: str, node: str, reason: str) -> str:
    """Drain ``node`` with ``reason`` (a drained node gets the new reason): "" or why not."""
    done = execute(head, drain_command(node, reason), COMMAND_TIMEOUT)
    return "" if not done.error and done.rc == 0 else f"scontrol on {head}: {why_failed(done)}"


def admit_steps(loaded: Loaded, execute: Execute) -> AdmitSteps:
    head = loaded.manifest.head.name
    return AdmitSteps(
        hold=lambda n, reason: drain_node(head, n, execute, 0, reason),
        check=lambda n: node_findings(loaded, execute, n, GATE_PREFIX, only_gate=True),
        resume=lambda n: resume_node(head, n, execute),
        leave_drained=lambda n, reason: set_reason(execute, head, n, reason),
    )


def run_gate(loaded: Loaded, state: StateDir, nodes: list[str], out: Console, report: Report) -> int:
    """The acceptance gate on the new compute nodes that this apply configured (ended ok)."""
    m = loaded.manifest
    last = state.load_for(m.cluster.name).runs[-1:]
    configured = [n for n in nodes if last and last[0].results.get(n) == "ok"]
    if not configured:
        return 0
    out.print(f"acceptance gate ({', '.join(m.verify.gate)}) on {', '.join(configured)}", highlight=False,
              markup=False)
    targets = node_targets(m, m.node_names())
    admitted = admit(configured, m.verify.gate, admit_steps(loaded, ssh_executor(targets, state.known_hosts)))
    report.gate = admitted
    out.print(gate_table(admitted))
    return 0 if all(a.verdict == "resumed" for a in admitted) else 1


def gate_table(admitted: list[Admission]) -> Table:
    t = Table(title="acceptance gate", title_justify="left")
    for col in ("node", "result", "detail"):
        t.add_column(col, overflow="fold")
    for a in admitted:
        t.add_row(a.node, "[green]resumed[/]" if a.verdict == "resumed" else f"[bold red]{a.verdict}[/]", a.detail)
    return t


def roll_table(r: Roll) -> Table:
    t = Table(title="rolling", title_justify="left")
    for col in ("node", "step", "result", "detail"):
        t.add_column(col, overflow="fold")
    for e in r.events:
        t.add_row(e.node or "(batch)", e.stage, "[green]ok[/]" if e.ok else "[bold red]failed[/]", e.detail)
    return t


def stopped_message(r: Roll) -> str:
    """Where the roll stopped and what is true of each node now: drained with the reason in
    Slurm only where that drain succeeded."""
    parts = [f"rolling stopped at {r.failed}"]
    if r.left_drained:
        parts.append(f"left drained with the reason in Slurm: {', '.join(r.left_drained)}")
    for node, why in r.not_drained.items():
        parts.append(f"{node} could not be drained ({why}): check its state in Slurm")
    if r.untouched:
        parts.append(f"not rolled: {', '.join(r.untouched)}")
    return "; ".join(parts)


def run_rolling(loaded: Loaded, state: StateDir, args: argparse.Namespace, out: Console, report: Report) -> int:
    m = loaded.manifest
    if not m.slurm.enabled:
        raise ProvisionError("--rolling drains nodes in Slurm, and slurm.enabled is false in the manifest")
    if args.check or args.reinstall:
        raise ProvisionError("--rolling cannot be combined with --check or --reinstall")
    chosen = limit(loaded, args.limit)
    rolling = rolling_nodes(loaded, state, chosen, args.full)
    rest = [n for n in (chosen or m.node_names()) if n not in rolling]
    if rest:  # everything else (and the cluster-wide files) first, as a plain apply
        rc = apply(loaded, state, options(loaded, args, rest if chosen or rolling else None), out, report.ran)
        if rc != 0 or not rolling:
            return rc
    if not rolling:
        out.print("rolling: no compute node has node-local changes", highlight=False, markup=False)
        return 0
    out.print(f"rolling {', '.join(rolling)} in batches of {args.batch}", highlight=False, markup=False)
    state.ensure()  # known_hosts
    execute = ssh_executor(node_targets(m, m.node_names()), state.known_hosts)
    with children_end_with_the_command():  # a signal ends every ssh first: no drain lands after it
        result = roll(batches(rolling, args.batch), steps(loaded, state, args, out, execute, report.ran),
                      m.cluster.allow_reboot)
    report.roll = result
    out.print(roll_table(result))
    if not result.ok:
        out.print(stopped_message(result), style="red", highlight=False, markup=False)
        return 1
    if chosen is None:
        settle_cluster_files(loaded, state)
    return 0


DEFAULT_BATCH = 1
DEFAULT_DRAIN_TIMEOUT = 3600  # seconds


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """With ``--json`` the live display and the tables go to stderr, and stdout carries one
    JSON object (Report) once the apply ended."""
    if args.json and args.verbose:
        raise ProvisionError("--json and -v cannot be combined: Ansible's own output would mix with the JSON on "
                             "stdout (it is in the run's log)")
    if not args.rolling:  # an option of the roll without one would be silently ignored
        given = [flag for flag, value in (("--batch", args.batch), ("--drain-timeout", args.drain_timeout))
                 if value is not None]
        if given:
            raise ProvisionError(f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with "
                                 "--rolling")
    args.batch = args.batch or DEFAULT_BATCH
    args.drain_timeout = args.drain_timeout or DEFAULT_DRAIN_TIMEOUT
    loaded = load(err, args.manifest)
    state = StateDir.beside(args.manifest, args.state_dir)
    report = Report()
    shown = err if args.json else out
    rc = _run(loaded, state, args, shown, report)
    if args.json:
        m = loaded.manifest
        print(json.dumps(report.to_json(rc, m.cluster.name, args.check, limit(loaded, args.limit) or m.node_names()),
                         indent=2))
    return rc


def _run(loaded: Loaded, state: StateDir, args: argparse.Namespace, out: Console, report: Report) -> int:
    if args.rolling:
        return run_rolling(loaded, state, args, out, report)
    chosen = limit(loaded, args.limit)
    gated = [] if args.check else gated_new_nodes(loaded, state, chosen)
    rc = apply(loaded, state, options(loaded, args, chosen), out, report.ran)
    if gated:
        with children_end_with_the_command():  # a signal ends every ssh first
            return max(rc, run_gate(loaded, state, gated, out, report))
    return rc


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
