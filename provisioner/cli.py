"""The `provision` command: the argument parser and a table of command modules.

Only the chosen command's module is imported (by name, with importlib), so ``provision
--help`` loads nothing but argparse, and ``provision validate`` only the manifest layer, the
areas' checks and rich's console (docs/design.md, "Commands").
"""

from __future__ import annotations

import sys

try:  # a Ctrl-C while this module's own imports run (before main's handling): one line, 130
    import argparse
    import importlib
    import os
    from collections.abc import Callable, Sequence
    from pathlib import Path
    from typing import Any

    from provisioner.platforms import OS_NAMES
    from provisioner.settings import DEFAULT_STALL_TIMEOUT, DEFAULT_STRATEGY, STRATEGIES

    # a Ctrl-C that a C callback swallowed (see _unraisable), raised again once the imports end
    _SWALLOWED_CTRL_C: list[bool] = []

    def _unraisable(info: Any) -> None:
        """A Ctrl-C that landed inside a C callback which could not raise it (pydantic-core
        building a validator at import time) reaches Python as an "Exception ignored" message
        with a traceback, and the program goes on as if no Ctrl-C came. Such a Ctrl-C is
        recorded and raised again when the imports end (main's handling: one line, 130).
        Sending the signal again from here did not do: its handler ran inside this hook, whose
        own KeyboardInterrupt Python printed as "Exception ignored" with a traceback. Any
        other unraisable exception is printed as Python prints it."""
        if isinstance(info.exc_value, KeyboardInterrupt):
            _SWALLOWED_CTRL_C.append(True)
        else:
            sys.__unraisablehook__(info)

    def _raise_swallowed_ctrl_c() -> None:
        if _SWALLOWED_CTRL_C:
            raise KeyboardInterrupt

    sys.unraisablehook = _unraisable
except KeyboardInterrupt:
    print("interrupted (Ctrl-C)", file=sys.stderr)
    raise SystemExit(130) from None

# command -> the module that runs it (its main(args) -> exit code)
COMMANDS: dict[str, str] = {
    "validate": "provisioner.commands.validate",
    "inventory": "provisioner.commands.inventory",
    "plan": "provisioner.commands.plan",
    "apply": "provisioner.commands.apply",
    "bmc": "provisioner.commands.bmc",
    "verify": "provisioner.commands.verify",
    "status": "provisioner.commands.status",
    "remove": "provisioner.commands.remove",
    "drain": "provisioner.commands.drain",
    "resume": "provisioner.commands.drain",
    "image": "provisioner.commands.image",
    "slurm": "provisioner.commands.slurm",
    "report": "provisioner.commands.report",
    "backup": "provisioner.commands.backup",
    "restore": "provisioner.commands.backup",
}
VERSION_MODULE = "provisioner.commands.version"
INTERRUPTED = "interrupted (Ctrl-C)"  # what provisioner.interrupts.Interrupted says for SIGINT


class _Version(argparse.Action):
    """--version, computed only when asked for (reading package metadata takes time)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(importlib.import_module(VERSION_MODULE).version_line())  # stdout, as argparse's own version action
        parser.exit()


def _whole_number(minimum: int, unit: str) -> Callable[[str], int]:
    """An argparse type: a whole number of ``unit`` of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number of {unit}: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {text!r}")
        return value

    return parse


