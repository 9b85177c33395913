"""`provision apply`: plan, lock, write the inventory, run the playbooks, record state.

Safe under an operator's mistakes:

* ``--check`` changes nothing on disk or on any machine: it runs against a scratch copy of
  the state directory in a temporary folder (its log stays there) and holds the lock shared.
* Installing over PXE wipes disks, so it takes explicit intent per node (``install: pxe``
  in the manifest while the node is new, or ``--reinstall``), shown in the plan and in the
  confirmation; a node marked for install that already answers SSH is not wiped.
* Every secret the run needs (BMC passwords of the nodes to install, the SSH key) is
  checked before the first change.
* Ctrl-C, SIGTERM and SIGHUP stop the whole ansible-playbook process tree; the lock is
  held until it is gone and the run is recorded as interrupted with what finished.
* A node gets a result only from what actually ran on it (``not run`` otherwise), and one
  failed node never stops the others' plays (the ``provision`` strategy plugin).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from rich.console import Console

from provisioner import inventory, live
from provisioner import preflight as install_preflight
from provisioner.areas import registry
from provisioner.bmc import BmcError, bmc_answers, resolve_password
from provisioner.content import project_root
from provisioner.display import LiveProgress, install_table, print_diffs, print_plan, recap_table
from provisioner.errors import ProvisionError
from provisioner.interrupts import Interrupted, Signals
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.ranges import listed
from provisioner.plan import (
    PASSIVE_SECTIONS,
    ClusterVars,
    Plan,
    PlaySpec,
    cluster_fingerprint,
    compute,
    heavy_cluster_fingerprints,
    load_plays,
    node_sections,
)
from provisioner.runner import (
    Reach,
    RunResult,
    SshTarget,
    Tracker,
    first_contact,
    probe_reach,
    probe_ssh,
    probes_end_with_a_signal,
    run_playbook,
    scan_for_secrets,
)
from provisioner.settings import DEFAULT_STRATEGY
from provisioner.state import RunRecord, State, StateDir, atomic_write, now
from provisioner.verify.remote import node_targets

TARGETS_GROUP = "provision_targets"
# The probe that keeps a node marked for install from being wiped when it already runs an
# SSH server: short, since such a node is normally switched off or waiting for PXE.
INSTALL_PROBE_TIMEOUT = 5.0

# Steps that prepare control-machine material before a run (e.g. the munge key). Each gets
# the loaded manifest and the state directory; areas declare theirs in the registry.
PrepareHook = Callable[[Loaded, StateDir], None]
PREPARE_HOOKS: list[PrepareHook] = registry.prepare_hooks()


@dataclass
class ApplyOptions:
    limit: list[str] | None = None
    check: bool = False
    yes: bool = False
    full: bool = False
    reinstall: list[str] = field(default_factory=list)
    install_timeout: float | None = None  # seconds for one node's OS install; None: the default
    # seconds any task may take on a node (the stall guard); None: DEFAULT_STALL_TIMEOUT for
    # tasks without a bound of their own, the roles' own bounds for the rest
    stall_timeout: int | None = None
    strategy: str = DEFAULT_STRATEGY  # Ansible's execution strategy: mitogen or linear
    verbosity: int = 0  # -v count: Ansible's own output at that verbosity instead of the live table


@dataclass(frozen=True)
class Ran:
    """One run of site.yml as it ended, for ``--json`` (apply's, a roll's batches, remove's)."""

    id: str
    check: bool
    result: str  # ok, failed, interrupted (a dry run: ok or failed)
    log: str | None  # the run's Ansible log; None when Ansible did not run (no node reachable)
    nodes: dict[str, str]  # per node: ok, failed, unreachable, not run, interrupted, install failed

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "check": self.check, "result": self.result, "log": self.log, "nodes": self.nodes}


@dataclass
class Installs:
    """The PXE installs of a run, after the SSH probe of the nodes marked for one."""

    wipe: list[str] = field(default_factory=list)  # nodes that will be installed (their disks wiped)
    spared: dict[str, str] = field(default_factory=dict)  # marked for install, but SSH answers: why not


def ssh_targets(loaded: Loaded, names: list[str]) -> list[SshTarget]:
    return list(node_targets(loaded.manifest, names).values())


