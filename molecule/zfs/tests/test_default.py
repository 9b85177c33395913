"""ZFS role in a container: real files and units, no kernel module (see molecule.yml)."""

import pytest

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
testinfra_hosts = ["ansible://zfs-store"]


@pytest.mark.parametrize("pkg", ["zfsutils-linux", "zfs-zed"])
def test_userspace_installed(host, pkg):
    assert host.package(pkg).is_installed


def test_zpool_binary(host):
    assert host.file("/usr/sbin/zpool").is_file
    assert host.file("/usr/sbin/zpool").mode & 0o111


def test_arc_max_option(host):
    conf = host.file("/etc/modprobe.d/zfs.conf")
    assert conf.mode == 0o644 and conf.user == "root"
    lines = [ln for ln in conf.content_string.splitlines() if not ln.startswith("#")]
    assert lines == ["options zfs zfs_arc_max=2147483648"]
    # modprobe itself parses the file as the option of the zfs module
    out = host.check_output("modprobe --showconfig | grep '^options zfs '")
    assert "zfs_arc_max=2147483648" in out


def test_zed_configured_and_enabled(host):
    rc = host.file("/etc/zfs/zed.d/zed.rc").content_string.splitlines()
    assert 'ZED_EMAIL_ADDR="storage-admins@example.org"' in rc
    assert "ZED_NOTIFY_VERBOSE=1" in rc
    assert host.service("zfs-zed").is_enabled


@pytest.mark.parametrize("pool", ["tank", "scratch"])
def test_scrub_timer_per_pool(host, pool):
    timer = f"provision-zfs-scrub@{pool}.timer"
    assert host.service(timer).is_enabled
    assert host.service(timer).is_running  # active (waiting)
    cal = host.check_output(f"systemctl show -P TimersCalendar {timer}")
    assert "OnCalendar=Mon *-*-* 00:00:00" in cal  # systemd's form of "weekly"
    unit = host.check_output(f"systemctl show -P Triggers {timer}")
    assert unit == f"provision-zfs-scrub@{pool}.service"


def test_scrub_service_runs_zpool(host):
    execs = host.check_output("systemctl show -P ExecStart provision-zfs-scrub@tank.service")
    assert "/usr/sbin/zpool scrub -w tank" in execs
    assert host.check_output(
        "systemctl show -P LoadState provision-zfs-scrub@tank.service"
    ) == "loaded"


def test_no_pool_was_pretended(host):
    # no kernel: nothing may claim the pool exists
    assert not host.file("/tank").exists
    assert not host.file("/etc/zfs/zpool.cache").exists
