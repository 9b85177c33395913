"""Scratch role in a container: its tools and the mount point, nothing kernel-bound (see molecule.yml)."""

import pytest

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
testinfra_hosts = ["ansible://scratch-gpu"]


@pytest.mark.parametrize("pkg", ["parted", "xfsprogs", "mdadm"])
def test_tools_installed(host, pkg):
    assert host.package(pkg).is_installed


def test_mount_point_is_a_shared_sticky_folder(host):
    point = host.file("/scratch")
    assert point.is_directory
    assert point.user == "root" and point.group == "root"
    assert point.mode == 0o1777


def test_nothing_was_pretended(host):
    # no kernel, no disks: no array, no fstab entry, no mount
    assert not host.file("/dev/md/scratch").exists
    assert "/scratch" not in host.file("/etc/fstab").content_string
    assert not host.mount_point("/scratch").exists
    conf = host.file("/etc/mdadm/mdadm.conf")
    assert not conf.exists or "name=any:scratch" not in conf.content_string