def meet_new_nodes(loaded: Loaded, state: StateDir, names: list[str], opts: ApplyOptions) -> None:
    """Under Mitogen, record new nodes' host keys before Ansible runs (see first_contact);
    a node not reached is left for Ansible to report as unreachable."""
    if opts.strategy == "mitogen":
        first_contact(state.known_hosts, ssh_targets(loaded, names))


def live_reads(loaded: Loaded, st: State, state: StateDir) -> list[live.LiveRead]:
    """The services plan reads live (slurmdbd's accounts): what the light plays would change."""
    return live.over_ssh(loaded.manifest, st, state)


def disk_reads(loaded: Loaded, st: State, state: StateDir, names: list[str]) -> list[live.DiskVerdict]:
    """The disks the plays may take on ``names``, read before anything runs (the areas'
    disk reads: storage's new scratch volumes and pools)."""
    return live.disks_over_ssh(loaded.manifest, st, state, names)


def disk_refusal(plan: Plan, installs: list[str], reads: Callable[[list[str]], list[live.DiskVerdict]],
                 console: Console) -> str:
    """Why the apply stops before it runs anything ("" when it goes on): a disk that a node's
    plays would take holds data or is in use, as its role would find when it got there. Read
    on the nodes that get node-local plays (the plan's targets) and are not installed in
    this run, where an area has disks to read; what could not be read or judged is said,
    and left to the roles."""
    names = [n for n in plan.targets if n not in installs]
    if not names:
        return ""
    lines: list[str] = []
    for verdict in reads(names):
        if verdict.error:
            console.print(f"{verdict.node}: disks not read before the apply ({verdict.error}); the roles check them",
                          highlight=False, markup=False)
        for note in verdict.notes:
            console.print(f"{verdict.node}: {note}", highlight=False, markup=False)
        lines += [f"{verdict.node}: {line}" for line in verdict.refused]
    if not lines:
        return ""
    return "nothing was changed; disks the plays would take hold data or are in use:\n  " + "\n  ".join(lines)


def nothing_to_run(plan: Plan, opts: ApplyOptions, reads: Callable[[], list[live.LiveRead]]) -> bool:
    """Whether this apply has nothing to run: no node-local play, the cluster-wide files as
    recorded, no install or upgrade, not ``--full``, and every service read live as the
    manifest says (a read that failed proves nothing: the plays run). ``reads`` is called
    only when the plan alone has no change. Such an apply ran the light plays on every node
    before, about 1.7 s of the controller's CPU per node (docs/benchmarks.md)."""
    if opts.full or opts.reinstall or plan.has_changes or any(u.steps for u in plan.upgrades):
        return False
    return all(not r.error and not r.pending for r in reads())


def targets_inventory(targets: list[str]) -> str:
    """An extra inventory source defining the group of nodes that get node-local plays."""
    data = {"all": {"children": {TARGETS_GROUP: {"hosts": {t: None for t in targets}}}}}
    return "# Written by `provision apply`: nodes that get node-local plays in this run.\n" + yaml.safe_dump(data)


def declared_secret_envs(loaded: Loaded) -> set[str]:
    """Environment variables holding secrets: BMC passwords and every area's (alert receivers')."""
    bmc = {n.bmc.password_env for n in loaded.manifest.nodes if n.bmc and n.bmc.password_env}
    return bmc | registry.secret_envs(loaded.manifest)


def known_secret_values(loaded: Loaded, state: StateDir) -> list[str]:
    """Secret values we must never find in artifacts: those of the secret variables, and
    what the areas prepared in the state directory (the munge key, the receivers' secrets)."""
    values = [os.environ[name] for name in declared_secret_envs(loaded) if os.environ.get(name)]
    values.extend(registry.secret_values(state))
    return values


def missing_secrets(loaded: Loaded, installs: list[str]) -> list[str]:
    """Every secret this run will need that is not there, in words: the BMC password of
    each node to install, the SSH private key. Checked before the first change."""
    problems: list[str] = []
    for name in installs:
        bmc = loaded.manifest.node(name).bmc
        if bmc is None:
            problems.append(f"{name} has no bmc section in the manifest")
            continue
        try:
            resolve_password(name, bmc)
        except BmcError as exc:
            problems.append(str(exc))
    key = loaded.manifest.cluster.ssh.private_key
    if key is not None:
        path = Path(key).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            problems.append(f"cluster.ssh.private_key {path} is not a readable file")
    return problems


