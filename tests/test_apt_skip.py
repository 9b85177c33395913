"""The roles skip apt where every package they name is already installed (the common role's
package facts): the rule each role writes, and what it decides, run by real Ansible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_role_bounds import ROLES, module_of, role_tasks

ROOT = Path(__file__).resolve().parents[1]
RULE = "| reject('in', ansible_facts.packages | default({})) | list"
# roles whose apt tasks name only pinned versions or repository tools (always run apt)
PINNED = {"nvidia_driver", "cuda", "nccl", "nvidia_container_toolkit", "docker", "grafana", "gpu_metrics",
          "containers"}
# a repository's tools (run only where the repository is added) and a vendor stack's packages
ALWAYS = ("Install python3-debian", "Install DOCA-OFED")


def _skips(task: dict[str, object]) -> bool:
    when = task.get("when")
    conditions = when if isinstance(when, list) else [when]
    return any(RULE in str(c) or "_missing" in str(c) for c in conditions if c)


def test_the_common_role_reads_the_installed_packages_before_and_after_its_base_install() -> None:
    """Before: the base install (and its refresh) skip where everything is installed; after,
    where it installed something: the later roles see it."""
    tasks = [(name, task) for name, task in role_tasks("common") if "packages.yml" in name]
    reads = [i for i, (_, task) in enumerate(tasks) if "dpkg_package_facts" in task]
    install = next(i for i, (name, _) in enumerate(tasks) if name.endswith("Install base packages"))
    refresh = next(i for i, (name, _) in enumerate(tasks) if "Refresh the apt cache" in name)
    assert len(reads) == 2 and reads[0] < refresh < install < reads[1], [name for name, _ in tasks]
    assert "__common_missing | length > 0" in str(tasks[install][1]["when"])
    assert "__common_missing | length > 0" in str(tasks[refresh][1]["when"])
    assert tasks[reads[1]][1]["when"] == "__common_missing | length > 0"


@pytest.mark.parametrize("role", sorted(set(ROLES) - PINNED - {"common"}))
def test_every_unpinned_package_install_skips_what_is_installed(role: str) -> None:
    installs = [(name, task) for name, task in role_tasks(role)
                if module_of(task) == "ansible.builtin.apt" and "name" in (task.get("ansible.builtin.apt") or {})]
    for name, task in installs:
        if name.split(": ", 1)[1].startswith(ALWAYS):
            continue
        assert _skips(task) or _imported_with_the_rule(role, name), name


def _imported_with_the_rule(role: str, name: str) -> bool:
    """The task's file is imported by a task that carries the rule (mergerfs' install.yml)."""
    file = name.split(":")[0].split("/")[-1]
    return any(task.get("ansible.builtin.import_tasks") == file and RULE in str(task.get("when"))
               for _, task in role_tasks(role))


HAS_DPKG = shutil.which("dpkg-query") is not None


@pytest.mark.skipif(not HAS_DPKG, reason="needs a Debian/Ubuntu host (dpkg-query)")
def test_real_ansible_names_only_what_is_missing_or_pinned(tmp_path: Path) -> None:
    """The common role's package facts on this machine, then the rule over an installed
    package, a missing one, a pinned one and an architecture-qualified one: only the
    installed bare name is skipped; without the facts nothing is."""
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "before", "ansible.builtin.set_fact": {"before": "{{ want " + RULE + " }}"}},
        {"dpkg_package_facts": {}},
        {"name": "after", "ansible.builtin.set_fact": {"after": "{{ want " + RULE + " }}"}},
        {"ansible.builtin.copy": {"dest": str(tmp_path / "out.json"),
                                  "content": "{{ {'before': before, 'after': after} | to_json }}", "mode": "0600"}},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    want = ["dpkg", "provision-no-such-package", "dpkg=0.0", "dpkg:amd64"]
    env = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        "-M", str(ROOT / "roles" / "common" / "library"),
                        "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps({"want": want}),
                        str(tmp_path / "play.yml")], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["before"] == want
    assert out["after"] == ["provision-no-such-package", "dpkg=0.0", "dpkg:amd64"]
