"""provisioner.areas.slurm.build: the pinned sources, the build recipe per OS release, the cache
key, the packages, the repository on the head and the pin."""

from __future__ import annotations

import re
from typing import Any

import pytest

from provisioner.areas.slurm import build
from provisioner.areas.slurm.build import SOURCES
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
        assert src.read_from and src.upstream.endswith("/")
        assert src.release in ("24.11", "25.05")


def test_the_default_is_schedmds_tarball_from_upstream_or_the_mirror(kit: Any) -> None:
    m = built(kit.load(kit.base()).manifest)
    src = build.source(m)
    assert src is not None and (src.version, src.packaging) == ("25.05.1", "schedmd")
    assert build.source_urls(m, src) == ("https://github.com/SchedMD/slurm/archive/slurm-25-05-1-1.tar.gz",)
    mirrored = built(m, mirror="file:///srv/mirror/slurm")
    assert build.source_urls(mirrored, src) == ("file:///srv/mirror/slurm/slurm-25-05-1-1.tar.gz",)


def test_debians_source_package_builds_the_same_way(kit: Any) -> None:
    src = SOURCES["24.11.5"]
    schedmd = build.build_commands(SOURCES["25.05.1"], "debian-12")
    debian = build.build_commands(src, "debian-12")
    assert debian[1] == ["dpkg-source", "-x", "slurm-wlm_24.11.5-4+deb13u1.dsc", "src"]
    assert schedmd[1][-1].startswith("mkdir src && tar -xf slurm-25-05-1-1.tar.gz --strip-components=1")
    # bookworm's dpkg-dev (1.21.23) is older than trixie's packaging asks: the bound is dropped there
    assert debian[2] == ["sed", "-i", r"s/dpkg-dev (>= 1\.22\.5)/dpkg-dev/", "src/debian/control"]
    assert len(build.build_commands(src, "ubuntu-24.04")) == len(schedmd) == 4
    assert debian[-2:] == schedmd[-2:]
    assert "mk-build-deps --install --remove" in debian[-2][-1]
    assert debian[-1][-1] == "cd src && dpkg-buildpackage -b -uc -us -j2"


@pytest.mark.parametrize("os_name", ["debian-12", "ubuntu-22.04", "ubuntu-24.04"])
def test_every_os_release_installs_each_options_library(os_name: str) -> None:
    packages = build.build_packages(os_name)
    assert len(packages) == len(set(packages))
    for option in build.BUILD_OPTIONS:
        assert set(build.BUILD_DEPS[os_name][option]) <= set(packages)
    assert {"libnvidia-ml-dev", "libpmix-dev", "libdbus-1-dev", "libjwt-dev", "libpam0g-dev"} <= set(packages)
    assert build.build_commands(SOURCES["25.05.1"], os_name)[0][-1].endswith(" ".join(packages))


def test_the_cache_key_follows_every_input() -> None:
    src = SOURCES["25.05.1"]
    keys = {build.cache_key(s, os_name) for s in SOURCES.values() for os_name in build.BUILD_DEPS}
    assert len(keys) == len(SOURCES) * len(build.BUILD_DEPS)
    assert build.cache_key(src, "debian-12") == build.cache_key(src, "debian-12")
    assert build.cache_dir(src, "debian-12") == f"debian-12-25.05.1-{build.cache_key(src, 'debian-12')}"


def test_packages_per_packaging() -> None:
    assert "slurm-smd-slurmd" in build.debs(SOURCES["25.05.1"])
    assert "slurm-smd-libpam-slurm-adopt" in build.debs(SOURCES["25.05.1"])
    assert {"slurmd", "slurmctld", "libpam-slurm-adopt"} <= set(build.debs(SOURCES["24.11.5"]))


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
    assert script.startswith("cd /build && sh -c ") and script.endswith("&& mkdir -p out && mv ./*.deb out/")
    assert "dpkg-buildpackage -b -uc -us -j1" in script