def probe_installs(loaded: Loaded, plan: Plan, opts: ApplyOptions,
                   probe: Callable[[str, int], Reach] | None = None) -> Installs:
    """The nodes a run installs over PXE: the plan's installs, less new nodes marked for
    install that already run an SSH server (a hand-installed machine is never wiped on an
    inference; ``--reinstall`` is the way to wipe a running one). Probing changes nothing."""
    m = loaded.manifest
    port = m.cluster.ssh.port

    def default_probe(address: str, p: int) -> Reach:
        return probe_ssh(address, p, timeout=INSTALL_PROBE_TIMEOUT, banner_timeout=INSTALL_PROBE_TIMEOUT)

    check = probe or default_probe
    fresh = [n for n in plan.installs if n not in opts.reinstall]
    spared: dict[str, str] = {}
    if fresh:
        with ThreadPoolExecutor(max_workers=min(32, len(fresh))) as pool:
            reaches = list(pool.map(lambda n: check(str(m.node(n).ip), port), fresh))
        for name, reach in zip(fresh, reaches, strict=True):
            if reach.ok:
                spared[name] = (f"{name}: marked install: pxe and new, but an SSH server answers at "
                                f"{m.node(name).ip}:{port} ({reach.banner}): not wiped; apply configures it as "
                                f"it is (--reinstall {name} wipes it)")
    return Installs([n for n in plan.installs if n not in spared], spared)


def confirm(console: Console, plan: Plan, installs: Installs, opts: ApplyOptions) -> None:
    """Ask before any change, after showing what is destructive. ``--yes`` skips it; without
    a terminal it is refused."""
    for why in installs.spared.values():
        console.print(why, style="yellow", markup=False, highlight=False)
    if installs.wipe:
        node = {n.name: n for n in plan.nodes}
        console.print("These nodes will be installed over PXE (BMC power cycle); their install disks are WIPED:",
                      style="bold red", markup=False, highlight=False)
        for name in installs.wipe:
            console.print(f"  {name}: {node[name].install}", style="bold red", markup=False, highlight=False)
    if opts.yes:
        return
    if not sys.stdin.isatty():
        if installs.wipe:
            raise ProvisionError(f"refusing to install over PXE (wiping {', '.join(installs.wipe)}) without "
                                 "confirmation: stdin is not a terminal; pass --yes")
        raise ProvisionError("refusing to apply without confirmation: stdin is not a terminal; pass --yes")
    if installs.wipe:
        answer = console.input("Type 'wipe' to install these nodes and apply, anything else stops: ", markup=False)
        if answer.strip() != "wipe":
            raise ProvisionError("aborted: nothing was changed")
        return
    answer = console.input("Apply these changes? [y/N] ", markup=False).strip().lower()
    if answer not in ("y", "yes"):
        raise ProvisionError("aborted: nothing was changed")


def unreachable_now(loaded: Loaded, names: list[str],
                    probe: Callable[[str, int], Reach] | None = None) -> dict[str, str]:
    """Nodes that cannot be reached over SSH right now, with the reason: refused, no route,
    no SSH banner, or a server that stalls at any step up to authentication, each step
    bounded (probe_reach; docs/operations.md). Ansible would spend its connect timeout
    and retries on each (up to 185 s) and then report a broken pipe; this fails them at
    once, in words."""
    m = loaded.manifest
    if not names:
        return {}
    user = m.cluster.ssh.user
    check = probe or (lambda address, port: probe_reach(address, port, user))
    # a signal meanwhile ends the probes' ssh clients, and the pool's threads with them, at once
    with ThreadPoolExecutor(max_workers=min(32, len(names))) as pool, probes_end_with_a_signal():
        reaches = list(pool.map(lambda n: check(str(m.node(n).ip), m.cluster.ssh.port), names))
    return {name: reach.reason for name, reach in zip(names, reaches, strict=True) if not reach.ok}


