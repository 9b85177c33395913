"""`provision apply MANIFEST`: make the cluster match the manifest (provisioner.apply);
with ``--rolling``, Slurm compute nodes with node-local changes roll a batch at a time
(provisioner.rolling; the side effects are composed here)."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from provisioner.apply import ApplyOptions, apply, settle_cluster_files
from provisioner.commands.common import guarded, limit, load
from provisioner.content import project_root
from provisioner.drain import COMMAND_TIMEOUT, drain_command, drain_node, resume_node, why_failed
from provisioner.errors import ProvisionError
from provisioner.manifest.load import Loaded
from provisioner.plan import compute, load_plays
from provisioner.rolling import REASON_PREFIX, Roll, Steps, batches, roll
from provisioner.runner import SshTarget
from provisioner.state import StateDir
from provisioner.verify import catalog
from provisioner.verify.remote import ssh_executor
from provisioner.verify.run import Execute, verify

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


def steps(loaded: Loaded, state: StateDir, args: argparse.Namespace, out: Console, execute: Execute) -> Steps:
    m = loaded.manifest
    head = m.head.name

    def node_verify(node: str) -> list[str]:
        # drained by this roll: that drain is expected (its reason), any other bad state fails
        checks = catalog.plan(m, [node], drained_by=REASON_PREFIX)
        results = verify(checks, [node], execute, m.verify.command_timeout)
        return [f"{r.check}: {r.detail}" for r in results if r.status == "FAIL"]

    def leave(node: str, reason: str) -> str:
        done = execute(head, drain_command(node, reason), COMMAND_TIMEOUT)
        return "" if not done.error and done.rc == 0 else f"scontrol on {head}: {why_failed(done)}"

    def needs_reboot(node: str) -> bool:
        return execute(node, "test -e /var/run/reboot-required", COMMAND_TIMEOUT).rc == 0

    return Steps(
        drain=lambda n: drain_node(head, n, execute, args.drain_timeout, REASON_PREFIX),
        apply=lambda nodes: apply(loaded, state, options(loaded, args, nodes), out),
        needs_reboot=needs_reboot,
        reboot=lambda n: reboot_and_wait(execute, n),
        verify=node_verify,
        resume=lambda n: resume_node(head, n, execute),
        leave_drained=leave,
    )


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


def run_rolling(loaded: Loaded, state: StateDir, args: argparse.Namespace, out: Console) -> int:
    m = loaded.manifest
    if not m.slurm.enabled:
        raise ProvisionError("--rolling drains nodes in Slurm, and slurm.enabled is false in the manifest")
    if args.check or args.reinstall:
        raise ProvisionError("--rolling cannot be combined with --check or --reinstall")
    chosen = limit(loaded, args.limit)
    rolling = rolling_nodes(loaded, state, chosen, args.full)
    rest = [n for n in (chosen or m.node_names()) if n not in rolling]
    if rest:  # everything else (and the cluster-wide files) first, as a plain apply
        rc = apply(loaded, state, options(loaded, args, rest if chosen or rolling else None), out)
        if rc != 0 or not rolling:
            return rc
    if not rolling:
        out.print("rolling: no compute node has node-local changes", highlight=False, markup=False)
        return 0
    out.print(f"rolling {', '.join(rolling)} in batches of {args.batch}", highlight=False, markup=False)
    state.ensure()  # known_hosts
    ssh = m.cluster.ssh
    targets = {n.name: SshTarget(n.name, str(n.ip), ssh.port, ssh.user, ssh.private_key) for n in m.nodes}
    execute = ssh_executor(targets, state.known_hosts)
    result = roll(batches(rolling, args.batch), steps(loaded, state, args, out, execute), m.cluster.allow_reboot)
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
    if args.rolling:
        return run_rolling(loaded, state, args, out)
    return apply(loaded, state, options(loaded, args, limit(loaded, args.limit)), out)


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
