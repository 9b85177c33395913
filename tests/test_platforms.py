"""The OS releases and node roles are said once (provisioner/platforms.py): the literals the
manifest's schema and mypy read match the table, and every per-release table of an area,
every role's OS vars files (a family's, or a release's own) and the image recipes cover
exactly its releases."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from provisioner.areas.baremetal import media
from provisioner.areas.gpu import driver, tables
from provisioner.areas.monitoring import decide as monitoring
from provisioner.areas.slurm import build, releases
from provisioner.image import recipe
from provisioner.manifest import fields
from provisioner.platforms import (
    NODE_ROLES,
    OS_NAMES,
    PLATFORMS,
    UBUNTU_RELEASES,
    OsName,
    Role,
    UbuntuName,
    os_vars_path,
    platform,
)

ROOT = Path(__file__).resolve().parents[1]
RELEASE_FILES = {p.vars_files[0] for p in PLATFORMS.values()}
FAMILY_FILES = {p.vars_files[1] for p in PLATFORMS.values()}


def test_the_literals_are_the_table() -> None:
    assert set(get_args(OsName)) == set(PLATFORMS) == set(OS_NAMES)
    assert set(get_args(UbuntuName)) == {n for n, p in PLATFORMS.items() if p.family == "ubuntu"}
    assert get_args(UbuntuName) == UBUNTU_RELEASES
    assert get_args(Role) == NODE_ROLES
    # the manifest's schema and the GPU stack read the same names
    assert fields.OsName is OsName and fields.Role is Role and tables.OsName is OsName
    assert media.UBUNTU_RELEASES == UBUNTU_RELEASES


def test_each_platform_names_itself_as_ansible_does() -> None:
    assert PLATFORMS["ubuntu-22.04"].vars_files == ("Ubuntu-22.yml", "Ubuntu.yml")
    assert PLATFORMS["debian-12"].vars_files == ("Debian-12.yml", "Debian.yml")
    noble = platform("ubuntu-24.04")
    assert (noble.distribution, noble.major, noble.version) == ("Ubuntu", "24", "24.04")
    for name, p in PLATFORMS.items():
        assert p.name == name and platform(name) is p
    known = "known: ubuntu-22.04, ubuntu-24.04, debian-12"
    with pytest.raises(KeyError, match=re.escape(f"no OS release 'ubuntu-20.04'; {known}")):
        platform("ubuntu-20.04")


@pytest.mark.parametrize("table", [
    "recipe.OS_IMAGES", "tables.CUDA_REPO_VERSIONS", "tables.CUDA_DEFAULTS", "tables.NCCL_APT_BUILDS",
])
def test_every_per_release_table_covers_every_release(table: str) -> None:
    module, name = table.split(".")
    value = getattr({"recipe": recipe, "monitoring": monitoring, "build": build,
                     "releases": releases, "driver": driver, "tables": tables}[module], name)
    assert set(value) == set(OS_NAMES), table


def test_what_the_areas_derive_from_a_row_is_what_the_vendors_name() -> None:
    """The areas' per-release facts come from the platform table: the archives' own (GA
    kernel, Slurm, node_exporter) as the rows say, the rest from the family and version."""
    assert releases.SLURM_VERSION_BY_OS == {"ubuntu-22.04": "21.08", "ubuntu-24.04": "23.11", "debian-12": "22.05"}
    assert monitoring.NODE_EXPORTER_VERSIONS == {"ubuntu-22.04": (1, 3, 1), "ubuntu-24.04": (1, 7, 0),
                                                 "debian-12": (1, 5, 0)}
    assert driver.GA_KERNEL == {"ubuntu-22.04": "5.15", "ubuntu-24.04": "6.8", "debian-12": "6.1"}
    assert driver.DEFAULT_KERNEL_FLAVOUR == {"ubuntu-22.04": "generic", "ubuntu-24.04": "generic",
                                             "debian-12": "amd64"}
    assert driver.kernel_flavour("ubuntu-22.04", "6.8.0-50-generic") == "generic-hwe-22.04"
    assert driver.kernel_flavour("debian-12", "6.12.12+bpo-cloud-amd64") == "cloud-amd64"
    # developer.download.nvidia.com/compute/cuda/repos/<dist>/x86_64/
    assert tables.CUDA_REPO_DIST == {"ubuntu-22.04": "ubuntu2204", "ubuntu-24.04": "ubuntu2404",
                                     "debian-12": "debian12"}
    assert tables.DOCKER_REPO == {"ubuntu-22.04": ("https://download.docker.com/linux/ubuntu", "jammy"),
                                  "ubuntu-24.04": ("https://download.docker.com/linux/ubuntu", "noble"),
                                  "debian-12": ("https://download.docker.com/linux/debian", "bookworm")}
    assert tables.AUTO_SOURCES["ubuntu-24.04"] == {"driver": "ubuntu-signed", "cuda": "cuda-repo", "nccl": "apt",
                                                   "docker": "docker-ce"}
    assert tables.AUTO_SOURCES["debian-12"] == {"driver": "debian", "cuda": "debian", "nccl": "pypi",
                                                "docker": "distro"}
    assert build.BUILD_COMPONENTS["ubuntu-22.04"] == ("main", "universe", "multiverse")
    assert build.BUILD_COMPONENTS["debian-12"] == ("main", "contrib", "non-free")
    assert set(build.BUILD_DEPS) == set(OS_NAMES)


def test_the_image_recipes_take_family_and_suites_from_the_table() -> None:
    for name, image in recipe.OS_IMAGES.items():
        p = PLATFORMS[name]
        assert (image.distro, image.suite, image.security_pocket) == (p.family, p.codename, f"{p.codename}-security")
        assert all(pocket.startswith(f"{p.codename}-") for pocket in image.pockets)
    assert recipe.OS_IMAGES["ubuntu-22.04"].pockets == ("jammy-updates", "jammy-backports")


def _body(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def test_every_role_with_os_vars_has_them_for_every_release_and_no_stray_file() -> None:
    """A role's OS variables are its family's file, or a release's own where that release
    differs (include_vars' first_found): every release finds one, no file names an unknown
    release or family, and a release file that says what its family's says is redundant."""
    for vars_dir in sorted(ROOT.glob("roles/*/vars")):
        files = {p.name for p in vars_dir.glob("*.yml")} - {"main.yml"}
        if not files:
            continue
        role = vars_dir.parent.name
        assert files <= RELEASE_FILES | FAMILY_FILES, (role, sorted(files - RELEASE_FILES - FAMILY_FILES))
        for name, row in PLATFORMS.items():
            found = os_vars_path(vars_dir, row)
            assert found is not None, f"{role}: no OS variables for {name}"
            release, family = (vars_dir / f for f in row.vars_files)
            if release.is_file() and family.is_file():
                assert _body(release) != _body(family), f"{role}: {release.name} repeats {family.name}"


def test_a_family_file_stands_for_releases_that_say_the_same() -> None:
    """Two releases of a family with the same variables share the family's file."""
    for vars_dir in sorted(ROOT.glob("roles/*/vars")):
        for family in FAMILY_FILES:
            own = [vars_dir / p.vars_files[0] for p in PLATFORMS.values() if p.vars_files[1] == family]
            bodies = [_body(f) for f in own if f.is_file()]
            assert len(bodies) < 2 or len({tuple(b) for b in bodies}) == len(bodies), (vars_dir.parent.name, family)


def test_os_vars_path_follows_include_vars_order(tmp_path: Path) -> None:
    jammy, noble = PLATFORMS["ubuntu-22.04"], PLATFORMS["ubuntu-24.04"]
    assert os_vars_path(tmp_path, jammy) is None
    (tmp_path / "Ubuntu.yml").write_text("a: 1\n")
    assert os_vars_path(tmp_path, jammy) == tmp_path / "Ubuntu.yml"
    (tmp_path / "Ubuntu-22.yml").write_text("a: 2\n")
    assert os_vars_path(tmp_path, jammy) == tmp_path / "Ubuntu-22.yml"
    assert os_vars_path(tmp_path, noble) == tmp_path / "Ubuntu.yml"
    assert os_vars_path(tmp_path, PLATFORMS["debian-12"]) is None
