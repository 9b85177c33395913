"""ofed role in a container: packages, IPoIB config, opensm, memlock, peermem."""


import pytest

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
testinfra_hosts = ["ansible://ofed-node"]


@pytest.mark.parametrize(
    "pkg",
    ["rdma-core", "ibverbs-providers", "ibverbs-utils", "infiniband-diags", "perftest", "opensm"],
)
def test_packages(host, pkg):
    assert host.package(pkg).is_installed


@pytest.mark.parametrize("tool", ["ibv_devinfo", "ibstat", "ib_write_bw"])
def test_tools_on_path(host, tool):
    assert host.exists(tool)


def test_ipoib_network_file(host):
    f = host.file("/etc/systemd/network/60-provision-ipoib.network")
    assert f.user == "root" and f.mode == 0o644
    lines = f.content_string.splitlines()
    for expected in ("Name=ib0", "MTUBytes=65520", "Address=10.10.2.10/24"):
        assert expected in lines
    assert host.service("systemd-networkd").is_enabled


def test_ipoib_mode_udev_rule(host):
    f = host.file("/etc/udev/rules.d/90-provision-ipoib.rules")
    assert f.mode == 0o644
    rules = [ln for ln in f.content_string.splitlines() if ln and not ln.startswith("#")]
    assert rules == [
        'ACTION=="add", SUBSYSTEM=="net", KERNEL=="ib0", ATTR{mode}="connected"',
        'ACTION=="add", SUBSYSTEM=="net", NAME=="ib0", ATTR{mode}="connected"',
    ]


def test_networkd_parses_ipoib_file(host):
    # networkd (systemd 252) reads the file without complaints about unknown sections/keys
    host.check_output("systemctl start systemd-networkd")
    try:
        log = host.check_output(
            "journalctl -b -u systemd-networkd --no-pager -o cat | grep 60-provision-ipoib || true"
        )
        assert "Unknown" not in log and "Failed" not in log, log
        assert host.service("systemd-networkd").is_running
    finally:
        host.run("systemctl stop systemd-networkd systemd-networkd.socket")


def test_opensm_enabled(host):
    assert host.service("opensm").is_enabled


def test_memlock_limits(host):
    f = host.file("/etc/security/limits.d/90-rdma.conf")
    assert f.mode == 0o644
    rows = [ln.split() for ln in f.content_string.splitlines() if ln and not ln.startswith("#")]
    assert ["*", "soft", "memlock", "unlimited"] in rows
    assert ["*", "hard", "memlock", "unlimited"] in rows


def test_memlock_for_services(host):
    # systemd was re-executed and now hands services an unlimited memlock limit
    assert host.check_output("systemctl show -P DefaultLimitMEMLOCK") == "infinity"


def test_peermem_loaded_at_boot(host):
    f = host.file("/etc/modules-load.d/nvidia-peermem.conf")
    lines = [ln for ln in f.content_string.splitlines() if not ln.startswith("#")]
    assert lines == ["nvidia-peermem"]
