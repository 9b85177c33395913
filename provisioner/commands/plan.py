"""`provision plan MANIFEST`: what apply would change, per node."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from provisioner.commands.common import guarded, limit, load
from provisioner.content import project_root
from provisioner.display import print_plan
from provisioner.plan import compute, load_plays
from provisioner.state import StateDir


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    state_dir = StateDir.beside(args.manifest, args.state_dir)
    plays = load_plays(project_root() / "playbooks" / "site.yml")
    state = state_dir.load_for(loaded.manifest.cluster.name)  # refused when it is another cluster's
    plan = compute(loaded.manifest, state, plays, limit=limit(loaded, args.limit), full=args.full)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print_plan(out, plan, loaded.manifest.cluster.name)
    if args.detailed_exitcode and plan.has_changes:
        return 2
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
