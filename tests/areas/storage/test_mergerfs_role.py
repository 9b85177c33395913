"""roles/mergerfs never removes packages (issue 19 item 7): the distributions' mergerfs
depends on `fuse` (FUSE 2), which fuse3 Breaks. molecule/storage-mergerfs's side_effect shows the
refusal on a real apt; this holds every apt step of the role to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "mergerfs"


def tasks() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted((ROLE / "tasks").glob("*.yml")):
        out += yaml.safe_load(path.read_text()) or []
    return out


def test_every_apt_install_refuses_removals() -> None:
    installs = [t for t in tasks() if {"name", "deb"} & set(t.get("ansible.builtin.apt") or {})]
    assert len(installs) == 2  # the distribution's package, the release .deb
    assert all(t["ansible.builtin.apt"].get("fail_on_autoremove") is True for t in installs)


def test_a_simulation_names_removals_before_any_install() -> None:
    names = [t.get("name") for t in tasks()]
    simulate = names.index("Simulate the install")
    refuse = names.index("Refuse an install that would remove packages")
    first_install = min(i for i, t in enumerate(tasks()) if {"name", "deb"} & set(t.get("ansible.builtin.apt") or {}))
    assert simulate < refuse < first_install
    argv = tasks()[simulate]["ansible.builtin.command"]["argv"]
    assert "--simulate" in argv and "Remv " in tasks()[refuse]["vars"]["__mergerfs_removed"]


def test_os_vars_claim_the_versions_the_archives_ship() -> None:
    noble = (ROLE / "vars" / "Ubuntu.yml").read_text()  # jammy's and noble's
    assert "2.33.5" in noble and "mergerfs 2.40 in" not in noble
