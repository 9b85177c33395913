"""The operating systems a node may run and the roles a node may have: each said once, here.

One row per OS release (``PLATFORMS``): its family, version and codename, and the names
Ansible gives it (``ansible_facts.distribution`` and its major version, which name the roles'
OS variables: ``vars/<Distribution>-<major>.yml`` where the release differs from its family,
else ``vars/<Distribution>.yml``). Everything else that names a release reads this
table: the manifest's ``os:`` field, the CLI's ``--os`` choices, the image recipes, the
Ubuntu installer media, the packages table. Per-release facts that belong to one area (the
Slurm release Ubuntu ships, a kernel's flavour, node_exporter's version) stay in that area,
keyed by these names; ``tests/test_platforms.py`` holds every such table to this one.

A new release of a known family: a row here, the ``OsName`` literal below (mypy and
pydantic read literals, not tables; a test holds the two equal), the area tables the test
names, and a release file in the roles whose facts differ between the family's releases.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

OsName = Literal["ubuntu-22.04", "ubuntu-24.04", "debian-12"]
UbuntuName = Literal["ubuntu-22.04", "ubuntu-24.04"]
Family = Literal["ubuntu", "debian"]
Role = Literal["head", "compute", "storage", "services", "login"]

# the roles a node may have, in the manifest's order; each is an inventory group too
NODE_ROLES: tuple[Role, ...] = get_args(Role)


@dataclass(frozen=True)
class Platform:
    family: Family
    version: str  # "22.04", "12"
    codename: str  # the archive's suite: "jammy", "bookworm"

    @property
    def name(self) -> str:
        """The manifest's name of the release: "ubuntu-22.04"."""
        return f"{self.family}-{self.version}"

    @property
    def distribution(self) -> str:
        """ansible_facts.distribution: "Ubuntu", "Debian"."""
        return self.family.capitalize()

    @property
    def major(self) -> str:
        """ansible_facts.distribution_major_version: "22" for 22.04."""
        return self.version.split(".", 1)[0]

    @property
    def vars_files(self) -> tuple[str, str]:
        """Where a role's OS variables are, in the order its include_vars looks (first_found):
        the release's own file, ``Ubuntu-22.yml``, else the family's, ``Ubuntu.yml``."""
        return f"{self.distribution}-{self.major}.yml", f"{self.distribution}.yml"


# sources: Ubuntu's releases https://wiki.ubuntu.com/Releases (22.04 jammy, 24.04 noble);
# Debian's https://www.debian.org/releases/ (12 bookworm)
PLATFORMS: dict[OsName, Platform] = {
    "ubuntu-22.04": Platform("ubuntu", "22.04", "jammy"),
    "ubuntu-24.04": Platform("ubuntu", "24.04", "noble"),
    "debian-12": Platform("debian", "12", "bookworm"),
}
OS_NAMES: tuple[OsName, ...] = tuple(PLATFORMS)
UBUNTU_RELEASES: tuple[UbuntuName, ...] = get_args(UbuntuName)


def platform(name: str) -> Platform:
    """The row of the release named ``name`` (a name from outside the manifest's schema: a
    command's argument, a cache file); KeyError naming the known ones when there is none."""
    found = next((p for os_name, p in PLATFORMS.items() if os_name == name), None)
    if found is None:
        raise KeyError(f"no OS release {name!r}; known: {', '.join(OS_NAMES)}")
    return found


def os_vars_path(vars_dir: Path, platform: Platform) -> Path | None:
    """The file of ``vars_dir`` a role reads its OS variables from on ``platform``, as its
    include_vars finds it; None when the role has none for that release."""
    for name in platform.vars_files:
        if (vars_dir / name).is_file():
            return vars_dir / name
    return None
