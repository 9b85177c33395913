"""No role reconfigures every link of a node: `netplan apply` may bounce each interface,
the management link too, and with it the SSH connection of every node in the play. The
common role renders with `netplan generate` and reconfigures its own links with networkctl;
every other role must do the same."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from provisioner.platforms import PLATFORMS, os_vars_path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("tasks", "handlers", "vars", "defaults")
NETPLAN_APPLY = re.compile(r"\bnetplan\s+(--\S+\s+)*apply\b")


def values(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from values(v)
    elif isinstance(node, list):
        for v in node:
            yield from values(v)


def applies_netplan(node: Any) -> bool:
    """An argv list or a command text that runs `netplan apply`."""
    if isinstance(node, list) and all(isinstance(w, str) for w in node):
        words = [w for w in node if not w.startswith("-")]
        return any(a == "netplan" and b == "apply" for a, b in itertools.pairwise(words))
    return isinstance(node, str) and bool(NETPLAN_APPLY.search(node))


def role_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / "roles").glob(f"*/{folder}/*.yml"))


@pytest.mark.parametrize("example", [["netplan", "apply"], ["netplan", "--debug", "apply"], "netplan apply",
                                     "sh -c 'netplan  apply'"])
def test_the_check_sees_netplan_apply(example: Any) -> None:
    assert applies_netplan(example)
    assert not applies_netplan(["netplan", "generate"]) and not applies_netplan("netplan generate")


def test_no_role_runs_netplan_apply() -> None:
    found = [str(p.relative_to(ROOT)) for p in role_files()
             if any(applies_netplan(v) for v in values(yaml.safe_load(p.read_text())))]
    assert found == []


def test_ofed_reconfigures_only_its_ipoib_interface() -> None:
    handlers = yaml.safe_load((ROOT / "roles/ofed/handlers/main.yml").read_text())
    reconfigure = next(h for h in handlers if h["name"] == "Reconfigure the IPoIB interface only")
    assert reconfigure["ansible.builtin.command"]["argv"] == ["networkctl", "reconfigure",
                                                               "{{ ofed_ipoib.interface }}"]
    assert reconfigure["listen"] == "Apply the IPoIB configuration"
    for name in ("ubuntu-22.04", "ubuntu-24.04"):
        found = os_vars_path(ROOT / "roles/ofed/vars", PLATFORMS[name])
        assert found is not None, name
        ubuntu = yaml.safe_load(found.read_text())
        assert ubuntu["__ofed_ipoib_apply"] == [["netplan", "generate"], ["networkctl", "reload"]]
        assert ubuntu["__ofed_ipoib_reconfigure"] is True
        # DOCA's repository names the release as ubuntu22.04 (linux.mellanox.com/public/repo/doca/)
        facts = {"distribution_version": PLATFORMS[name].version}
        assert jinja2.Template(ubuntu["__ofed_doca_os"]).render(ansible_facts=facts) == name.replace("-", "")