def record_result(
    st: State, loaded: Loaded, plan: Plan, result: RunResult, run_hosts: list[str], opts: ApplyOptions
) -> None:
    """Each node's result is what actually ran on it (RunResult.result_of); fingerprints,
    lifecycle and applied_at are recorded only for nodes that finished without failure."""
    m = loaded.manifest
    cluster = registry.cluster_vars(m)
    heavy_cluster = heavy_cluster_fingerprints(m, cluster)
    outcomes = {name: result.result_of(name) for name in run_hosts}
    for name in run_hosts:
        ns = st.node(name)
        ns.last_result = outcomes[name]
        ns.last_run = result.artifact_dir.parent.parent.name
        if outcomes[name] != "ok":
            continue
        current = node_sections(m, m.node(name), heavy_cluster)
        if name in plan.targets or not ns.fingerprints:
            ns.fingerprints = current
            ns.recorded = registry.recorded(m, m.node(name))  # what its node-local plays made it run
        else:  # passive sections (the BMC) need no node-local play: this run settles them too
            ns.fingerprints.update({k: v for k, v in current.items() if k in PASSIVE_SECTIONS})
        ns.lifecycle = "configured"
        ns.applied_at = now()
    names = set(m.node_names())
    whole = opts.limit is None and set(run_hosts) == names
    if whole and result.rc == 0 and all(o == "ok" for o in outcomes.values()):
        record_cluster_files(st, m, cluster)


def record_cluster_files(st: State, m: Manifest, cluster: ClusterVars | None = None) -> None:
    """Every node has the manifest's cluster-wide files: record their fingerprint, and nodes
    the manifest no longer lists as removed (the files now render without them)."""
    st.cluster_fingerprint = cluster_fingerprint(m, cluster)
    names = set(m.node_names())
    for name in [n for n in st.nodes if n not in names]:
        mark_removed(st, name)


def mark_removed(st: State, name: str) -> None:
    """Record ``name`` as removed: the cluster's files no longer list it. The fingerprints
    go (a node of that name added again is new); its disks were never touched."""
    ns = st.node(name)
    if ns.lifecycle != "removed":
        ns.lifecycle, ns.fingerprints, ns.removed_at = "removed", {}, now()


def settle_cluster_files(loaded: Loaded, state: StateDir) -> None:
    """After ``apply --rolling`` of the whole cluster ended well: every node ran the light
    plays in one of its applies (the others first, then each batch), so the cluster-wide
    files are the manifest's everywhere. Record it as a whole apply does (the cluster
    fingerprint; nodes the manifest no longer lists are removed), which those applies, each
    with a --limit, could not."""
    m = loaded.manifest
    with state.lock("apply"):
        st = state.load_for(m.cluster.name)
        record_cluster_files(st, m)
        state.save(st)


def close_abandoned_runs(st: State) -> None:
    """Runs still marked running when we hold the lock ended without recording a result
    (the process was killed): say so instead of 'running' forever."""
    for run in st.runs:
        if run.result == "running":
            run.result = "interrupted"
            run.note = "the run ended without recording its result (its process was killed)"


def finish_record(record: RunRecord, result: RunResult, run_hosts: list[str]) -> None:
    record.finished = now()
    record.failed = result.failed_hosts
    record.changed = {h: p.changed for h, p in result.hosts.items()}
    record.results = {h: result.result_of(h) for h in run_hosts}
    if result.interrupted is not None:
        record.result = "interrupted"
        record.note = f"interrupted by {Interrupted(result.interrupted).signal_name}"
        record.stopped_at = {h: f"{p.play}: {p.task}" + ("" if p.task_started is None else " (running)")
                             for h, p in result.hosts.items() if record.results.get(h) == "interrupted"}


def new_run_id(suffix: str = "") -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + suffix


CHECK_PREFIX = "provision-check-"
CHECK_MARK = "check.lock"  # in a dry run's scratch folder: its cluster's name, flock'ed while it runs
KEEP_CHECKS = 3  # dry runs whose scratch folder (inventory, log) is kept, per cluster


