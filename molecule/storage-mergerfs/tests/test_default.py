"""MergerFS union mounted in the container: placement policy, options, ordering."""


import pytest

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
testinfra_hosts = ["ansible://mergerfs-node"]

UNION = "corpus.mount"
BRANCHES = ("srv-branch1.mount", "srv-branch2.mount")


def _show(host, unit, prop):
    return host.check_output(f"systemctl show -P {prop} {unit}")


def _xattr(host, name):
    return host.check_output(
        "python3 -c \"import os; print(os.getxattr('/corpus/.mergerfs', "
        f"'user.mergerfs.{name}').decode())\""
    )


def test_package(host):
    assert host.package("mergerfs").is_installed


def test_refused_install_left_the_packages_alone(host):
    """side_effect.yml: the role refused an install that would remove fuse."""
    assert host.package("fuse").is_installed  # mergerfs's FUSE 2, still there
    assert not host.package("fuse3").is_installed
    assert host.run("apt-get check -q").rc == 0  # nothing half-installed


def test_union_mounted(host):
    assert host.service(UNION).is_running
    assert host.service(UNION).is_enabled
    mount = host.mount_point("/corpus")
    assert mount.exists
    assert mount.filesystem == "fuse.mergerfs"


def test_branches_mounted_first(host):
    for unit in BRANCHES:
        assert host.service(unit).is_running
    requires = _show(host, UNION, "Requires").split()
    after = _show(host, UNION, "After").split()
    for unit in BRANCHES:
        assert unit in requires
        assert unit in after
    # _netdev: a network mount, ordered after the network and before remote-fs.target
    assert "remote-fs.target" in _show(host, UNION, "WantedBy").split()


def test_runtime_policy_and_minfreespace(host):
    assert _xattr(host, "category.create") == "mfs"
    assert _xattr(host, "minfreespace") == str(4 * 1024 * 1024)
    srcmounts = _xattr(host, "srcmounts")
    assert srcmounts == "/srv/branch1:/srv/branch2"


def test_new_file_lands_on_branch_with_most_free_space(host):
    host.check_output("echo data > /corpus/top.txt")
    try:
        assert host.file("/srv/branch2/top.txt").content_string == "data\n"
        assert not host.file("/srv/branch1/top.txt").exists
    finally:
        host.run("rm -f /corpus/top.txt")


def test_mfs_ignores_existing_parent_directories(host):
    # the parent exists on branch1 only: epmfs would write there, mfs must not
    host.check_output("mkdir -p /srv/branch1/only1")
    try:
        host.check_output("echo x > /corpus/only1/f.txt")
        assert host.file("/srv/branch2/only1/f.txt").exists
        assert not host.file("/srv/branch1/only1/f.txt").exists
    finally:
        host.run("rm -rf /corpus/only1")


def test_stale_union_removed(host):
    assert not host.file("/etc/systemd/system/old-union.mount").exists
    assert _show(host, "old-union.mount", "LoadState") == "not-found"


@pytest.mark.parametrize("branch", BRANCHES)
def test_union_never_outlives_a_branch(host, branch):
    host.check_output(f"systemctl stop {branch}")
    try:
        assert not host.service(UNION).is_running
    finally:
        host.check_output(f"systemctl start {UNION}")
    assert host.service(branch).is_running
    assert host.service(UNION).is_running
