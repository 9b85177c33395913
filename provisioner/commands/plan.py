"""`provision plan MANIFEST`: what apply would change, per node."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from provisioner import live, preflight
from provisioner.areas import registry
from provisioner.commands.common import guarded, limit, load
from provisioner.content import project_root
from provisioner.display import print_live, print_plan
from provisioner.manifest.model import Manifest
from provisioner.plan import compute, load_plays
from provisioner.state import State, StateDir
from provisioner.verify.remote import children_end_with_the_command, node_targets, ssh_executor


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    state_dir = StateDir.beside(args.manifest, args.state_dir)
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    state = state_dir.load_for(loaded.manifest.cluster.name)  # refused when it is another cluster's
    plan = compute(loaded.manifest, state, plays, limit=limit(loaded, args.limit), full=args.full)
    # what apply checks before the installs (apply asks the BMCs too)
    checks = preflight.run(loaded.manifest, state_dir.root / "images", plan.installs, None)
    reads = [] if args.offline else read_live(loaded.manifest, state, state_dir)
    if args.json:
        print(json.dumps({**plan.to_json(), "preflight": [c.to_json() for c in checks],
                          "live": [r.to_json() for r in reads]}, indent=2))
    else:
        print_plan(out, plan, loaded.manifest.cluster.name)
        print_live(out, reads)
        if checks:
            preflight.print_checks(out, checks)
            out.print("preflight: apply asks each BMC too, and stops before any change if a check fails",
                      markup=False, highlight=False)
    if args.detailed_exitcode and (plan.has_changes or any(r.pending for r in reads)):
        return 2
    return 0


def read_live(m: Manifest, state: State, state_dir: StateDir) -> list[live.LiveRead]:
    """The services' drift (slurmdbd's accounts), over SSH as verify reaches nodes; a signal
    ends the ssh at once."""
    services = registry.live_drifts(m)
    if not services:
        return []
    targets = node_targets(m, {s.node(m).name for s in services})
    with children_end_with_the_command():
        return live.read(m, state, ssh_executor(targets, state_dir.known_hosts, grace=5))


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
