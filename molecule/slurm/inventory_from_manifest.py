"""Stand-in for `provision apply`'s inventory step in the slurm scenario.

Usage: inventory_from_manifest.py MANIFEST STATE_DIR OUT_FILE

Loads the test manifest, creates the munge key, the backup passphrase and the registry
logins of containers in jobs in STATE_DIR (as apply's prepare steps do) and writes a YAML
inventory with the Slurm and backup groups and exactly what
provisioner.areas.slurm.rolevars, provisioner.areas.people.rolevars and
provisioner.areas.backup.rolevars emit: cluster_vars under all.vars (plus
provision_state_dir), node_vars per host. Prints
"changed" when OUT_FILE was (re)written, "unchanged" otherwise.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml

from provisioner.areas.backup import decide as backup_decide
from provisioner.areas.backup import rolevars as backup_vars
from provisioner.areas.people import rolevars as people_vars
from provisioner.areas.slurm import containers
from provisioner.areas.slurm import rolevars as slurm_vars
from provisioner.areas.slurm.decide import controller, slurm_nodes
from provisioner.areas.slurm.munge import ensure_munge_key
from provisioner.state import StateDir
from provisioner.validate import load_manifest


def inventory(manifest_file: str, state_dir: Path) -> dict[str, Any]:
    m = load_manifest(manifest_file).manifest
    slurm_node = {n.name: slurm_vars.node_vars(m, n) | people_vars.node_vars(m, n)
                  for n in m.nodes if slurm_vars.is_slurm_node(m, n)}
    return {
        "all": {
            "vars": {"provision_state_dir": str(state_dir), **slurm_vars.cluster_vars(m),
                     **people_vars.cluster_vars(m), **backup_vars.cluster_vars(m)},
            "children": {
                "slurm_controller": {"hosts": {controller(m).name: None}},
                "slurm_compute": {"hosts": {n.name: None for n in slurm_nodes(m)}},
                "slurm_node": {"hosts": slurm_node},
                "slurm_containers": {"hosts": dict.fromkeys(sorted(slurm_vars.groups(m)["slurm_containers"]))},
                "backup_head": {"hosts": dict.fromkeys(sorted(backup_vars.groups(m)["backup_head"]))},
            },
        }
    }


def main(argv: list[str]) -> int:
    manifest_file, state_dir, out_file = argv[1], Path(argv[2]), Path(argv[3])
    ensure_munge_key(state_dir / slurm_vars.MUNGE_KEY_RELATIVE)
    kept = state_dir / "secrets" / backup_decide.KEY_NAME  # the same passphrase on every run (idempotence)
    os.environ.setdefault("SLURMTEST_BACKUP_KEY",  # the manifest's backup.key_env
                          kept.read_text().strip() if kept.is_file() else secrets.token_urlsafe(24))
    backup_decide.prepare_key(load_manifest(manifest_file), StateDir(state_dir))
    creds = state_dir / "secrets" / containers.CREDENTIALS_NAME  # the same token on every run
    os.environ.setdefault("SLURMTEST_REGISTRY_TOKEN",  # the manifest's registry_logins[0].password_env
                          containers.credentials_passwords(creds.read_text())[0] if creds.is_file()
                          else "test-" + secrets.token_urlsafe(18))
    containers.prepare_credentials(load_manifest(manifest_file), StateDir(state_dir))
    text = "# Written by molecule/slurm/inventory_from_manifest.py\n" + yaml.safe_dump(
        inventory(manifest_file, state_dir), sort_keys=False
    )
    if out_file.exists() and out_file.read_text() == text:
        print("unchanged")
        return 0
    out_file.write_text(text)
    print("changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
