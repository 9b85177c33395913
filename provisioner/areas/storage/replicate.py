"""ZFS replication of our snapshots to another storage node's pool: what to send, what the
target may prune, what a request over SSH may do; and the node program that does it.

Like ``snapshots`` (whose naming of "our" snapshots it uses), this one file is both a module
of the storage area (the unit tests import its pure functions) and the program the zfs role
installs on storage nodes as ``/usr/local/lib/provision/provision_zfs_replicate.py``: standard
library only, Python 3.10, no import of the rest of the package but ``snapshots``, which the
role installs beside it. Side effects are in the functions under "the node program".

On the source node (``run``, from a systemd timer), for each replicated dataset:

1. list its snapshots (``zfs list -s createtxg``) and, over SSH, the replica's (``list``):
   its snapshots, and the ``receive_resume_token`` of an interrupted receive;
2. :func:`plan`: resume the interrupted receive (``zfs send -t``); else a full send of our
   newest snapshot when the replica does not exist; else ``zfs send -I`` from the newest
   snapshot both sides hold (the replica's newest) to our newest, which also carries every
   snapshot in between; nothing when the replica has our newest; a refusal (never a
   ``zfs recv -F``, which destroys) when the replica has a snapshot newer than the common
   one or none in common;
3. ``zfs send ... | ssh USER@target recv DATASET``, bounded by the config's ``timeout``; again
   from 1. until nothing is left to send (at most ``MAX_STEPS`` times).

On the target, the SSH key's forced command is ``serve``: it reads ``SSH_ORIGINAL_COMMAND``
and allows only ``list D``, ``recv D`` and ``abort D`` for a dataset ``D`` of its config
(:func:`parse_request`). ``recv`` runs ``zfs recv -s -u D`` (resumable, not mounted), then
destroys our snapshots of ``D`` beyond the retention the source keeps (:func:`to_prune`:
only ours, never the replica's newest, which the next incremental starts from). It runs as
the unprivileged ``USER``, to whom ``delegate`` gives ``zfs allow`` of ``PERMISSIONS`` on
the replica's parent.

``run`` writes node_exporter's textfile metrics (``METRICS_FILE``), per replicated dataset:

  provision_zfs_replication_run_success{dataset,target}                 0: the last run failed
  provision_zfs_replication_last_success_timestamp_seconds{dataset,target}
  provision_zfs_replication_newest_timestamp_seconds{dataset,target}    our newest on the replica (0: none)
  provision_zfs_replication_max_age_seconds{dataset,target}             2 x the shortest period kept
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:
    from provisioner.areas.storage import snapshots
else:  # run as a program: snapshots.py lies beside this file
    try:  # on a node, where the role installs it under this name
        import provision_zfs_snapshot as snapshots
    except ImportError:  # in the package's folder (the unit tests)
        import snapshots

USER = "zfsrecv"  # the target's account whose key's forced command is ``serve``
PERMISSIONS = ("create", "destroy", "mount", "receive")  # zfs allow on the replica's parent
MAX_STEPS = 4  # send steps in one run (a resumed receive, then the rest)
LIST_TIMEOUT = 120  # seconds a listing (local or over SSH) may take
METRICS_FILE = "provision_zfs_replication.prom"
VERBS = ("list", "recv", "abort")


@dataclass(frozen=True)
class Snap:
    name: str  # dataset@snapshot
    guid: str

    @property
    def short(self) -> str:
        return self.name.partition("@")[2]


@dataclass(frozen=True)
class Listing:
    """The replica as ``serve list`` reports it: whether it exists, its snapshots in creation
    order and the resume token of an interrupted receive ("": none)."""

    exists: bool
    snaps: tuple[Snap, ...] = ()
    token: str = ""


@dataclass(frozen=True)
class Step:
    """What to send next: ``kind`` full, incremental, resume or none; ``send`` the arguments
    of ``zfs`` (empty for none); ``why`` in words."""

    kind: str
    send: tuple[str, ...]
    why: str


class Refused(Exception):
    """The replica cannot be brought up to date without destroying what is not ours."""


# --------------------------------------------------------------------------- pure
def parse_snaps(text: str) -> list[Snap]:
    """``zfs list -H -p -o name,guid -t snapshot -s createtxg`` output, in its order."""
    out: list[Snap] = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and "@" in parts[0]:
            out.append(Snap(parts[0].strip(), parts[1].strip()))
    return out


def listing_text(exists: bool, token: str, snaps_text: str) -> str:
    """What ``serve list`` prints: ``absent``, or ``token=<token or ->`` then the snapshots."""
    if not exists:
        return "absent\n"
    return f"token={token or '-'}\n{snaps_text}"


def parse_listing(text: str) -> Listing:
    """The answer of ``serve list`` (:func:`listing_text`)."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "absent":
        return Listing(False)
    if not lines or not lines[0].startswith("token="):
        raise ValueError(f"not an answer of serve list: {text[:200]!r}")
    token = lines[0].removeprefix("token=").strip()
    return Listing(True, tuple(parse_snaps("\n".join(lines[1:]))), "" if token == "-" else token)


