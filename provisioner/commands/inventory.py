"""`provision inventory MANIFEST [--out DIR] [--state-dir DIR]`: write the Ansible inventory,
as apply writes it: it names the state directory (``provision_state_dir``), whose
``secrets/`` the roles read on the control machine (the munge key, the replication key),
so a plain ``ansible-playbook`` run with it works; no secret is in it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from provisioner import inventory
from provisioner.commands.common import guarded, load
from provisioner.state import StateDir


def default_inventory_dir(manifest: Path, cluster: str) -> Path:
    """``inventory/<cluster>/`` beside the manifest, as the state directory is (it was the
    current folder's, so the same command wrote to different places from different folders)."""
    return manifest.resolve().parent / "inventory" / cluster


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    loaded = load(err, args.manifest)
    target = args.out or default_inventory_dir(args.manifest, loaded.manifest.cluster.name)
    state = StateDir.beside(args.manifest, args.state_dir)
    files = inventory.build(loaded.manifest, source=str(args.manifest), state_dir=state.root.resolve())
    written = inventory.write(files, target)
    if args.json:  # {"ok", "cluster", "out": the folder, "files": paths relative to it}
        print(json.dumps({"ok": True, "cluster": loaded.manifest.cluster.name, "out": str(target.resolve()),
                          "files": sorted(files)}, indent=2))
    else:
        out.print(f"wrote {len(written)} files to {target}", highlight=False)
    return 0


def main(args: argparse.Namespace) -> int:
    return guarded(run, args)
