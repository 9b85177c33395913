"""Every package the roles and the node images name for Ubuntu 22.04 (jammy) and 24.04
(noble) is in the table of vendor facts in docs/versions.md ("Ubuntu 22.04 and 24.04:
packages"), which says where each comes from and where that was read. Names built from
version tables (driver, CUDA, NCCL) are left to provisioner/areas/gpu/versions.yaml, whose
entries carry their own sources."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.image import recipe
from provisioner.platforms import PLATFORMS, OsName, os_vars_path

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `(?P<package>[^`]+)` \| (?P<jammy>yes|no[^|]*) \| (?P<noble>yes|no[^|]*) \| (?P<repo>[^|]+) \|"
                 r" (?P<source>[^|]+) \|$")


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for v in node:
            yield from strings(v)
    elif isinstance(node, dict):
        for k, v in node.items():
            if not str(k).endswith("_pin"):  # apt pin expressions, not names
                yield from strings(v)


def names(node: Any) -> set[str]:
    """Literal package names (a name built by Jinja is left out)."""
    return {s.split("=", 1)[0] for s in strings(node) if s and "{{" not in s and " " not in s}


def vars_packages(path: Path) -> set[str]:
    data = yaml.safe_load(path.read_text()) or {}
    return set().union(*(names(v) for k, v in data.items() if "packages" in k or k.endswith("_package")))


def tasks(node: Any) -> Iterator[dict[str, Any]]:
    for task in node or []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from tasks(task.get(key))


def role_packages(os_name: OsName) -> set[str]:
    """What the roles install on an OS: the vars file each role reads there, the roles' shared
    vars and defaults, and the literal names in apt tasks."""
    roles = ROOT / "roles"
    found: set[str] = set()
    shared = [*roles.glob("*/vars/main.yml"), *roles.glob("*/defaults/main.yml")]
    own = [os_vars_path(d, PLATFORMS[os_name]) for d in roles.glob("*/vars")]
    for path in [*(p for p in own if p is not None), *shared]:
        found |= vars_packages(path)
    for path in roles.glob("*/tasks/*.yml"):
        for task in tasks(yaml.safe_load(path.read_text())):
            apt = task.get("ansible.builtin.apt")
            if isinstance(apt, dict) and "name" in apt:
                found |= names(apt["name"])
    return found


def image_packages(os_name: str) -> set[str]:
    return set(recipe.recipe(os_name, None).packages)


def table() -> dict[str, dict[str, str]]:
    text = (ROOT / "docs" / "versions.md").read_text()
    return {m["package"]: m.groupdict() for line in text.splitlines() if (m := ROW.match(line))}


def test_the_collection_sees_the_roles_packages() -> None:
    jammy, noble = role_packages("ubuntu-22.04"), role_packages("ubuntu-24.04")
    assert {"slurmd", "nfs-common", "python3-debian", "opensm", "chrony"} <= jammy & noble
    assert "libpmix2" in jammy - noble and "libpmix2t64" in noble - jammy
    assert not any("{{" in p or " " in p for p in jammy | noble)


@pytest.mark.parametrize(("os_name", "column"), [("ubuntu-22.04", "jammy"), ("ubuntu-24.04", "noble")])
def test_every_package_named_for_ubuntu_is_a_recorded_vendor_fact(os_name: OsName, column: str) -> None:
    facts = table()
    wanted = role_packages(os_name) | image_packages(os_name)
    missing = sorted(p for p in wanted if p not in facts)
    assert missing == [], f"not in docs/versions.md: {missing}"
    absent = sorted(p for p in wanted if facts[p][column] != "yes")
    assert absent == [], f"named for {os_name} but recorded as not there: {absent}"
    assert all(facts[p]["source"].strip() for p in wanted)


def test_the_table_agrees_with_the_image_recipe_on_systemd_resolved() -> None:
    row = table()["systemd-resolved"]
    assert row["jammy"].startswith("no") and row["noble"] == "yes"
    assert "systemd-resolved" not in image_packages("ubuntu-22.04")