def plan(source: str, source_snaps: Sequence[Snap], target: str, replica: Listing) -> Step:
    """The next send that brings ``target`` closer to ``source``'s newest snapshot of ours.
    ``source_snaps``: every snapshot of the source in creation order (ours and others).
    Raises :class:`Refused` where only destroying on the target would help."""
    if replica.token:
        return Step("resume", ("send", "-t", replica.token), f"resume the interrupted receive into {target}")
    ours = {s.name for s in snapshots.ours(source, [x.name for x in source_snaps])}
    mine = [s for s in source_snaps if s.name in ours]
    if not mine:
        return Step("none", (), f"{source} has no snapshot of ours yet")
    newest = mine[-1]
    if not replica.exists:
        return Step("full", ("send", newest.name), f"{target} does not exist: full send of {newest.name}")
    if not replica.snaps:
        raise Refused(f"{target} exists and holds no snapshot: only zfs recv -F could overwrite it, and "
                      "replication never destroys; rename or destroy it by hand")
    by_guid = {s.guid: i for i, s in enumerate(source_snaps)}
    last = replica.snaps[-1]
    if last.guid not in by_guid:
        common = [s for s in replica.snaps if s.guid in by_guid]
        if common:
            raise Refused(f"{last.name} is newer than {common[-1].name}, the newest snapshot both sides hold: "
                          "zfs receive cannot add snapshots after it; move or destroy it (replication never "
                          "destroys a snapshot that is not ours)")
        raise Refused(f"{target} has no snapshot in common with {source} (the source may have pruned the "
                      "last one sent): only a full send into a new dataset can start again; rename or "
                      f"destroy {target} by hand")
    base = source_snaps[by_guid[last.guid]]
    if by_guid[newest.guid] <= by_guid[last.guid]:
        return Step("none", (), f"{target} is up to date ({base.short})")
    return Step("incremental", ("send", "-I", base.name, newest.name),
                f"incremental from {base.short} to {newest.short}")


def to_prune(target: str, names: Sequence[str], policy: Mapping[str, int]) -> list[str]:
    """Our snapshots of the replica beyond the source's retention, oldest first: per frequency
    the policy keeps, those beyond its count. Never one that is not ours, never a frequency
    the policy does not keep, never the replica's newest of ours (the next incremental's base)."""
    mine = snapshots.ours(target, names)
    newest = mine[-1].name if mine else None
    out: list[str] = []
    for frequency, keep in policy.items():
        if keep > 0:
            out += [n for n in snapshots.to_destroy(target, names, frequency, keep) if n != newest]
    return sorted(out, key=lambda n: [s.name for s in mine].index(n))


def parse_request(command: str, allowed: Sequence[str]) -> tuple[str, str]:
    """``(verb, dataset)`` of an SSH request (``SSH_ORIGINAL_COMMAND``): exactly ``VERB DATASET``
    with a verb of ``VERBS`` and a dataset of ``allowed``; else ValueError."""
    words = command.split()
    if len(words) != 2 or words[0] not in VERBS:
        raise ValueError(f"refused {command[:200]!r}: only {', '.join(VERBS)} <dataset>")
    if words[1] not in allowed:
        raise ValueError(f"refused {words[1][:200]!r}: not a replica of this node")
    return words[0], words[1]


def send_is_stale(rc: int, stderr: str) -> bool:
    """A ``zfs send -t`` that failed because its token can never work (the snapshot it resumes
    is gone, or the token is damaged): the partial receive must be aborted."""
    text = stderr.lower()
    return rc != 0 and ("no longer exists" in text or "invalid" in text or "resume token" in text)


