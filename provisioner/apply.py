"""`provision apply`: plan, lock, write the inventory, run the playbooks, record state."""

from __future__ import annotations

import base64
import datetime as dt
import os
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import yaml
from rich.console import Console

from provisioner import inventory
from provisioner.areas import registry
from provisioner.areas.baremetal import install as baremetal
from provisioner.areas.slurm import decide as slurm
from provisioner.content import project_root
from provisioner.display import LiveProgress, install_table, print_plan, recap_table
from provisioner.errors import ProvisionError
from provisioner.manifest.load import Loaded
from provisioner.plan import (
    PASSIVE_SECTIONS,
    Plan,
    cluster_fingerprint,
    compute,
    heavy_cluster_fingerprints,
    load_plays,
    node_sections,
)
from provisioner.runner import (
    RunResult,
    SshTarget,
    Tracker,
    first_contact,
    run_playbook,
    scan_for_secrets,
)
from provisioner.settings import DEFAULT_STALL_TIMEOUT
from provisioner.state import RunRecord, State, StateDir, now

TARGETS_GROUP = "provision_targets"

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
    stall_timeout: int = DEFAULT_STALL_TIMEOUT  # seconds one task may take on a node (the stall guard)
    strategy: str = "linear"  # Ansible's execution strategy: linear, or mitogen


def ssh_targets(loaded: Loaded, names: list[str]) -> list[SshTarget]:
    ssh = loaded.manifest.cluster.ssh
    return [SshTarget(n, str(loaded.manifest.node(n).ip), ssh.port, ssh.user, ssh.private_key) for n in names]


def meet_new_nodes(loaded: Loaded, state: StateDir, names: list[str], opts: ApplyOptions) -> None:
    """Under Mitogen, record new nodes' host keys before Ansible runs (see first_contact);
    a node not reached is left for Ansible to report as unreachable."""
    if opts.strategy == "mitogen":
        first_contact(state.known_hosts, ssh_targets(loaded, names))


def targets_inventory(targets: list[str]) -> str:
    """An extra inventory source defining the group of nodes that get node-local plays."""
    data = {"all": {"children": {TARGETS_GROUP: {"hosts": {t: None for t in targets}}}}}
    return "# Written by `provision apply`: nodes that get node-local plays in this run.\n" + yaml.safe_dump(data)


def declared_secret_envs(loaded: Loaded) -> set[str]:
    return {n.bmc.password_env for n in loaded.manifest.nodes if n.bmc and n.bmc.password_env}


def known_secret_values(loaded: Loaded, state: StateDir) -> list[str]:
    """Secret values we must never find in artifacts: BMC passwords from env, the munge key."""
    values = [os.environ[name] for name in declared_secret_envs(loaded) if os.environ.get(name)]
    key = state.secrets / slurm.MUNGE_KEY_NAME
    if key.exists():
        raw = key.read_bytes()
        values.append(raw.hex())
        values.append(base64.b64encode(raw).decode())
    return values


