"""provisioner.areas.slurm.build: the pinned sources, the build recipe per OS release, the cache
key, the packages, the repository on the head and the pin."""

from __future__ import annotations

import re
from typing import Any

import pytest

from provisioner.areas.slurm import build
from provisioner.areas.slurm.build import SOURCES
from provisioner.image.recipe import OS_IMAGES
from provisioner.manifest import Manifest


def built(m: Manifest, **settings: Any) -> Manifest:
    slurm = m.slurm.model_copy(update={"source": "build", **settings})
    return m.model_copy(update={"slurm": slurm})


def test_the_os_source_changes_nothing(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert build.source(m) is None and build.built_release(m) is None
    assert build.problems(m) == []


def test_every_pinned_source_names_its_file_checksum_and_origin() -> None:
    assert build.DEFAULT_VERSION in SOURCES
    for version, src in SOURCES.items():
        assert src.version == version and re.fullmatch(r"[0-9a-f]{64}", src.sha256)
        assert src.file == f"slurm-{version.replace('.', '-')}-1.tar.gz"  # SchedMD's tag archive name
        assert src.read_from and src.upstream == "https://github.com/SchedMD/slurm/archive/"
        assert src.release in ("24.11", "25.05")


def test_the_default_is_the_tarball_from_upstream_or_the_mirror(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["source"] = "build"
    m = kit.load(data).manifest
    src = build.source(m)
    assert src is not None and src.version == "25.05.1"
    assert build.source_url(m, src) == "https://github.com/SchedMD/slurm/archive/slurm-25-05-1-1.tar.gz"
    mirrored = built(m, mirror="file:///srv/mirror/slurm")
    assert build.source_url(mirrored, src) == "file:///srv/mirror/slurm/slurm-25-05-1-1.tar.gz"


def test_schedmds_packaging_builds_it(kit: Any) -> None:
    cmds = [c[-1] for c in build.build_commands(SOURCES["24.11.5"], "debian-12")]
    assert cmds[0].endswith("install -y --no-install-recommends " + " ".join(build.build_packages("debian-12")))
    assert cmds[1] == "mkdir src && tar -xf slurm-24-11-5-1.tar.gz --strip-components=1 -C src"
    assert cmds[2].startswith("cd src && mk-build-deps --install --remove --tool 'apt-get -o DPkg::Lock::Timeout=60")
    assert cmds[3] == "cd src && dpkg-buildpackage -b -uc -us -j2"


@pytest.mark.parametrize("os_name", ["debian-12", "ubuntu-22.04", "ubuntu-24.04"])
def test_every_os_release_installs_each_options_library(os_name: str) -> None:
    packages = build.build_packages(os_name)
    assert len(packages) == len(set(packages))
    for option in build.BUILD_OPTIONS:
        assert set(build.BUILD_DEPS[os_name][option]) <= set(packages)
    assert {"libnvidia-ml-dev", "libpmix-dev", "libdbus-1-dev", "libjwt-dev", "libpam0g-dev"} <= set(packages)
    assert build.build_commands(SOURCES["25.05.1"], os_name)[0][-1].endswith(" ".join(packages))
    assert set(build.BUILD_COMPONENTS[os_name]) <= set(OS_IMAGES[os_name].components)  # type: ignore[index]


def test_the_cache_key_follows_every_input() -> None:
    src = SOURCES["25.05.1"]
    keys = {build.cache_key(s, os_name) for s in SOURCES.values() for os_name in build.BUILD_DEPS}
    assert len(keys) == len(SOURCES) * len(build.BUILD_DEPS)
    assert build.cache_key(src, "debian-12") == build.cache_key(src, "debian-12")
    assert build.cache_dir(src, "debian-12") == f"debian-12-25.05.1-{build.cache_key(src, 'debian-12')}"


def test_the_packages_every_build_leaves() -> None:
    assert {"slurm-smd-slurmd", "slurm-smd-slurmctld", "slurm-smd-libpam-slurm-adopt"} <= set(build.debs())


def test_build_settings_are_checked_at_their_line(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["version"] = "25.05.1"  # with source: os
    text = kit.dump(data)
    diag = kit.error(text, "applies only with slurm.source: build")
    assert (diag.path, diag.line) == ("slurm.version", kit.line_of(text, "version: 25.05.1"))
    data["slurm"].update(source="build", version="23.11.4")
    diag = kit.error(data, "has no pinned source")
    assert diag.path == "slurm.version" and "known: 24.11.5, 24.11.6, 25.05.1" in diag.message
    data["slurm"].update(version="24.11.6", mirror="file:///srv/mirror")
    assert kit.load(data).manifest.slurm.mirror == "file:///srv/mirror"
    data["slurm"].update(version="25.5", mirror="ftp://x")
    messages = [d.message for d in kit.errors(data)]
    assert any("does not match" in msg or "pattern" in msg for msg in messages)
    assert any("'ftp://x' is not an http(s):// or file:// URL" in msg for msg in messages)


def test_a_build_that_left_an_option_out_is_found() -> None:
    complete = ["./usr/lib/x86_64-linux-gnu/slurm/gpu_nvml.so", "./usr/lib/x86_64-linux-gnu/slurm/mpi_pmix_v5.so",
                "./usr/lib/x86_64-linux-gnu/slurm/cgroup_v2.so", "./usr/sbin/slurmrestd",
                "./usr/lib/x86_64-linux-gnu/security/pam_slurm_adopt.so",
                "./usr/lib/x86_64-linux-gnu/slurm/accounting_storage_mysql.so"]
    assert build.missing_options(complete) == []
    assert build.missing_options(complete[1:]) == ["nvml"]  # no libnvidia-ml-dev in the chroot
    assert build.missing_options([]) == list(build.PROOF_FILES)


def test_one_job_per_os_release_in_a_throwaway_chroot(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12")
    data["nodes"][0]["os"] = "ubuntu-24.04"
    data["slurm"]["source"] = "build"
    m = kit.load(data).manifest
    found = build.jobs(m)
    assert [j.os for j in found] == ["debian-12", "ubuntu-24.04"] and build.jobs(m, "ubuntu-22.04") == []
    argv = found[1].mmdebstrap("/w/src", "/w/out", mirror="http://mirror.example/ubuntu/")
    assert argv[:4] == ["mmdebstrap", "--mode=root", "--variant=apt", "--format=null"]
    assert "--customize-hook=sync-in /w/src /build" in argv and "--customize-hook=sync-out /build/out /w/out" in argv
    at = argv.index("noble")
    assert argv[at + 1] == "/dev/null" and argv[at + 2].startswith("deb http://mirror.example/ubuntu noble ")
    assert "--keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg" in argv
    script = build.chroot_script(found[0].source, "debian-12", jobs=1)
    assert script.startswith("cd /build && export DEBIAN_FRONTEND=noninteractive && sh -c ")
    assert script.endswith("&& mkdir -p out && mv ./*.deb out/")
    assert "dpkg-buildpackage -b -uc -us -j1" in script