def missing_permissions(allow_text: str, user: str) -> list[str]:
    """Which of ``PERMISSIONS`` ``zfs allow DATASET`` does not list for ``user`` (inherited
    ones count: a replica's parent under a dataset that already allows them)."""
    have: set[str] = set()
    for m in re.finditer(rf"^\s*user {re.escape(user)} (\S+)\s*$", allow_text, re.MULTILINE):
        have |= set(m.group(1).split(","))
    return [p for p in PERMISSIONS if p not in have]


def authorized_key_line(public_key: str, program: str, config: str, sources: Sequence[str]) -> str:
    """The target's ``authorized_keys`` line: only ``serve``, only from the sources' addresses,
    no pty, no forwarding (``restrict``)."""
    command = f"/usr/bin/python3 {program} serve --config {config}"
    return f'restrict,from="{",".join(sources)}",command="{command}" {public_key.strip()}'


def calendar(frequency: str) -> str:
    """The replication timer's ``OnCalendar``: ten minutes after the snapshot timer of the
    shortest frequency kept fires (hourly, daily, weekly, monthly at 00:00)."""
    return {"hourly": "*-*-* *:10:00", "daily": "*-*-* 00:10:00", "weekly": "Mon *-*-* 00:10:00",
            "monthly": "*-*-01 00:10:00"}[frequency]


def metrics_text(rows: Mapping[tuple[str, str], Mapping[str, float]]) -> str:
    """The textfile: per (dataset, target) its ``success``, ``last_success``, ``newest`` and
    ``max_age``."""
    series = (
        ("run_success", "success", "1 when the last run brought the replica up to date."),
        ("last_success_timestamp_seconds", "last_success", "When a run last brought the replica up to date."),
        ("newest_timestamp_seconds", "newest", "When our newest snapshot on the replica was taken (0: none)."),
        ("max_age_seconds", "max_age", "Age after which the replica's newest snapshot is late."),
    )
    lines: list[str] = []
    for metric, key, help_text in series:
        lines += [f"# HELP provision_zfs_replication_{metric} {help_text}",
                  f"# TYPE provision_zfs_replication_{metric} gauge"]
        for (dataset, target) in sorted(rows):
            labels = f'dataset="{snapshots.escape(dataset)}",target="{snapshots.escape(target)}"'
            lines.append(f"provision_zfs_replication_{metric}{{{labels}}} {rows[(dataset, target)][key]:.0f}")
    return "\n".join(lines) + "\n"


