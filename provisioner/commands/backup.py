"""`provision backup MANIFEST [--to DEST]` and `provision restore MANIFEST --from NAME`: the
head node's backups, made and restored by the backup area's tool on the head over SSH
(docs/backup.md). The admin host's ``.provision/`` goes into each backup, encrypted here
before it leaves this machine."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from provisioner.areas import registry
from provisioner.commands.common import guarded, load
from provisioner.errors import ProvisionError
from provisioner.interrupts import Interrupted
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget
from provisioner.state import StateDir
from provisioner.verify.remote import GRACE, children_end_with_the_command, node_targets, ssh_argv, ssh_executor

REFUSED = 2  # the tool's exit status for a restore it refused before changing anything


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with children_end_with_the_command():  # a signal ends every ssh first
        return _run(args, out, err)


@contextlib.contextmanager
def on_the_head(head: str, what: str) -> Iterator[None]:
    """A signal while the head works: say what becomes of that work (the tool on the head
    stops once its ssh is gone, docs/backup.md)."""
    try:
        yield
    except Interrupted as exc:
        raise Interrupted(exc.signum, f"{head}: {what}") from None


def _as_root(user: str, text: str) -> str:
    return text if user == "root" else f"sudo -n {text}"


def _why(res: Output) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    return res.error or (lines[-1] if lines else f"exit {res.rc}")


def upload(target: SshTarget, known_hosts: Path, local: Path, text: str, timeout: int) -> None:
    """Send ``local`` to the node as the stdin of ``text`` (bounded)."""
    argv = ssh_argv(target, known_hosts, text, timeout)
    with local.open("rb") as f:
        try:
            done = subprocess.run(argv, stdin=f, capture_output=True, timeout=timeout + GRACE, check=False)
        except subprocess.TimeoutExpired:
            raise ProvisionError(f"copying the admin host's part to {target.name} took over {timeout} s") from None
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise ProvisionError(f"copying the admin host's part to {target.name} failed: "
                             f"{tail[0] if tail else f'exit {done.returncode}'}")


def _run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    m = loaded.manifest
    steps = registry.head_backup()
    if not steps.wanted(m):
        raise ProvisionError("the manifest has no backup section (docs/backup.md)")
    state = StateDir.beside(args.manifest, args.state_dir)
    state.load_for(m.cluster.name)  # refused when it is another cluster's
    state.ensure()  # known_hosts
    head = steps.node(m).name
    targets = node_targets(m, [head])
    execute = ssh_executor(targets, state.known_hosts)
    timeout = steps.timeout(m)
    to = steps.parse_to(args.to) if args.to else None
    user = m.cluster.ssh.user
    if args.command == "backup":
        with tempfile.TemporaryDirectory(prefix="provision-backup-") as tmp:
            part = Path(tmp) / "provision-state.tar.gz.enc"
            steps.pack_admin(m, state.root, part)
            receive = _as_root(user, f"sh -c {shlex.quote(steps.upload_command())}")
            with on_the_head(head, "no backup was made"):
                upload(targets[head], state.known_hosts, part, receive, timeout)
        with on_the_head(head, "the backup tool there stops at its next step and removes its staging files"):
            res = execute(head, _as_root(user, steps.make_command(to, True)), timeout)
        names = res.stdout.strip().splitlines()
        if res.error or res.rc != 0 or not names:  # the tool prints the backup's name last
            why = _why(res) if res.error or res.rc != 0 else "the tool answered no backup name"
            err.print(f"backup failed on {head}: {why}", style="red", markup=False, highlight=False)
            return 1
        name = names[-1]
        where = steps.describe(to if to is not None else steps.destination(m))
        if args.json:
            print(json.dumps({"backup": name, "destination": where, "head": head}, indent=2))
        else:
            out.print(f"{name}: made on {head}, at {where}", markup=False, highlight=False)
        return 0
    with on_the_head(head, "the restore there stops at its next step, perhaps half done: run provision restore "
                           "again (without --yes it shows the plan)"):
        res = execute(head, _as_root(user, steps.restore_command(args.from_, args.yes, to)), timeout)
    lines = res.stdout.splitlines()
    refused = res.rc == REFUSED and not res.error
    ok = not res.error and res.rc == 0
    if args.json:
        print(json.dumps({"backup": args.from_, "head": head, "restored": ok, "refused": refused,
                          "plan": lines, "detail": "" if ok else _why(res)}, indent=2))
    else:
        for line in lines:
            out.print(f"{head}: {line}", markup=False, highlight=False)
    if ok:
        if not args.json:
            out.print(f"{args.from_}: restored on {head}", markup=False, highlight=False)
        return 0
    err.print(f"restore {'refused' if refused else 'failed'} on {head}: {_why(res)}", style="red", markup=False,
              highlight=False)
    return REFUSED if refused else 1


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
