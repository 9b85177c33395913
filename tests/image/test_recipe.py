"""provisioner.image.recipe: what an image holds, its cache key and its mmdebstrap command line."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import typing
from pathlib import Path

import pytest
import yaml

from provisioner.image import recipe as rc
from provisioner.manifest.fields import OsName
from provisioner.platforms import PLATFORMS, os_vars_path

MIRROR = "http://127.0.0.1:3142/deb.debian.org/debian"
ROOT = Path(__file__).resolve().parents[2]


def test_debian_recipe_holds_kernel_ssh_python_bootloaders_and_nothing_site_specific() -> None:
    r = rc.recipe("debian-12", MIRROR + "/")
    assert (r.distro, r.suite, r.mirror) == ("debian", "bookworm", MIRROR)
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
    assert (r.suite, r.mirror) == ("noble", "http://archive.ubuntu.com/ubuntu")
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


ALL = {"debian": "main contrib non-free non-free-firmware", "ubuntu": "main restricted universe multiverse"}


@pytest.mark.parametrize(("os_name", "mirror", "expected"), [
    ("debian-12", MIRROR, [f"deb {MIRROR} bookworm {ALL['debian']}",
                           f"deb {MIRROR} bookworm-updates {ALL['debian']}",
                           f"deb {MIRROR}-security bookworm-security {ALL['debian']}"]),
    ("debian-12", None, [f"deb http://deb.debian.org/debian bookworm {ALL['debian']}",
                         f"deb http://deb.debian.org/debian bookworm-updates {ALL['debian']}",
                         f"deb http://deb.debian.org/debian-security bookworm-security {ALL['debian']}"]),
    ("ubuntu-22.04", "http://mirror.example.org/ubuntu/", [
        f"deb http://mirror.example.org/ubuntu {suite} {ALL['ubuntu']}"
        for suite in ("jammy", "jammy-updates", "jammy-backports", "jammy-security")]),
    ("ubuntu-24.04", None, [
        f"deb http://archive.ubuntu.com/ubuntu {suite} {ALL['ubuntu']}"
        for suite in ("noble", "noble-updates", "noble-backports", "noble-security")]),
])
def test_images_are_built_from_and_keep_every_pocket_and_component_of_their_os(
        os_name: str, mirror: str | None, expected: list[str]) -> None:
    # release-pocket-only images never got a kernel or security update, had no `restricted`
    # (Canonical's signed NVIDIA modules) and jumped to -updates at the first mirror change
    r = rc.recipe(os_name, mirror)
    assert list(r.sources) == expected
    assert rc.mmdebstrap_command(r, "x.tar.gz")[-len(expected):] == expected  # the chroot's sources.list


def common_role_vars(os_name: OsName) -> dict[str, object]:
    path = os_vars_path(ROOT / "roles" / "common" / "vars", PLATFORMS[os_name])
    assert path is not None, os_name
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(("os_name", "release"), [
    ("debian-12", "bookworm"), ("ubuntu-22.04", "jammy"), ("ubuntu-24.04", "noble"),
])
def test_image_sources_are_the_ones_the_common_role_writes_for_a_mirror(os_name: OsName, release: str) -> None:
    role = common_role_vars(os_name)
    facts = rc.OS_IMAGES[os_name]  # type: ignore[index]
    assert list(facts.components) == role["__common_apt_components"]
    suites = [str(s).replace("{{ ansible_facts.distribution_release }}", release) for s in role["__common_apt_suites"]]
    assert [facts.suite, *facts.pockets] == suites
    security = [str(s).replace("{{ ansible_facts.distribution_release }}", release)
                for s in role["__common_apt_security_suites"]]
    assert [facts.security_pocket] == security


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04"])
def test_ubuntu_images_carry_the_signed_boot_chain_and_their_archive_keyring(os_name: str) -> None:
    # unsigned GRUB alone: Secure Boot could never be turned on for an image-deployed node
    assert {"shim-signed", "grub-efi-amd64-signed", "ubuntu-keyring"} <= set(rc.recipe(os_name, None).packages)


def test_the_debian_image_keeps_its_package_set() -> None:
    # what the VM lab deploys: a change here changes the lab (docs/testing.md); the signed boot
    # chain as in Ubuntu's images (issue 26 item 9: unsigned GRUB alone, Secure Boot never)
    assert set(rc.recipe("debian-12", None).packages) == {
        "ca-certificates", "dbus", "e2fsprogs", "grub-efi-amd64-bin", "grub-efi-amd64-signed", "grub-pc-bin",
        "grub2-common", "initramfs-tools", "shim-signed",
        "iproute2", "kmod", "linux-image-amd64", "mdadm", "netbase", "openssh-server", "procps", "python3", "sudo",
        "systemd-resolved", "systemd-sysv", "udev"}


def test_jammy_images_get_a_merged_usr_like_every_other_jammy_install() -> None:
    hook = "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"
    assert hook in rc.mmdebstrap_command(rc.recipe("ubuntu-22.04", None), "x.tar.gz")
    # bookworm and noble have usr-is-merged in their essential set: merged without the hook,
    # and the Debian image's command line stays as it was
    for os_name in ("debian-12", "ubuntu-24.04"):
        assert not any(c.startswith("--hook-dir") for c in rc.mmdebstrap_command(rc.recipe(os_name, None), "x"))


def test_the_deploy_ramdisk_keeps_one_source() -> None:
    r = rc.ramdisk_recipe(MIRROR, None, "agent")
    assert r.sources == (f"deb {MIRROR} bookworm main",)


def test_cache_key_changes_with_every_input_and_only_with_them() -> None:
    base = rc.recipe("debian-12", MIRROR)
    assert base.key == rc.recipe("debian-12", MIRROR + "/").key  # same inputs, same key
    assert len(base.key) == 16 and base.file_name == f"debian-12-{base.key}.tar.zst"
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
    assert cmd[-5:] == ["bookworm", "/cache/out.tar.gz", *r.sources]
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


def run_hook(hook: str, root: Path, tmp_path: Path) -> None:
    """``hook`` as mmdebstrap runs it (the new root as $1), with a stand-in chroot that runs nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chroot").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "chroot").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PROVISION_FIRSTBOOT_UNIT": rc.FIRSTBOOT_UNIT}
    subprocess.run(["sh", "-c", hook, "sh", str(root)], check=True, env=env, capture_output=True)


