"""Stand-in for `provision apply`'s inventory and prepare steps in the monitoring scenario.

Usage: inventory_from_manifest.py MANIFEST STATE_DIR OUT_FILE

Loads the test manifest, prepares the receivers' secrets in STATE_DIR as apply does
(provisioner.areas.monitoring.decide.prepare_secrets: from the environment) and writes a YAML
inventory with the groups the monitoring playbook uses (provisioner.inventory.groups) and
exactly what provisioner.areas.monitoring.rolevars emits: cluster_vars under all.vars (plus
provision_state_dir), node_vars per host. Prints "changed" when OUT_FILE was (re)written,
"unchanged" otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from provisioner.areas.monitoring import decide, rolevars
from provisioner.inventory import groups
from provisioner.state import StateDir
from provisioner.validate import load_manifest

GROUPS = ("monitoring_server", "monitoring_node", "gpu", "slurm_controller")


def inventory(manifest_file: str, state_dir: Path) -> dict[str, Any]:
    loaded = load_manifest(manifest_file)
    m = loaded.manifest
    state = StateDir(state_dir)
    state.ensure()
    decide.prepare_secrets(loaded, state)
    g = groups(m)
    return {
        "all": {
            "vars": {"provision_state_dir": str(state_dir), **rolevars.cluster_vars(m)},
            "children": {
                name: {"hosts": {h: rolevars.node_vars(m, m.node(h)) or None for h in g[name]}} for name in GROUPS
            },
        }
    }


def main(argv: list[str]) -> int:
    manifest_file, state_dir, out_file = argv[1], Path(argv[2]), Path(argv[3])
    text = "# Written by molecule/monitoring/inventory_from_manifest.py\n" + yaml.safe_dump(
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