def confirm(console: Console, plan: Plan, opts: ApplyOptions) -> None:
    if opts.yes or opts.check:
        return
    if not sys.stdin.isatty():
        raise ProvisionError("refusing to apply without confirmation: stdin is not a terminal; pass --yes")
    answer = console.input("Apply these changes? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise ProvisionError("aborted: nothing was changed")


def record_result(
    st: State, loaded: Loaded, plan: Plan, result: RunResult, run_hosts: list[str], opts: ApplyOptions
) -> None:
    """Fingerprints are recorded only for nodes that finished without failure."""
    m = loaded.manifest
    cluster = registry.cluster_vars(m)
    heavy_cluster = heavy_cluster_fingerprints(m, cluster)
    for name in run_hosts:
        ns = st.node(name)
        progress = result.hosts.get(name)
        failed = progress is not None and progress.status != "ok"
        ns.last_result = "failed" if failed else "ok"
        ns.last_run = result.artifact_dir.parent.parent.name
        if failed:
            continue
        current = node_sections(m, m.node(name), heavy_cluster)
        if name in plan.targets or not ns.fingerprints:
            ns.fingerprints = current
        else:  # passive sections (the BMC) need no node-local play: this run settles them too
            ns.fingerprints.update({k: v for k, v in current.items() if k in PASSIVE_SECTIONS})
        ns.lifecycle = "configured"
        ns.applied_at = now()
    if opts.limit is None and not result.failed_hosts and result.rc == 0:
        st.cluster_fingerprint = cluster_fingerprint(m, cluster)
        names = set(m.node_names())
        for name in [n for n in st.nodes if n not in names]:
            del st.nodes[name]


def apply(loaded: Loaded, state: StateDir, opts: ApplyOptions, console: Console) -> int:
    m = loaded.manifest
    root = project_root()
    site = root / "playbooks" / "site.yml"
    state.ensure()
    with state.lock("apply"):
        st = state.load()
        if st.cluster and st.cluster != m.cluster.name:
            raise ProvisionError(
                f"{state.root} belongs to cluster {st.cluster!r}, not {m.cluster.name!r}; use --state-dir"
            )
        st.cluster = m.cluster.name
        plan = compute(m, st, load_plays(site), limit=opts.limit, full=opts.full)
        print_plan(console, plan, m.cluster.name)
        confirm(console, plan, opts)
        for hook in PREPARE_HOOKS:
            hook(loaded, state)

        files = inventory.build(m, source=str(loaded.path), state_dir=state.root)
        inventory.write(files, state.inventory)
        install_failed = install_phase(loaded, state, st, opts, console)
        if install_failed:
            # nodes that did not install cannot be configured in this run
            opts = ApplyOptions(**{**opts.__dict__, "limit": [n for n in (opts.limit or m.node_names())
                                                              if n not in install_failed]})
            plan = compute(m, st, load_plays(site), limit=opts.limit, full=opts.full)
            if not opts.limit:
                console.print(f"no node left to configure; failed installs: {', '.join(install_failed)}",
                              style="red", highlight=False)
                return 1
        (state.inventory / "targets.yml").write_text(targets_inventory(plan.targets))

        run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        run_hosts = [n for n in m.node_names() if opts.limit is None or n in opts.limit]
        record = RunRecord(id=run_id, started=now(), command="apply --check" if opts.check else "apply",
                           limit=list(opts.limit or []), targets=list(plan.targets))
        st.runs.append(record)
        state.save(st)

        meet_new_nodes(loaded, state, run_hosts, opts)
        with LiveProgress(console, f"apply {m.cluster.name}") as live:
            tracker = Tracker(run_hosts, on_change=live.update)
            result = run_playbook(
                state=state, run_id=run_id, playbook=site, inventory=state.inventory, hosts=run_hosts,
                extravars={TARGETS_GROUP: TARGETS_GROUP}, limit=opts.limit, check=opts.check,
                tracker=tracker, secret_names=declared_secret_envs(loaded),
                stall_timeout=opts.stall_timeout, strategy=opts.strategy,
            )
        console.print(recap_table(result, f"recap (run {run_id})"))

        leaks = scan_for_secrets(state.runs / run_id, known_secret_values(loaded, state))
        record.finished = now()
        record.failed = result.failed_hosts
        record.changed = {h: p.changed for h, p in result.hosts.items()}
        ok = result.rc == 0 and not result.failed_hosts and not leaks and not install_failed
        record.result = "ok" if ok else "failed"
        if not opts.check:
            record_result(st, loaded, plan, result, run_hosts, opts)
        state.save(st)
        if leaks:
            for path in leaks:
                path.unlink()
            raise ProvisionError(f"a secret appeared in {len(leaks)} run artifact file(s); they were deleted")
        total_changed = sum(p.changed for p in result.hosts.values())
        console.print(
            f"{'check' if opts.check else 'apply'} finished: {len(run_hosts) - len(result.failed_hosts)} ok, "
            f"{len(result.failed_hosts)} failed, {total_changed} changed (artifacts: {state.runs / run_id})",
            highlight=False,
        )
        if result.failed_hosts:
            console.print(f"failed nodes: {', '.join(result.failed_hosts)}; re-run apply to continue them",
                          style="red", highlight=False)
        return 0 if ok else 1


def answers_ssh(address: str, port: int = 22, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def install_phase(
    loaded: Loaded, state: StateDir, st: State, opts: ApplyOptions, console: Console
) -> list[str]:
    """Install new nodes (and --reinstall ones) over BMC + PXE before configuring them.

    A ``new`` node that already answers SSH is taken as installed by hand and never
    wiped: only ``--reinstall NODE`` reinstalls a running machine. Returns failed nodes.
    """
    m = loaded.manifest
    states = {name: ns.lifecycle for name, ns in st.nodes.items()}
    try:
        targets, _skipped = baremetal.plan_installs(m, states, opts.reinstall)
    except KeyError as exc:
        raise ProvisionError(str(exc.args[0])) from None
    if opts.limit is not None:
        targets = [t for t in targets if t in opts.limit]
    fresh = [t for t in targets if t not in opts.reinstall]
    with ThreadPoolExecutor(max_workers=16) as pool:
        probes = pool.map(lambda n: answers_ssh(str(m.node(n).ip), m.cluster.ssh.port), fresh)
        alive = dict(zip(fresh, probes, strict=True))
    for name in [n for n in fresh if alive.get(n)]:
        console.print(f"{name}: state 'new' but it answers SSH: taken as installed (--reinstall {name} wipes it)",
                      style="yellow", highlight=False)
        st.node(name).lifecycle = "installed"
        targets.remove(name)
    if not targets:
        return []
    if opts.check:
        console.print(f"check: would install over PXE: {', '.join(targets)}", highlight=False)
        return []
    if opts.reinstall and not opts.yes:
        if not sys.stdin.isatty():
            raise ProvisionError("--reinstall wipes disks; confirm on a terminal or pass --yes")
        answer = console.input(f"Reinstall (wipe) {', '.join(opts.reinstall)}? type 'reinstall' to go on: ")
        if answer.strip() != "reinstall":
            raise ProvisionError("aborted: nothing was reinstalled")
    console.print(f"installing over PXE: {', '.join(targets)}", highlight=False)
    root = project_root()
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-pxe"
    head = m.head.name
    (state.inventory / "targets.yml").write_text(targets_inventory([head]))
    meet_new_nodes(loaded, state, [head], opts)
    with LiveProgress(console, "PXE server") as live:
        tracker = Tracker([head], on_change=live.update)
        result = run_playbook(
            state=state, run_id=run_id, playbook=root / "playbooks" / "pxe.yml", inventory=state.inventory,
            hosts=[head], extravars={TARGETS_GROUP: TARGETS_GROUP, **baremetal.arm_extra_vars(targets)},
            limit=[head], tracker=tracker, secret_names=declared_secret_envs(loaded),
            stall_timeout=opts.stall_timeout, strategy=opts.strategy,
        )
    if result.failed_hosts:
        console.print(recap_table(result, "PXE server"))
        raise ProvisionError(f"the PXE server on {head} could not be prepared; no node was installed")
    timeouts = baremetal.Timeouts() if opts.install_timeout is None else baremetal.Timeouts(total=opts.install_timeout)
    results = baremetal.install_nodes(m, targets, known_hosts=state.known_hosts, timeouts=timeouts)
    console.print(install_table(results))
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
    return failed