def read_metrics(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """The rows of an earlier metrics file (a failed run keeps the last success's time)."""
    keys = {"run_success": "success", "last_success_timestamp_seconds": "last_success",
            "newest_timestamp_seconds": "newest", "max_age_seconds": "max_age"}
    out: dict[tuple[str, str], dict[str, float]] = {}
    for m in re.finditer(r'^provision_zfs_replication_(\w+)\{dataset="([^"]*)",target="([^"]*)"\} (\S+)$',
                         text, re.MULTILINE):
        metric, dataset, target, value = m.groups()
        if metric in keys:
            out.setdefault((dataset, target), {})[keys[metric]] = float(value)
    return out


def parse_config(data: object) -> dict[str, object]:
    """The source's config: ``replications`` [{source, to, target, host, policy}], ``key``,
    ``known_hosts``, ``timeout``; the target's: ``replicas`` {dataset: {parent, policy}}. Checked."""
    if not isinstance(data, dict):
        raise ValueError("the config is not a mapping")
    reps = data.get("replications", [])
    if not isinstance(reps, list) or any(not isinstance(r, dict) or not {"source", "to", "target", "host",
                                                                         "policy"} <= set(r) for r in reps):
        raise ValueError("replications: a list of {source, to, target, host, policy}")
    replicas = data.get("replicas", {})
    if not isinstance(replicas, dict) or any(not isinstance(v, dict) or not {"parent", "policy"} <= set(v)
                                             for v in replicas.values()):
        raise ValueError("replicas: a mapping of dataset: {parent, policy}")
    for policy in [r["policy"] for r in reps] + [v["policy"] for v in replicas.values()]:
        snapshots.parse_policies({"datasets": {"policy": policy}})
    return data


# --------------------------------------------------------------------------- the node program
def zfs(args: Sequence[str], timeout: float = LIST_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["zfs", *args], capture_output=True, text=True, timeout=timeout, check=False)


def list_snaps(dataset: str) -> list[Snap]:
    proc = zfs(["list", "-H", "-p", "-o", "name,guid", "-t", "snapshot", "-s", "createtxg", "-d", "1", dataset])
    if proc.returncode != 0:
        raise RuntimeError(f"zfs list {dataset}: {proc.stderr.strip()}")
    return parse_snaps(proc.stdout)


def ssh_argv(config: Mapping[str, object], host: str, request: str) -> list[str]:
    return ["ssh", "-i", str(config["key"]), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={config['known_hosts']}",
            "-o", "ConnectTimeout=20", "-o", "ServerAliveInterval=30", "-o", "ServerAliveCountMax=4",
            f"{USER}@{host}", request]


def remote(config: Mapping[str, object], host: str, request: str) -> str:
    proc = subprocess.run(ssh_argv(config, host, request), capture_output=True, text=True,
                          timeout=LIST_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ssh {host} {request}: {proc.stderr.strip() or f'exit {proc.returncode}'}")
    return proc.stdout


def transfer(config: Mapping[str, object], rep: Mapping[str, object], step: Step, deadline: float) -> None:
    """``zfs <step.send> | ssh target recv DATASET``, killed at ``deadline``."""
    sender = subprocess.Popen(["zfs", *step.send], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    receiver = subprocess.Popen(ssh_argv(config, str(rep["host"]), f"recv {rep['target']}"),
                                stdin=sender.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert sender.stdout is not None and sender.stderr is not None
    sender.stdout.close()  # the receiver holds it; a dead receiver stops the sender
    try:
        out, err = receiver.communicate(timeout=max(deadline - time.monotonic(), 1))
        send_err = sender.stderr.read().decode(errors="replace")
        send_rc = sender.wait(timeout=60)
    except subprocess.TimeoutExpired:
        sender.kill()
        receiver.kill()
        sender.wait()
        receiver.wait()
        raise RuntimeError(f"{step.why}: not done within the timeout; the next run resumes it") from None
    finally:
        sender.stderr.close()
    if out.strip():
        print(out.strip())
    if send_rc != 0 or receiver.returncode != 0:
        if step.kind == "resume" and send_is_stale(send_rc, send_err):
            remote(config, str(rep["host"]), f"abort {rep['target']}")
            print(f"aborted the partial receive into {rep['target']}: {send_err.strip()}")
        raise RuntimeError(f"{step.why}: zfs send: {send_err.strip() or send_rc}; "
                           f"receiver: {err.strip() or receiver.returncode}")


def replicate(config: Mapping[str, object], rep: Mapping[str, object], deadline: float) -> int:
    """Bring one replica up to date; the time our newest snapshot on it was taken."""
    for _ in range(MAX_STEPS):
        listing = parse_listing(remote(config, str(rep["host"]), f"list {rep['target']}"))
        step = plan(str(rep["source"]), list_snaps(str(rep["source"])), str(rep["target"]), listing)
        if step.kind == "none":
            print(f"{rep['source']} -> {rep['to']}:{rep['target']}: {step.why}")
            return snapshots.newest(str(rep["target"]), [s.name for s in listing.snaps])
        print(f"{rep['source']} -> {rep['to']}:{rep['target']}: {step.why}")
        transfer(config, rep, step, deadline)
    raise RuntimeError(f"{rep['target']} still not up to date after {MAX_STEPS} sends")


def run(config: Mapping[str, object], textfile_dir: Path) -> int:
    path = textfile_dir / METRICS_FILE
    rows = read_metrics(path.read_text()) if path.exists() else {}
    reps = config.get("replications", [])
    assert isinstance(reps, list)
    deadline = time.monotonic() + float(str(config.get("timeout", 21600)))
    ok = True
    fresh: dict[tuple[str, str], dict[str, float]] = {}
    for rep in reps:
        key = (str(rep["source"]), f"{rep['to']}:{rep['target']}")
        row = {"success": 0.0, "last_success": 0.0, "newest": 0.0, **rows.get(key, {}),
               "max_age": float(snapshots.max_age(rep["policy"]))}
        try:
            row["newest"] = float(replicate(config, rep, deadline))
            row["success"], row["last_success"] = 1.0, time.time()
        except (RuntimeError, Refused, ValueError, subprocess.TimeoutExpired) as exc:
            ok = False
            row["success"] = 0.0
            print(f"FAILED {key[0]} -> {key[1]}: {exc}", file=sys.stderr)
        fresh[key] = row
    snapshots.write_atomic(path, metrics_text(fresh))
    return 0 if ok else 1


def serve(config: Mapping[str, object], command: str) -> int:
    """The target's forced command: one request of the source, nothing else."""
    replicas = config.get("replicas", {})
    assert isinstance(replicas, dict)
    try:
        verb, dataset = parse_request(command, sorted(replicas))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if verb == "list":
        token = zfs(["get", "-H", "-o", "value", "receive_resume_token", dataset])
        if token.returncode != 0:
            if "does not exist" in token.stderr:
                sys.stdout.write(listing_text(False, "", ""))
                return 0
            print(token.stderr.strip(), file=sys.stderr)
            return 1
        listed = zfs(["list", "-H", "-p", "-o", "name,guid", "-t", "snapshot", "-s", "createtxg", "-d", "1",
                      dataset])
        if listed.returncode != 0:
            print(listed.stderr.strip(), file=sys.stderr)
            return 1
        sys.stdout.write(listing_text(True, token.stdout.strip(), listed.stdout))
        return 0
    if verb == "abort":
        proc = zfs(["recv", "-A", dataset])
        print(proc.stderr.strip() or f"aborted {dataset}", file=sys.stderr if proc.returncode else sys.stdout)
        return proc.returncode
    # recv: stdin is the stream (ssh ends it when the sender is killed at its deadline)
    try:
        received = subprocess.run(["zfs", "recv", "-s", "-u", dataset], check=False,
                                  timeout=float(str(config.get("timeout", 21600))))
    except subprocess.TimeoutExpired:
        print(f"zfs recv {dataset}: not done within the timeout; the next run resumes it", file=sys.stderr)
        return 1
    if received.returncode != 0:
        return received.returncode
    try:
        names = [s.name for s in list_snaps(dataset)]
        for old in to_prune(dataset, names, replicas[dataset]["policy"]):
            proc = zfs(["destroy", old])
            if proc.returncode != 0:
                raise RuntimeError(f"zfs destroy {old}: {proc.stderr.strip()}")
            print(f"destroyed {old}")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"received, but pruning failed: {exc}", file=sys.stderr)
        return 1
    return 0


def delegate(config: Mapping[str, object]) -> int:
    """``zfs allow`` of ``PERMISSIONS`` to ``USER`` on each replica's parent where it lacks
    them; says ``delegated ...`` for each (the role reports a change from that)."""
    replicas = config.get("replicas", {})
    assert isinstance(replicas, dict)
    for parent in sorted({str(v["parent"]) for v in replicas.values()}):
        shown = zfs(["allow", parent])
        if shown.returncode != 0:
            print(f"zfs allow {parent}: {shown.stderr.strip()}", file=sys.stderr)
            return 1
        missing = missing_permissions(shown.stdout, USER)
        if missing:
            proc = zfs(["allow", "-u", USER, ",".join(PERMISSIONS), parent])
            if proc.returncode != 0:
                print(f"zfs allow {parent}: {proc.stderr.strip()}", file=sys.stderr)
                return 1
            print(f"delegated {','.join(missing)} on {parent} to {USER}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="provision-zfs-replicate", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("action", choices=["run", "serve", "delegate"])
    parser.add_argument("--config", type=Path, default=Path("/etc/provision/zfs-replication.json"))
    parser.add_argument("--textfile-dir", type=Path, default=Path("/var/lib/prometheus/node-exporter"))
    args = parser.parse_args(argv)
    try:
        config = parse_config(json.loads(args.config.read_text()))
    except (OSError, ValueError) as exc:
        print(f"provision-zfs-replicate: {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.action == "serve":
        return serve(config, os.environ.get("SSH_ORIGINAL_COMMAND", ""))
    if args.action == "delegate":
        return delegate(config)
    args.textfile_dir.mkdir(parents=True, exist_ok=True)
    with open(args.textfile_dir / f".{METRICS_FILE}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("provision-zfs-replicate: another run holds the lock; this one does nothing", file=sys.stderr)
            return 75
        return run(config, args.textfile_dir)


if __name__ == "__main__":
    sys.exit(main())