def prune_checks(folder: Path, cluster: str, keep: int = KEEP_CHECKS) -> list[Path]:
    """Remove the scratch folders of this cluster's dry runs but the ``keep`` newest; one
    whose run still holds its mark, or of another cluster, stays. Returns those removed."""
    mine = []
    for path in folder.glob(f"{CHECK_PREFIX}{cluster}-*"):
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink() and (path / CHECK_MARK).read_text() == cluster:
                mine.append((path.stat().st_mtime, path))
    removed = []
    for _, path in sorted(mine, reverse=True)[keep:]:
        try:
            fd = os.open(path / CHECK_MARK, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a dry run still running holds it
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


SCRATCH_HINT = "set TMPDIR to a writable folder with room"


def make_scratch(cluster: str) -> Path:
    """A dry run's private scratch folder in the temporary folder; a full or read-only one is
    one line, not Python's list of the folders it tried."""
    try:
        return Path(tempfile.mkdtemp(prefix=f"{CHECK_PREFIX}{cluster}-"))
    except OSError as exc:  # FileNotFoundError: 'No usable temporary directory found in [...]'
        raise ProvisionError(f"cannot make the dry run's scratch folder: {exc.strerror or exc}; "
                             f"{SCRATCH_HINT}") from None


def mark_scratch(root: Path, cluster: str) -> int:
    """Write and hold the scratch folder's mark (its cluster's name: what :func:`prune_checks`
    removes by); a mark the disk cut short would make the folder one no later run prunes, so
    then the folder goes at once."""
    path = root / CHECK_MARK
    data = cluster.encode()
    mark = -1
    try:
        mark = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(mark, fcntl.LOCK_EX)
        written = os.write(mark, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes written", str(path))
        return mark
    except OSError as exc:
        if mark >= 0:
            os.close(mark)
        shutil.rmtree(root, ignore_errors=True)
        raise ProvisionError(f"cannot write {path}: {exc.strerror or exc}; {SCRATCH_HINT}") from None


@contextlib.contextmanager
def scratch_state(state: StateDir, cluster: str) -> Iterator[StateDir]:
    """A scratch copy of the state directory for a dry run, in a private temporary folder:
    known host keys and secrets are copied in (a check may record a new host key, never
    into the real state). On the way out the copies are
    removed; the run's log and inventory stay for the operator to read, those of the
    KEEP_CHECKS newest dry runs of the cluster."""
    scratch = StateDir(make_scratch(cluster))
    mark = mark_scratch(scratch.root, cluster)
    try:
        scratch.ensure()
        if state.known_hosts.is_file():
            shutil.copy2(state.known_hosts, scratch.known_hosts)
        if state.secrets.is_dir():
            shutil.copytree(state.secrets, scratch.secrets, dirs_exist_ok=True)
        yield scratch
    finally:
        shutil.rmtree(scratch.secrets, ignore_errors=True)
        with contextlib.suppress(OSError):
            scratch.known_hosts.unlink()
        os.close(mark)
        with contextlib.suppress(OSError):
            prune_checks(scratch.root.parent, cluster)


def apply(loaded: Loaded, state: StateDir, opts: ApplyOptions, console: Console,
          ran: list[Ran] | None = None) -> int:
    """``ran``: each run of site.yml this makes is appended to it (for ``--json``)."""
    runs: list[Ran] = [] if ran is None else ran
    if opts.check:
        return dry_run(loaded, state, opts, console, runs)
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    fresh = not state.root.exists()
    state.ensure()
    try:
        return _apply(loaded, state, opts, console, plays, runs)
    except ProvisionError:
        if fresh and not state.state_file.exists():  # refused or aborted before any change: leave no trace
            state.remove_if_untouched()
        raise


def _apply(loaded: Loaded, state: StateDir, opts: ApplyOptions, console: Console, plays: list[PlaySpec],
           ran: list[Ran]) -> int:
    m = loaded.manifest
    with state.lock("apply"), Signals() as signals:
        st = state.load_for(m.cluster.name)
        close_abandoned_runs(st)
        plan = compute(m, st, plays, limit=opts.limit, full=opts.full, reinstall=opts.reinstall)
        print_plan(console, plan, m.cluster.name)
        refused = [f"{u.area}: {u.refusal}" for u in plan.upgrades if u.refusal]
        if refused:
            raise ProvisionError("nothing was changed; upgrade refused: " + "; ".join(refused))
        if nothing_to_run(plan, opts, lambda: live_reads(loaded, st, state)):
            console.print("nothing to change: every node is as the manifest says, as recorded; "
                          "`apply --full` runs every play again (drift repair)", highlight=False, markup=False)
            return 0
        installs = probe_installs(loaded, plan, opts)
        problems = missing_secrets(loaded, installs.wipe)
        if problems:
            raise ProvisionError("nothing was changed; this run needs secrets that are not there: "
                                 + "; ".join(problems))
        refusal = disk_refusal(plan, installs.wipe, lambda names: disk_reads(loaded, st, state, names), console)
        if refusal:
            raise ProvisionError(refusal)
        # before anything is armed or powered: images proven, ramdisk drivers, disks, BMCs
        checks = install_preflight.run(m, state.root / "images", installs.wipe, bmc_answers)
        if install_preflight.failed(checks):
            raise ProvisionError(install_preflight.refusal(checks))
        install_preflight.print_checks(console, checks)
        confirm(console, plan, installs, opts)
        st.cluster = m.cluster.name
        for hook in PREPARE_HOOKS:
            hook(loaded, state)
        files = inventory.build(m, source=str(loaded.path), state_dir=state.root)
        inventory.write(files, state.inventory)

        run_id = new_run_id()
        run_hosts = [n for n in m.node_names() if opts.limit is None or n in opts.limit]
        record = RunRecord(id=run_id, started=now(), command="apply", limit=list(opts.limit or []),
                           targets=list(plan.targets))
        st.runs.append(record)
        state.save(st)
        try:
            install_failed = install_phase(loaded, state, st, installs.wipe, opts, console, signals, run_id)
            if install_failed:  # nodes that did not install cannot be configured in this run
                run_hosts = [n for n in run_hosts if n not in install_failed]
                if not run_hosts:
                    record.finished, record.result = now(), "failed"
                    record.results = dict.fromkeys(install_failed, "install failed")
                    state.save(st)
                    ran.append(Ran(record.id, False, record.result, None, dict(record.results)))
                    console.print(f"no node left to configure; failed installs: {', '.join(install_failed)}",
                                  style="red", highlight=False)
                    return 1
                plan = compute(m, st, plays, limit=run_hosts, full=opts.full)
            return configure(loaded, state, st, plan, record, run_hosts, opts, console, signals, install_failed,
                             ran)
        except BaseException as exc:  # whatever ended the run, it is recorded, never left "running"
            if record.result == "running":
                record.finished = now()
                record.result = "interrupted" if isinstance(exc, Interrupted) else "failed"
                record.note = str(exc) or type(exc).__name__
                state.save(st)
            raise


def configure(loaded: Loaded, state: StateDir, st: State, plan: Plan, record: RunRecord, run_hosts: list[str],
              opts: ApplyOptions, console: Console, signals: Signals, install_failed: list[str],
              ran: list[Ran]) -> int:
    """Run site.yml on ``run_hosts`` (after the installs) and record what ran where."""
    m = loaded.manifest
    result = run_site(loaded, state, plan, record.id, run_hosts, opts, console, signals)
    leaks = scan_for_secrets(state.runs / record.id, known_secret_values(loaded, state))
    finish_record(record, result, run_hosts)
    record.results.update(dict.fromkeys(install_failed, "install failed"))
    ok = (result.rc == 0 and not result.failed_hosts and not leaks and not install_failed
          and all(result.result_of(h) == "ok" for h in run_hosts))
    if result.interrupted is None:
        record.result = "ok" if ok else "failed"
    record_result(st, loaded, plan, result, run_hosts, opts)
    state.save(st)  # before any output: after SIGHUP the terminal may be gone
    ran.append(Ran(record.id, False, record.result, log_of(result), dict(record.results)))
    if result.interrupted is not None:
        with contextlib.suppress(OSError):
            console.print(recap_table(result, f"recap (run {record.id}, interrupted)"))
        detail = f"recorded as run {record.id}; log: {result.log}"
        if result.leftovers:
            detail += f"; processes that would not stop: {', '.join(map(str, result.leftovers))}"
        raise Interrupted(result.interrupted, detail)
    console.print(recap_table(result, f"recap (run {record.id})"))
    if leaks:
        for path in leaks:
            path.unlink()
        raise ProvisionError(f"a secret appeared in {len(leaks)} run artifact file(s); they were deleted")
    summarize(console, "apply", result, run_hosts, m.cluster.name)
    return 0 if ok else 1


def summarize(console: Console, what: str, result: RunResult, run_hosts: list[str], cluster: str) -> None:
    outcomes = [result.result_of(h) for h in run_hosts]
    counts = {word: outcomes.count(word) for word in ("ok", "failed", "unreachable", "not run") if word in outcomes}
    total_changed = sum(p.changed for p in result.hosts.values())
    log = f"log: {result.log}" if result.status != "skipped" else "Ansible did not run: no node was reachable"
    console.print(
        f"{what} finished: {counts.get('ok', 0)} ok, {counts.get('failed', 0) + counts.get('unreachable', 0)} failed"
        + (f", {counts['not run']} not run" if counts.get("not run") else "")
        + f", {total_changed} {'would change' if what == 'check' else 'changed'} ({log})",
        highlight=False, markup=False,
    )
    bad = [h for h, o in zip(run_hosts, outcomes, strict=True) if o != "ok"]
    if bad:
        console.print(f"failed nodes: {listed(bad)}; re-run apply to continue them", style="red",
                      highlight=False, markup=False)


def run_site(loaded: Loaded, state: StateDir, plan: Plan, run_id: str, run_hosts: list[str], opts: ApplyOptions,
             console: Console, signals: Signals) -> RunResult:
    """site.yml on the reachable ``run_hosts``; the unreachable ones fail at once."""
    m = loaded.manifest
    atomic_write(state.inventory / "targets.yml", targets_inventory(plan.targets))
    down = unreachable_now(loaded, run_hosts)
    reachable = [h for h in run_hosts if h not in down]
    meet_new_nodes(loaded, state, reachable, opts)
    live_title = f"{'check' if opts.check else 'apply'} {m.cluster.name}"
    with LiveProgress(console, live_title, enabled=opts.verbosity == 0) as live, signals.deferred():
        tracker = Tracker(run_hosts, on_change=live.update)
        for name, reason in down.items():
            tracker.unreachable(name, reason)
        if not reachable:
            artifact = state.runs / run_id / "artifacts" / "artifacts"
            return RunResult(0, "skipped", tracker.hosts, artifact, finished=True)
        limit = None if reachable == m.node_names() else reachable
        return run_playbook(
            state=state, run_id=run_id, playbook=project_root() / "playbooks" / "site.yml",
            inventory=state.inventory, hosts=reachable, extravars={TARGETS_GROUP: TARGETS_GROUP}, limit=limit,
            check=opts.check, tracker=tracker, secret_names=declared_secret_envs(loaded),
            stall_timeout=opts.stall_timeout, strategy=opts.strategy, stop=lambda: signals.received,
            verbosity=opts.verbosity,
        )


def log_of(result: RunResult) -> str | None:
    return None if result.status == "skipped" else str(result.log)


def dry_run(loaded: Loaded, state: StateDir, opts: ApplyOptions, console: Console, ran: list[Ran]) -> int:
    """``apply --check``: Ansible's check mode with --diff against a scratch copy of the
    state; nothing under the state directory changes, nothing is installed or powered."""
    m = loaded.manifest
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    with state.shared_lock(), Signals() as signals:
        st = state.load_for(m.cluster.name)
        plan = compute(m, st, plays, limit=opts.limit, full=opts.full, reinstall=opts.reinstall)
        print_plan(console, plan, m.cluster.name)
        refused = [f"{u.area}: {u.refusal}" for u in plan.upgrades if u.refusal]
        if refused:
            raise ProvisionError("nothing was changed; upgrade refused: " + "; ".join(refused))
        installs = probe_installs(loaded, plan, opts)
        for why in installs.spared.values():
            console.print(why, style="yellow", markup=False, highlight=False)
        if installs.wipe:
            console.print(f"check: would install over PXE, wiping their install disks: {', '.join(installs.wipe)} "
                          "(not checked: they have no OS to check yet)", style="bold red", markup=False,
                          highlight=False)
        for problem in missing_secrets(loaded, installs.wipe):
            console.print(f"check: apply would stop here: {problem}", style="red", markup=False, highlight=False)
        install_preflight.print_checks(
            console, install_preflight.run(m, state.root / "images", installs.wipe, bmc_answers), "check: preflight: ")
        run_hosts = [n for n in m.node_names() if (opts.limit is None or n in opts.limit) and n not in installs.wipe]
        if not run_hosts:
            console.print(f"check: nothing to check; nothing under {state.root} changed", highlight=False)
            return 0
        with scratch_state(state, m.cluster.name) as scratch:
            for hook in PREPARE_HOOKS:
                hook(loaded, scratch)
            inventory.write(inventory.build(m, source=str(loaded.path), state_dir=scratch.root), scratch.inventory)
            run_id = new_run_id("-check")
            result = run_site(loaded, scratch, plan, run_id, run_hosts, opts, console, signals)
            leaks = scan_for_secrets(scratch.runs / run_id, known_secret_values(loaded, scratch))
            for path in leaks:
                path.unlink()
            if result.interrupted is not None:
                raise Interrupted(result.interrupted, f"nothing under {state.root} changed; log: {result.log}")
            console.print(recap_table(result, f"check recap (run {run_id})"))
            print_diffs(console, result, secrets=known_secret_values(loaded, scratch))
        summarize(console, "check", result, run_hosts, m.cluster.name)
        console.print(f"dry run: nothing under {state.root} changed (the check's inventory and log are in "
                      f"{scratch.root})", highlight=False, markup=False)
        if leaks:
            raise ProvisionError(f"a secret appeared in {len(leaks)} run artifact file(s); they were deleted")
        ok = result.rc == 0 and all(result.result_of(h) == "ok" for h in run_hosts)
        ran.append(Ran(run_id, True, "ok" if ok else "failed", log_of(result),
                       {h: result.result_of(h) for h in run_hosts}))
        return 0 if ok else 1


def install_phase(
    loaded: Loaded, state: StateDir, st: State, wipe: list[str], opts: ApplyOptions, console: Console,
    signals: Signals, run_id: str = "",
) -> list[str]:
    """Install ``wipe`` over BMC + PXE before configuring them (see probe_installs for who is
    in it). A node's lifecycle becomes ``installed`` only once it was reached over SSH with
    the host key its installer reported. Returns the nodes whose install failed. The PXE
    server's play logs to ``runs/<run_id>-pxe/``: the id of the run the state records."""
    installer = registry.install()
    if not wipe or installer is None:
        return []
    steps = installer.steps()
    m = loaded.manifest
    console.print(f"installing over PXE: {', '.join(wipe)}", highlight=False, markup=False)
    run_id = f"{run_id or new_run_id()}-pxe"
    head = m.head.name
    atomic_write(state.inventory / "targets.yml", targets_inventory([head]))
    meet_new_nodes(loaded, state, [head], opts)
    with LiveProgress(console, "PXE server", enabled=opts.verbosity == 0) as live, signals.deferred():
        tracker = Tracker([head], on_change=live.update)
        result = run_playbook(
            state=state, run_id=run_id, playbook=project_root() / "playbooks" / installer.playbook,
            inventory=state.inventory, hosts=[head],
            extravars={TARGETS_GROUP: TARGETS_GROUP, **steps.server_vars(m, wipe, state.root / "images")},
            limit=[head], tracker=tracker, secret_names=declared_secret_envs(loaded),
            stall_timeout=opts.stall_timeout, strategy=opts.strategy, stop=lambda: signals.received,
            verbosity=opts.verbosity,
        )
    if result.interrupted is not None:
        raise Interrupted(result.interrupted, "while preparing the PXE server; no node was installed")
    if result.failed_hosts:
        console.print(recap_table(result, "PXE server"))
        raise ProvisionError(f"the PXE server on {head} could not be prepared; no node was installed "
                             f"(log: {result.log})")
    with signals.deferred():
        results = steps.install(m, wipe, known_hosts=state.known_hosts, total=opts.install_timeout, wait=signals.wait)
    failed = []
    for r in results:
        ns = st.node(r.node)
        if r.ok:
            ns.lifecycle = "installed"
            ns.fingerprints = {}  # a fresh OS: every node-local play runs
        else:
            failed.append(r.node)
            ns.last_result = f"install failed at {r.stage}: {r.reason}"
    state.save(st)
    with contextlib.suppress(OSError):
        console.print(install_table(results))
    signals.raise_if_stopped("during the PXE installs; finished installs are recorded")
    return failed
