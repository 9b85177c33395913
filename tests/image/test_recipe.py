"""provisioner.image.recipe: what an image holds, its cache key and its mmdebstrap command line."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import typing

import pytest

from provisioner.image import recipe as rc
from provisioner.manifest.model import OsName

MIRROR = "http://127.0.0.1:3142/deb.debian.org/debian"


def test_debian_recipe_holds_kernel_ssh_python_bootloaders_and_nothing_site_specific() -> None:
    r = rc.recipe("debian-12", MIRROR + "/")
    assert (r.distro, r.suite, r.mirror, r.components) == ("debian", "bookworm", MIRROR, ("main",))
    for package in ("linux-image-amd64", "openssh-server", "python3", "grub-pc-bin", "grub-efi-amd64-bin", "mdadm"):
        assert package in r.packages
    # what a Debian/Ubuntu install has and the apt variant lacks: NFS mounts need /etc/protocols
    # (found by the VM lab: mount.nfs "Failed to find 'tcp' protocol" on a deployed node)
    for recipe in (r, rc.recipe("ubuntu-22.04", None), rc.recipe("ubuntu-24.04", None)):
        assert {"netbase", "procps"} <= set(recipe.packages), recipe.os
    assert "netplan.io" not in r.packages
    assert "provision-firstboot.service" in r.customize_hook
    assert 'rm -f "$r"/etc/ssh/ssh_host_*' in r.customize_hook  # every node gets its own host keys
    assert ': > "$r"/etc/machine-id' in r.customize_hook  # and its own machine id


def test_ubuntu_recipes_use_their_suite_kernel_and_netplan() -> None:
    r = rc.recipe("ubuntu-24.04", None)
    assert (r.suite, r.mirror, r.components) == ("noble", "http://archive.ubuntu.com/ubuntu", ("main", "universe"))
    assert "linux-image-generic" in r.packages and "netplan.io" in r.packages
    assert rc.recipe("ubuntu-22.04", None).suite == "jammy"
    with pytest.raises(rc.ImageRecipeError, match="no image recipe for 'rhel-9'"):
        rc.recipe("rhel-9", None)


def test_every_os_of_the_manifest_has_an_image_recipe_and_no_other() -> None:
    assert set(rc.OS_IMAGES) == set(typing.get_args(OsName))


def test_systemd_resolved_is_asked_for_only_where_it_is_a_package_of_its_own() -> None:
    # jammy's systemd 249 carries resolved itself (no package systemd-resolved exists there:
    # every 22.04 build failed); noble's systemd 255 and bookworm's 252 split it out
    assert "systemd-resolved" not in rc.recipe("ubuntu-22.04", None).packages
    assert "systemd-resolved" in rc.recipe("ubuntu-24.04", None).packages
    assert "systemd-resolved" in rc.recipe("debian-12", None).packages
    # the image enables and links it either way (the unit ships with systemd on jammy)
    assert "systemd-resolved.service" in rc.CUSTOMIZE_HOOK


def test_cache_key_changes_with_every_input_and_only_with_them() -> None:
    base = rc.recipe("debian-12", MIRROR)
    assert base.key == rc.recipe("debian-12", MIRROR + "/").key  # same inputs, same key
    assert len(base.key) == 16 and base.file_name == f"debian-12-{base.key}.tar.gz"
    changed = [
        rc.recipe("debian-12", "http://mirror.example.org/debian"),
        rc.recipe("debian-12", MIRROR, "http://proxy.example.org:3128"),
        rc.recipe("ubuntu-24.04", MIRROR),
        dataclasses.replace(base, packages=(*base.packages, "vim")),
        dataclasses.replace(base, firstboot_unit=base.firstboot_unit + "# x\n"),
        dataclasses.replace(base, customize_hook=base.customize_hook + "; true"),
        dataclasses.replace(base, version=base.version + 1),
        rc.recipe("debian-12", MIRROR, None, ("prometheus-node-exporter",)),
    ]
    keys = {r.key for r in changed}
    assert len(keys) == len(changed) and base.key not in keys


def test_extra_packages_join_the_image_and_none_keep_its_key() -> None:
    base = rc.recipe("debian-12", MIRROR)
    assert rc.recipe("debian-12", MIRROR, None, ()).key == base.key  # unmonitored clusters: same image
    r = rc.recipe("debian-12", MIRROR, None, ("prometheus-node-exporter", "jq", "python3"))
    assert set(r.packages) == {*base.packages, "prometheus-node-exporter", "jq"}  # once each
    assert list(r.packages) == sorted(r.packages)
    assert f"--include={','.join(r.packages)}" in rc.mmdebstrap_command(r, "x.tar.gz")


def test_command_line_builds_a_compressed_tarball_from_the_mirror() -> None:
    r = rc.recipe("debian-12", MIRROR, "http://proxy.example.org:3128")
    cmd = rc.mmdebstrap_command(r, "/cache/out.tar.gz")
    assert cmd[:4] == ["mmdebstrap", "--mode=root", "--variant=apt", "--format=tar"]
    assert cmd[-3:] == ["bookworm", "/cache/out.tar.gz", f"deb {MIRROR} bookworm main"]
    assert f"--include={','.join(r.packages)}" in cmd
    assert '--aptopt=Acquire::http::Proxy "http://proxy.example.org:3128"' in cmd
    assert '--aptopt=Acquire::http::Timeout "60"' in cmd  # no apt step waits forever
    assert '--aptopt=Acquire::Retries::Delay "false"' in cmd  # no stuck queue after a retry (LP: #2003851)
    assert f"--customize-hook={r.customize_hook}" in cmd
    assert not any("Proxy" in c for c in rc.mmdebstrap_command(rc.recipe("debian-12", MIRROR), "x.tar.gz"))
    assert rc.build_environment(r)["PROVISION_FIRSTBOOT_UNIT"] == r.firstboot_unit


def test_the_customize_hook_is_valid_shell() -> None:
    subprocess.run(["sh", "-n", "-c", rc.CUSTOMIZE_HOOK], check=True)
    assert shlex.split(rc.CUSTOMIZE_HOOK)  # quotes balance


def test_the_firstboot_unit_runs_once_before_ssh() -> None:
    unit = rc.FIRSTBOOT_UNIT
    assert "ConditionPathExists=!/var/lib/provision/firstboot.done" in unit
    assert "Before=ssh.service" in unit and "WantedBy=multi-user.target" in unit