def test_the_build_hosts_apt_options_and_proxy_stay_out_of_the_image(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("etc/apt/apt.conf.d", "etc/ssh", "etc/systemd/system", "var/lib/dbus", "var/cache/apt/archives",
              "var/lib/apt/lists"):
        (root / d).mkdir(parents=True)
    (root / "etc/apt/apt.conf.d/99mmdebstrap").write_text('Acquire::http::Proxy "http://build-host:3142";\n')
    (root / "etc/apt/apt.conf.d/70debconf").write_text("// the OS's own\n")
    run_hook(rc.CUSTOMIZE_HOOK, root, tmp_path)
    assert sorted(p.name for p in (root / "etc/apt/apt.conf.d").iterdir()) == ["70debconf"]
    assert (root / "etc/systemd/system/provision-firstboot.service").read_text() == rc.FIRSTBOOT_UNIT
    # the build itself still gets them, and apt there waits for the dpkg lock, boundedly
    cmd = rc.mmdebstrap_command(rc.recipe("debian-12", MIRROR, "http://build-host:3142"), "x.tar.gz")
    assert '--aptopt=Acquire::http::Proxy "http://build-host:3142"' in cmd
    assert f'--aptopt=DPkg::Lock::Timeout "{rc.LOCK_TIMEOUT}"' in cmd and 0 < rc.LOCK_TIMEOUT <= 600


def test_the_firstboot_unit_runs_once_before_ssh() -> None:
    unit = rc.FIRSTBOOT_UNIT
    assert "ConditionPathExists=!/var/lib/provision/firstboot.done" in unit
    assert "Before=ssh.service" in unit and "WantedBy=multi-user.target" in unit
