"""`provision plan MANIFEST`: what apply would change, per node."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from provisioner import live, preflight
from provisioner.commands.common import guarded, limit, load
from provisioner.content import project_root
from provisioner.display import print_live, print_plan
from provisioner.plan import compute, load_plays
from provisioner.state import StateDir


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    state_dir = StateDir.beside(args.manifest, args.state_dir)
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    state = state_dir.load_for(loaded.manifest.cluster.name)  # refused when it is another cluster's
    plan = compute(loaded.manifest, state, plays, limit=limit(loaded, args.limit), full=args.full)
    # what apply checks before the installs (apply asks the BMCs too)
    checks = preflight.run(loaded.manifest, state_dir.root / "images", plan.installs, None)
    reads = [] if args.offline else live.over_ssh(loaded.manifest, state, state_dir)
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


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
