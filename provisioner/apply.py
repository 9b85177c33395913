"""`provision apply`: plan, lock, write the inventory, run the playbooks, record state."""

from __future__ import annotations

import base64
import datetime as dt
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console

from provisioner import inventory, slurm
from provisioner.display import LiveProgress, print_plan, recap_table
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
from provisioner.runner import RunResult, Tracker, project_root, run_playbook, scan_for_secrets
from provisioner.state import RunRecord, State, StateDir, now

TARGETS_GROUP = "provision_targets"

# Steps that prepare control-machine material before a run (e.g. the munge key). Each gets
# the loaded manifest and the state directory; areas register theirs in PREPARE_HOOKS.
PrepareHook = Callable[[Loaded, StateDir], None]
PREPARE_HOOKS: list[PrepareHook] = [slurm.prepare_munge_key]


@dataclass
class ApplyOptions:
    limit: list[str] | None = None
    check: bool = False
    yes: bool = False
    full: bool = False


def targets_inventory(targets: list[str]) -> str:
    """An extra inventory source defining the group of nodes that get node-local plays."""
    data = {"all": {"children": {TARGETS_GROUP: {"hosts": {t: None for t in targets}}}}}
    return "# Written by `provision apply`: nodes that get node-local plays in this run.\n" + yaml.safe_dump(data)


def declared_secret_envs(loaded: Loaded) -> set[str]:
    return {n.bmc.password_env for n in loaded.manifest.nodes if n.bmc and n.bmc.password_env}


def known_secret_values(loaded: Loaded, state: StateDir) -> list[str]:
    """Secret values we must never find in artifacts: BMC passwords from env, the munge key."""
    import os

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
    heavy_cluster = heavy_cluster_fingerprints(m)
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
        st.cluster_fingerprint = cluster_fingerprint(m)
        for name in [n for n in st.nodes if n not in m.node_names()]:
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
        (state.inventory / "targets.yml").write_text(targets_inventory(plan.targets))

        run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        run_hosts = [n for n in m.node_names() if opts.limit is None or n in opts.limit]
        record = RunRecord(id=run_id, started=now(), command="apply --check" if opts.check else "apply",
                           limit=list(opts.limit or []), targets=list(plan.targets))
        st.runs.append(record)
        state.save(st)

        with LiveProgress(console, f"apply {m.cluster.name}") as live:
            tracker = Tracker(run_hosts, on_change=live.update)
            result = run_playbook(
                state=state, run_id=run_id, playbook=site, inventory=state.inventory, hosts=run_hosts,
                extravars={TARGETS_GROUP: TARGETS_GROUP}, limit=opts.limit, check=opts.check,
                tracker=tracker, secret_names=declared_secret_envs(loaded),
            )
        console.print(recap_table(result, f"recap (run {run_id})"))

        leaks = scan_for_secrets(state.runs / run_id, known_secret_values(loaded, state))
        record.finished = now()
        record.failed = result.failed_hosts
        record.changed = {h: p.changed for h, p in result.hosts.items()}
        ok = result.rc == 0 and not result.failed_hosts and not leaks
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


def default_inventory_dir(cluster: str) -> Path:
    return Path.cwd() / "inventory" / cluster
