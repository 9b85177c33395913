"""The OS releases and node roles are said once (provisioner/platforms.py): the literals the
manifest's schema and mypy read match the table, and every per-release table of an area,
every role's per-release vars files and the image recipes cover exactly its releases."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from provisioner import packages
from provisioner.areas.baremetal import media
from provisioner.areas.gpu import driver, tables
from provisioner.areas.monitoring import decide as monitoring
from provisioner.areas.slurm import build, releases
from provisioner.image import recipe
from provisioner.manifest import fields
from provisioner.platforms import NODE_ROLES, OS_NAMES, PLATFORMS, UBUNTU_RELEASES, OsName, Role, UbuntuName

ROOT = Path(__file__).resolve().parents[1]
VARS_FILES = {p.vars_file for p in PLATFORMS.values()}


def test_the_literals_are_the_table() -> None:
    assert set(get_args(OsName)) == set(PLATFORMS) == set(OS_NAMES)
    assert set(get_args(UbuntuName)) == {n for n, p in PLATFORMS.items() if p.family == "ubuntu"}
    assert get_args(UbuntuName) == UBUNTU_RELEASES
    assert get_args(Role) == NODE_ROLES
    # the manifest's schema and the GPU stack read the same names
    assert fields.OsName is OsName and fields.Role is Role and tables.OsName is OsName
    assert media.UBUNTU_RELEASES == UBUNTU_RELEASES


def test_each_platform_names_itself_as_ansible_does() -> None:
    assert PLATFORMS["ubuntu-22.04"].vars_file == "Ubuntu-22.yml"
    assert PLATFORMS["debian-12"].vars_file == "Debian-12.yml"
    assert packages.DISTRIBUTIONS["ubuntu-24.04"] == ("Ubuntu", "24", "24.04")
    for name, p in PLATFORMS.items():
        assert p.name == name


@pytest.mark.parametrize("table", [
    "recipe.OS_IMAGES", "packages.DISTRIBUTIONS", "monitoring.NODE_EXPORTER_VERSIONS", "build.BUILD_DEPS",
    "build.BUILD_COMPONENTS", "releases.SLURM_VERSION_BY_OS", "driver.KERNEL_ABI_RE", "driver.GA_KERNEL",
    "driver.DEFAULT_KERNEL_FLAVOUR", "tables.AUTO_SOURCES", "tables.CUDA_REPO_DIST", "tables.CUDA_REPO_VERSIONS",
    "tables.CUDA_DEFAULTS", "tables.NCCL_APT_BUILDS", "tables.DOCKER_REPO",
])
def test_every_per_release_table_covers_every_release(table: str) -> None:
    module, name = table.split(".")
    value = getattr({"recipe": recipe, "packages": packages, "monitoring": monitoring, "build": build,
                     "releases": releases, "driver": driver, "tables": tables}[module], name)
    assert set(value) == set(OS_NAMES), table


def test_the_image_recipes_take_family_and_suites_from_the_table() -> None:
    for name, image in recipe.OS_IMAGES.items():
        p = PLATFORMS[name]
        assert (image.distro, image.suite, image.security_pocket) == (p.family, p.codename, f"{p.codename}-security")
        assert all(pocket.startswith(f"{p.codename}-") for pocket in image.pockets)
    assert recipe.OS_IMAGES["ubuntu-22.04"].pockets == ("jammy-updates", "jammy-backports")


def test_every_role_with_per_release_vars_has_one_file_per_release() -> None:
    per_release = {"Debian", "Ubuntu"}
    for vars_dir in sorted(ROOT.glob("roles/*/vars")):
        files = {p.name for p in vars_dir.glob("*.yml") if p.name.split("-", 1)[0] in per_release}
        if files:
            assert files == VARS_FILES, vars_dir.parent.name
