"""The operating systems a node may run and the roles a node may have: each said once, here.

One row per OS release (``PLATFORMS``): its family, version and codename, and the names
Ansible gives it (``ansible_facts.distribution`` and its major version, which name the roles'
OS variables: ``vars/<Distribution>-<major>.yml`` where the release differs from its family,
else ``vars/<Distribution>.yml``). Everything else that names a release reads this
table: the manifest's ``os:`` field, the CLI's ``--os`` choices, the image recipes, the
Ubuntu installer media, the packages table. A row also says what the release's archive ships
that the areas decide on (its GA kernel series, its Slurm, its node_exporter); what follows
from the family alone (a kernel's flavour, NVIDIA's and Docker's repository names) the areas
derive from the row. Tables that stay per release in an area (the image recipes, NVIDIA's
CUDA and NCCL builds) are keyed by these names; ``tests/test_platforms.py`` holds every such
table to this one.

A new release of a known family: a row here, the ``OsName`` literal below (mypy and
pydantic read literals, not tables; a test holds the two equal), its image recipe and
NVIDIA's builds for it (the tables the test names), and a release file in the roles whose
facts differ between the family's releases.
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
    kernel: str  # the release's GA kernel series: "5.15" (Ubuntu's HWE kernels are newer)
    slurm: str  # the Slurm major release its archive ships (slurm-wlm): "21.08"
    node_exporter: tuple[int, int, int]  # the node_exporter its archive ships (prometheus-node-exporter)

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


# sources: Ubuntu's releases https://wiki.ubuntu.com/Releases (22.04 jammy, 24.04 noble; GA
# kernels 5.15 and 6.8); Debian's https://www.debian.org/releases/ (12 bookworm, kernel 6.1).
# Slurm and node_exporter: the archives' slurm-wlm and prometheus-node-exporter
# (packages.ubuntu.com/{jammy,noble}/..., Debian 12's apt-cache policy; docs/versions.md).
PLATFORMS: dict[OsName, Platform] = {
    "ubuntu-22.04": Platform("ubuntu", "22.04", "jammy", kernel="5.15", slurm="21.08", node_exporter=(1, 3, 1)),
    "ubuntu-24.04": Platform("ubuntu", "24.04", "noble", kernel="6.8", slurm="23.11", node_exporter=(1, 7, 0)),
    "debian-12": Platform("debian", "12", "bookworm", kernel="6.1", slurm="22.05", node_exporter=(1, 5, 0)),
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