_positive_int = _whole_number(1, "seconds")
_non_negative_int = _whole_number(0, "seconds")
_batch_size = _whole_number(1, "nodes")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="provision", description="Turn one cluster manifest into a GPU cluster.")
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print the version of provision and of the ansible-core it drives")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument("manifest", type=Path, help="the cluster manifest (YAML)")
        return sp

    val = add("validate", "check a manifest and report every problem with file:line")
    val.add_argument("--json", action="store_true", help="print the result, every error and warning, as JSON")

    inv = add("inventory", "write the Ansible inventory generated from the manifest")
    inv.add_argument("--out", type=Path, help="output folder (default: inventory/<cluster>/ beside the manifest)")
    inv.add_argument("--state-dir", type=Path,
                     help="state directory whose secrets/ the roles read (default: .provision/ beside the manifest)")
    inv.add_argument("--json", action="store_true", help="print the folder and the files written as JSON")

    plan = add("plan", "show what apply would change, per node")
    plan.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    plan.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument("--detailed-exitcode", action="store_true", help="exit 0: no changes, 1: error, 2: changes")
    plan.add_argument("--full", action="store_true", help="plan node-local plays on every node")
    plan.add_argument("--offline", action="store_true",
                      help="read nothing over the network (slurmdbd's accounts are read on the controller otherwise)")

    ap = add("apply", "make the cluster match the manifest")
    ap.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    ap.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    ap.add_argument("--check", action="store_true",
                    help="dry run: Ansible check mode with diffs; changes nothing on disk (the state directory "
                         "included) or on any machine, installs and powers nothing")
    ap.add_argument("--yes", "-y", action="store_true",
                    help="do not ask for confirmation (PXE installs listed in the plan included)")
    ap.add_argument("--full", action="store_true", help="run node-local plays on every node (drift repair)")
    ap.add_argument("--reinstall", metavar="NODES",
                    help="reinstall the OS on these nodes over BMC + PXE (wipes their install disks); new nodes "
                         "marked install: pxe in the manifest are installed without it")
    ap.add_argument("--install-timeout", type=_positive_int, metavar="SECONDS", default=None,
                    help="give up on a node's OS install after this long (default 5400)")
    ap.add_argument("--stall-timeout", type=_positive_int, metavar="SECONDS", default=None,
                    help="fail a node whose current task has not finished after this long (every task, also "
                         "the long package and build steps); the other nodes go on. Default: "
                         f"{DEFAULT_STALL_TIMEOUT} for tasks without a bound of their own, the roles' own "
                         "bound (*_package_timeout, ...) for the rest")
    ap.add_argument("--strategy", choices=STRATEGIES, default=os.environ.get("PROVISION_STRATEGY", DEFAULT_STRATEGY),
                    help="Ansible execution strategy: mitogen (one persistent Python per node: fewer round trips "
                         "per task) or linear (Ansible's own, the fallback); default $PROVISION_STRATEGY or "
                         f"{DEFAULT_STRATEGY}")
    ap.add_argument("--rolling", action="store_true",
                    help="Slurm compute nodes with node-local changes go a batch at a time: drained (jobs waited "
                         "for), their plays, a reboot when needed and cluster.allow_reboot, verify, resumed; a "
                         "failure stops the roll and leaves that node drained with the reason")
    ap.add_argument("--batch", type=_batch_size, metavar="N", default=None,
                    help="with --rolling: nodes per batch (default 1)")
    ap.add_argument("--drain-timeout", type=_positive_int, metavar="SECONDS", default=None,
                    help="with --rolling: wait this long for a drained node's jobs (default 3600); never killed")
    ap.add_argument("--json", action="store_true",
                    help="print what the apply did as JSON on stdout (the live display goes to stderr)")
    ap.add_argument("-v", "--verbose", action="count", default=0,
                    help="show Ansible's own output (-vv, -vvv: more) instead of the live table; it is also in "
                         "the run's log")

    bmc = add("bmc", "BMC power and boot control over the manifest's nodes")
    bmc.add_argument("action", choices=["status", "on", "off", "cycle", "pxe", "disk"],
                     help="status; power on/off/cycle; next boot (only) from pxe or disk")
    bmc.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    bmc.add_argument("--no-wait", action="store_true", help="do not wait for the power state to settle")
    bmc.add_argument("--yes", "-y", action="store_true",
                     help="do not ask for confirmation of a power or boot change")
    bmc.add_argument("--json", action="store_true", help="print one row per node as JSON")

    ver = add("verify", "check the running cluster against the manifest: pass/fail/skip per node and check")
    ver.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    ver.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    ver.add_argument("--json", action="store_true", help="print the results as JSON")
    ver.add_argument("--junit", type=Path, metavar="FILE", help="also write the results as JUnit XML to FILE")
    ver.add_argument("--burn-in", type=_positive_int, metavar="SECONDS",
                     help="also stress every GPU for SECONDS (check gpu.burn; overrides verify.burn_in_s)")
    ver.add_argument("--level", type=int, choices=[1, 2, 3, 4],
                     help="level of dcgmi diag (check gpu.dcgm; overrides verify.dcgm_level, default 1)")

    st = add("status", "one table of nodes: lifecycle, last apply, reachability, Slurm state, GPUs seen")
    st.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    st.add_argument("--limit", help="only these nodes (names, ranges like gpu[01-04], @role; comma-separated)")
    st.add_argument("--json", action="store_true", help="print the rows as JSON")
    st.add_argument("--no-probe", action="store_true", help="only the recorded state: do not contact the nodes")

    rm = add("remove", "take nodes the manifest no longer lists out of the cluster (drain, re-render, record)")
    rm.add_argument("nodes", metavar="NODES", help="the nodes to remove (names, ranges like gpu[01-04]; "
                    "comma-separated); delete them from the manifest first")
    rm.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    rm.add_argument("--drain-timeout", type=_positive_int, metavar="SECONDS", default=600,
                    help="wait this long for a drained node's Slurm jobs to end (default 600); they are never killed")
    rm.add_argument("--strategy", choices=STRATEGIES, default=os.environ.get("PROVISION_STRATEGY", DEFAULT_STRATEGY),
                    help="Ansible execution strategy of the apply (as apply --strategy)")
    rm.add_argument("--json", action="store_true",
                    help="print what remove did as JSON on stdout (the messages go to stderr)")

    dr = add("drain", "drain nodes in Slurm (scontrol on the controller) and wait for their jobs, bounded")
    dr.add_argument("nodes", metavar="NODES", help="names, ranges like gpu[01-04], @role; comma-separated")
    dr.add_argument("--reason", default="provision drain", help="the reason Slurm records (default: provision drain)")
    dr.add_argument("--wait", type=_non_negative_int, metavar="SECONDS", default=0,
                    help="wait up to this long for the nodes' jobs to end (default 0: do not wait); jobs are "
                         "never killed")
    dr.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    dr.add_argument("--json", action="store_true", help="print one result per node as JSON")
    rs = add("resume", "resume drained nodes in Slurm (scontrol on the controller)")
    rs.add_argument("nodes", metavar="NODES", help="names, ranges like gpu[01-04], @role; comma-separated")
    rs.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    rs.add_argument("--json", action="store_true", help="print one result per node as JSON")
    rs.add_argument("--force", action="store_true",
                    help="also resume nodes the acceptance gate holds (reason 'provision gate: ...')")
    bk = add("backup", "back up the head node now: slurmdbd's database, slurmctld's state, the munge key and "
                       ".provision/ (encrypted), Prometheus' snapshot; to the manifest's destination")
    bk.add_argument("--to", metavar="DEST", help="instead: an absolute path on the head, or [user@]host[:port]:/path")
    bk.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    bk.add_argument("--json", action="store_true", help="print the backup's name and destination as JSON")
    rt = add("restore", "restore a backup onto the head node (a freshly deployed one): shows what it overwrites; "
                        "overwrites only with --yes")
    rt.add_argument("--from", dest="from_", required=True, metavar="BACKUP",
                    help="the backup's name (provision-backup-<cluster>-<time>) at the manifest's destination")
    rt.add_argument("--to", metavar="DEST", help="read it from this destination instead (as backup --to)")
    rt.add_argument("--yes", action="store_true", help="stop the daemons, overwrite what the plan lists, start them")
    rt.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    rt.add_argument("--json", action="store_true", help="print the plan and the result as JSON")
    image = sub.add_parser("image", help="node OS images for image deploys",
                           description="node OS images for image deploys")
    image_sub = image.add_subparsers(dest="image_action", required=True, metavar="ACTION")
    build = image_sub.add_parser("build", help="build (or fetch and verify) the node OS image per OS of the manifest",
                                 description="build (or fetch and verify) the node OS image per OS of the manifest")
    build.add_argument("manifest", type=Path, help="the cluster manifest (YAML)")
    build.add_argument("--os", choices=sorted(OS_NAMES),
                       help="only this OS (default: every OS the manifest's nodes use)")
    build.add_argument("--cache-dir", type=Path, help="image cache (default: .provision/images/ beside the manifest)")
    build.add_argument("--skip-proof", action="store_true",
                       help="do not prove in the image that every package the roles install resolves (apply "
                            "then refuses to deploy the image)")
    build.add_argument("--json", action="store_true",
                       help="print the images and the ramdisk as JSON on stdout (the progress goes to stderr)")
    prune = image_sub.add_parser(
        "prune", help="remove old images from the cache (each OS's current image and --keep older ones stay)",
        description="remove old images and deploy ramdisks from the cache: each OS's current image and the "
                    "current ramdisk (what the PXE server publishes) stay, with the --keep newest older ones "
                    "of each; leftovers of builds that died go too")
    prune.add_argument("manifest", type=Path, help="the cluster manifest (YAML); it locates the cache")
    prune.add_argument("--keep", type=_whole_number(0, "images"), default=1, metavar="N",
                       help="older images to keep per OS, and older ramdisks (default 1: one to go back to)")
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    prune.add_argument("--cache-dir", type=Path, help="image cache (default: .provision/images/ beside the manifest)")
    prune.add_argument("--json", action="store_true", help="print what was (or would be) removed as JSON")

    slurm = sub.add_parser("slurm", help="one Slurm for the cluster (slurm.source: build)",
                           description="one Slurm for the cluster (slurm.source: build)")
    slurm_sub = slurm.add_subparsers(dest="slurm_action", required=True, metavar="ACTION")
    sb = slurm_sub.add_parser(
        "build", help="build the manifest's Slurm into .deb packages per OS release, unless cached",
        description="build the manifest's pinned Slurm into .deb packages, one build per OS release of its "
                    "Slurm nodes, in a throwaway chroot of that release (mmdebstrap, as root), unless the cache "
                    "holds it; the sources are checked against their pinned sha256")
    sb.add_argument("manifest", type=Path, help="the cluster manifest (YAML)")
    sb.add_argument("--os", choices=sorted(OS_NAMES),
                    help="only this OS release (default: every one of the manifest's Slurm nodes)")
    sb.add_argument("--cache-dir", type=Path, help="package cache (default: .provision/slurm/ beside the manifest)")
    sb.add_argument("--jobs", type=_whole_number(1, "jobs"), default=2, metavar="N",
                    help="parallel compile jobs (default 2)")
    sb.add_argument("--json", action="store_true",
                    help="print the builds as JSON on stdout (the progress goes to stderr)")

    report = sub.add_parser("report", help="reports from the running cluster",
                            description="reports from the running cluster")
    report_sub = report.add_subparsers(dest="report_kind", required=True, metavar="REPORT")
    usage = report_sub.add_parser(
        "usage", help="GPU-hours held and used, idle share, energy and cost per user, account, partition or node",
        description="GPU-hours held (Slurm's accounting: allocated GPUs x time) and used (Prometheus' per-job GPU "
                    "utilization), idle share, energy and cost (the manifest's cost section), per user, account, "
                    "partition or node; cluster totals, the top idle jobs, and what it could not know")
    usage.add_argument("manifest", type=Path, help="the cluster manifest (YAML)")
    usage.add_argument("--since", default="7d", metavar="WHEN",
                       help="start: a duration before now (30m, 12h, 7d, 2w) or a date (2026-11-01, "
                            "2026-11-01T08:00; local time); default 7d")
    usage.add_argument("--until", default="now", metavar="WHEN", help="end, in the same forms; default now")
    usage.add_argument("--by", choices=["user", "account", "partition", "node"], default="user",
                       help="one row per user (default), account, partition or node")
    fmt = usage.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the report as JSON")
    fmt.add_argument("--csv", action="store_true", help="print the rows and the total as CSV")
    usage.add_argument("--html", type=Path, metavar="FILE",
                       help="also write a self-contained HTML report with a plot of GPUs held and used per account")
    usage.add_argument("--top", type=_whole_number(0, "jobs"), default=10, metavar="N",
                       help="idle jobs listed (default 10)")
    usage.add_argument("--prometheus", metavar="URL",
                       help="Prometheus to ask (default: the first monitoring server's, port 9090)")
    usage.add_argument("--state-dir", type=Path, help="state directory (default: .provision/ beside the manifest)")
    return p


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C, or an error a Ctrl-C caused: one that lands while a class
    is created (pydantic's models, at import time) surfaces as a RuntimeError caused by it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        try:
            command = importlib.import_module(COMMANDS[args.command])
        except Exception as exc:
            if interrupted(exc):
                raise KeyboardInterrupt from None
            raise
        _raise_swallowed_ctrl_c()
        return int(command.main(args))
    except KeyboardInterrupt:  # Ctrl-C before the command's own handling (imports take ~0.3-1 s)
        print(INTERRUPTED, file=sys.stderr)
        return 130



if __name__ == "__main__":
    sys.exit(main())
