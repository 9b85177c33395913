"""Verify the real state the `common` role leaves on the head and compute containers.

Runs after converge, idempotence and side_effect (which added gpu03 to /etc/hosts via
the `hosts` entry point).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

HOSTS = {
    "10.213.17.10": "head.cluster.test head",
    "10.213.17.11": "gpu01.cluster.test gpu01",
    "10.213.17.12": "gpu02.cluster.test gpu02",
    "10.213.18.11": "gpu01-data.cluster.test gpu01-data",
    "10.213.17.13": "gpu03.cluster.test gpu03",  # added by side_effect (tasks_from: hosts)
}
HEAD_IP = "10.213.17.10"
ALICE_KEYS = [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGU78aydsK8jq2+d5yYgANVMV3ydKJ6PDY3xcvVhkrRl alice@workstation",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILd/NpiMX85FbEVmfOQSzHDE9Yrja8MZuDDiIqc1xSGY alice@laptop",
]
BOB_KEYS = [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIN1LtpoDuBg+JKVQtSPeco8jNEIPSI9dBmFXDQgK9qA9 bob@workstation",
]

# the key pairs prepare.yml made for this run (the head holds the private halves)
TEST_KEYS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
ALICE_KEYS.append((TEST_KEYS / "alice_ed25519.pub").read_text().strip())
BOB_KEYS.append((TEST_KEYS / "bob_ed25519.pub").read_text().strip())
COMPUTE_IP = "10.213.17.11"


def node(host) -> str:
    return host.backend.get_hostname()


def is_head(host) -> bool:
    return node(host) == "common-head"


# --- hostname / hosts ------------------------------------------------------------------


def lines(host, path: str) -> list[str]:
    # (testinfra's content_string drops the file's final newline)
    return host.file(path).content_string.splitlines()


def test_hostname_file(host):
    expected = "head" if is_head(host) else "gpu01"
    assert lines(host, "/etc/hostname") == [expected]


def test_etc_hosts_block(host):
    content = host.file("/etc/hosts").content_string
    lines = content.splitlines()
    begin = lines.index("# BEGIN provisioner: cluster nodes (role common)")
    end = lines.index("# END provisioner: cluster nodes (role common)")
    block = lines[begin + 1 : end]
    assert block == [f"{ip} {names}" for ip, names in HOSTS.items()]
    # the rest of the file is kept (localhost line written by podman)
    assert any(re.match(r"127\.0\.0\.1\s+localhost", line) for line in lines)
    assert content.count("# BEGIN provisioner") == 1
    # the installer's 127.0.1.1 line (added by prepare.yml) is gone
    assert not [line for line in lines if line.startswith("127.0.1.1")]


def test_names_resolve(host):
    assert host.addr("gpu02.cluster.test").ipv4_addresses == ["10.213.17.12"]
    assert host.addr("head").ipv4_addresses == [HEAD_IP]


# --- apt / pip ----------------------------------------------------------------------------


def test_apt_sources_point_at_mirror(host):
    sources = host.file("/etc/apt/sources.list.d/debian.sources")
    assert sources.mode == 0o644
    text = lines(host, "/etc/apt/sources.list.d/debian.sources")
    assert text.count("URIs: http://deb.debian.org/debian") == 1
    assert "Suites: bookworm bookworm-updates" in text
    assert "URIs: http://deb.debian.org/debian-security" in text
    assert "Suites: bookworm-security" in text
    assert text.count("Components: main contrib non-free non-free-firmware") == 2
    legacy = host.file("/etc/apt/sources.list").content_string
    assert not [line for line in legacy.splitlines() if line.startswith("deb")]


def test_apt_proxy(host):
    conf = lines(host, "/etc/apt/apt.conf.d/01provision-proxy")
    assert 'Acquire::http::Proxy "http://host.containers.internal:3142";' in conf
    # and apt really works with mirror + proxy
    assert host.run("apt-get -q update").rc == 0


def test_apt_timeouts(host):
    conf = host.file("/etc/apt/apt.conf.d/80provision-timeouts")
    assert conf.user == "root" and conf.group == "root"
    assert conf.mode == 0o644
    # the head keeps the defaults, the compute node sets its own (molecule.yml host_vars)
    seconds, retries = ("30", "3") if is_head(host) else ("45", "5")
    text = [line for line in lines(host, "/etc/apt/apt.conf.d/80provision-timeouts") if not line.startswith("//")]
    assert text == [
        f'Acquire::http::Timeout "{seconds}";',
        f'Acquire::https::Timeout "{seconds}";',
        f'Acquire::ftp::Timeout "{seconds}";',
        f'Acquire::Retries "{retries}";',
        'Acquire::Retries::Delay "false";',  # retries at once: LP: #2003851, tests/testbed/README.md
        'DPkg::Lock::Timeout "600";',  # waits for another apt's lock, boundedly
    ]
    # apt reads them (apt-config prints the merged configuration)
    dump = host.check_output("apt-config dump Acquire")
    assert f'Acquire::http::Timeout "{seconds}";' in dump
    assert f'Acquire::Retries "{retries}";' in dump
    assert 'Acquire::Retries::Delay "false";' in dump
    assert 'DPkg::Lock::Timeout "600";' in host.check_output("apt-config dump DPkg::Lock")


def test_pip_conf(host):
    conf = host.file("/etc/pip.conf")
    assert conf.mode == 0o644
    text = [line for line in lines(host, "/etc/pip.conf") if not line.startswith("#")]
    assert text == [
        "[global]",
        "index-url = http://pypi.cluster.test:3141/root/pypi/+simple/",
        "trusted-host = pypi.cluster.test",
    ]


@pytest.mark.parametrize(
    "package",
    [
        "chrony",
        "sudo",
        "tzdata",
        "htop",
        "tmux",
        "rsync",
        "jq",
        "pciutils",
        "numactl",
        "ethtool",
        "lsof",
        "acl",
        "vim-tiny",
    ],
)
def test_packages_installed(host, package):
    assert host.package(package).is_installed


# --- time --------------------------------------------------------------------------------


def test_timezone(host):
    assert host.file("/etc/localtime").linked_to == "/usr/share/zoneinfo/Europe/Berlin"
    assert host.run("date +%Z").stdout.strip() in ("CET", "CEST")


def test_chrony_running(host):
    svc = host.service("chrony")
    assert svc.is_enabled
    assert svc.is_running
    # container mode: capability condition dropped, chronyd runs with -x
    assert host.run("pgrep -a chronyd").stdout.count(" -x") >= 1


def test_chrony_config(host):
    conf = lines(host, "/etc/chrony/chrony.conf")
    sources = [line for line in conf if line.startswith(("server ", "pool "))]
    allows = [line for line in conf if line.startswith("allow ")]
    assert "pool 2.debian.pool.ntp.org iburst" not in conf  # distro default replaced
    if is_head(host):
        assert sources == []
        assert allows == ["allow 10.213.17.0/24"]
        assert "local stratum 10" in conf
    else:
        assert sources == ["server head iburst"]
        assert allows == []
        assert "local stratum 10" not in conf


def test_compute_follows_head(host):
    """The compute node really gets its time from the head over the podman network."""
    if is_head(host):
        pytest.skip("head has no upstream")
    deadline = time.time() + 90
    tracking = ""
    while time.time() < deadline:
        tracking = host.run("chronyc -n tracking").stdout
        if f"({HEAD_IP})" in tracking:
            break
        time.sleep(3)
    assert f"({HEAD_IP})" in tracking, tracking
    assert re.search(r"^Stratum\s+: 11$", tracking, re.M), tracking


# --- users ---------------------------------------------------------------------------------


def test_alice(host):
    alice = host.user("alice")
    assert alice.exists
    assert alice.uid == 2001
    assert alice.shell == "/bin/bash"
    ssh_dir = host.file("/home/alice/.ssh")
    assert ssh_dir.is_directory and ssh_dir.user == "alice" and ssh_dir.mode == 0o700
    keys = host.file("/home/alice/.ssh/authorized_keys")
    assert keys.user == "alice"
    assert keys.group == "alice"
    assert keys.mode == 0o600
    assert keys.content_string.splitlines() == ALICE_KEYS


def test_bob(host):
    bob = host.user("bob")
    assert bob.exists
    assert bob.shell == "/bin/sh"
    keys = host.file("/home/bob/.ssh/authorized_keys")
    assert keys.user == "bob" and keys.mode == 0o600
    assert keys.content_string.splitlines() == BOB_KEYS


def test_root_has_only_the_keys_of_admins_with_sudo(host):
    """Issue 19 item 20: prepare.yml gave root bob's key (sudo: false) in authorized_keys and
    authorized_keys2; the role leaves exactly the keys allowed root."""
    keys = host.file("/root/.ssh/authorized_keys")
    assert keys.user == "root" and keys.group == "root" and keys.mode == 0o600
    listed = [line for line in keys.content_string.splitlines() if not line.startswith("#")]
    assert listed == ALICE_KEYS
    assert not set(BOB_KEYS) & set(keys.content_string.splitlines())
    assert not host.file("/root/.ssh/authorized_keys2").exists
    assert host.file("/root/.ssh").mode == 0o700


def ssh_from_head(host, key: str, user: str):
    """The inner ssh's exit status comes back as 1 when it is 255 (refused): testinfra's
    SSH backend takes a 255 for its own connection failing."""
    return host.run(
        "ssh -i /root/molecule-keys/%s -o BatchMode=yes -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 %s@%s id -un || exit 1",
        key, user, COMPUTE_IP,
    )


def test_a_non_sudo_admin_cannot_log_in_as_root(host):
    """Real SSH logins from the head to the compute node's sshd."""
    if not is_head(host):
        pytest.skip("the head is the SSH client")
    as_bob = ssh_from_head(host, "bob", "bob")
    assert as_bob.rc == 0 and as_bob.stdout.strip() == "bob", as_bob.stderr  # bob's key works ...
    bob_as_root = ssh_from_head(host, "bob", "root")
    assert bob_as_root.rc == 1 and "Permission denied (publickey" in bob_as_root.stderr  # ... not for root
    alice_as_root = ssh_from_head(host, "alice", "root")
    assert alice_as_root.rc == 0 and alice_as_root.stdout.strip() == "root", alice_as_root.stderr


def test_accounts_not_locked(host):
    # "*" = no password, but not "!"-locked: key logins work
    for user in ("alice", "bob"):
        shadow = host.run(f"getent shadow {user}").stdout.split(":")
        assert shadow[1] == "*"


def test_sudoers(host):
    sudoers = host.file("/etc/sudoers.d/alice")
    assert sudoers.user == "root" and sudoers.group == "root"
    assert sudoers.mode == 0o440
    assert "alice ALL=(ALL:ALL) NOPASSWD: ALL" in sudoers.content_string
    assert not host.file("/etc/sudoers.d/bob").exists  # sudo: false
    assert host.run("visudo -c").rc == 0
    assert host.run("sudo -n -u alice sudo -n true").rc == 0
    assert host.run("sudo -n -u bob sudo -n true").rc != 0


# --- tuning ---------------------------------------------------------------------------------


def test_sysctl_file(host):
    conf = host.file("/etc/sysctl.d/90-provision.conf")
    assert conf.mode == 0o644
    text = lines(host, "/etc/sysctl.d/90-provision.conf")
    for line in (
        "net.core.rmem_max = 268435456",
        "net.core.wmem_max = 268435456",
        "net.ipv4.tcp_rmem = 4096 87380 268435456",
        "net.core.netdev_max_backlog = 250000",
        "vm.max_map_count = 1048576",
        "kernel.numa_balancing = 0",
    ):
        assert line in text


def test_limits(host):
    text = host.file("/etc/security/limits.d/90-provision.conf").content_string
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert ["*", "soft", "memlock", "unlimited"] in rows
    assert ["*", "hard", "memlock", "unlimited"] in rows
    assert ["*", "soft", "nofile", "1048576"] in rows
    assert ["*", "hard", "nofile", "1048576"] in rows
    # pam_limits runs in login sessions (and the file does not break them). Raising the
    # hard limits above the container's own needs CAP_SYS_RESOURCE, which a podman
    # container lacks, so the values themselves are only checked on real machines.
    assert host.file("/etc/pam.d/su").contains("pam_limits.so")
    assert host.run("su - alice -c true").rc == 0


def data_ip(host) -> str:
    return "10.213.18.10" if is_head(host) else "10.213.18.11"


def test_data_network_file(host):
    """Issue 19 item 11: Debian 12's data interfaces are systemd-networkd's."""
    unit = host.file("/etc/systemd/network/90-provision-data-eth1.network")
    assert unit.user == "root" and unit.mode == 0o644
    text = unit.content_string.splitlines()
    for line in ("Name=eth1", f"Address={data_ip(host)}/24", "MTUBytes=1400", "RequiredForOnline=no"):
        assert line in text
    assert not [line for line in text if line.startswith(("Gateway=", "DHCP=", "[Route]"))]
    assert not host.file("/etc/udev/rules.d/99-provision-mtu.rules").exists  # the MTU-only rule is gone


def test_data_address_is_live_and_management_untouched(host):
    assert host.service("systemd-networkd").is_running and host.service("systemd-networkd").is_enabled
    assert not host.service("systemd-networkd-wait-online").is_enabled
    eth1 = host.check_output("ip addr show dev eth1")
    assert f" {data_ip(host)}/24 " in eth1 and " mtu 1400 " in eth1
    assert "inet6 fe80" not in eth1  # no link-local address on the data network
    state = host.check_output("networkctl list --no-legend")
    assert re.search(r"\beth1\s+ether\s+\S+\s+configured", state), state
    assert re.search(r"\beth0\s+ether\s+\S+\s+unmanaged", state), state  # management: not networkd's
    eth0 = host.check_output("ip addr show dev eth0")
    assert f" {'10.213.17.10' if is_head(host) else COMPUTE_IP}/24 " in eth0
    routes = host.check_output("ip route show default")
    assert routes.startswith("default via 10.213.17.1 dev eth0") and "eth1" not in routes


def test_traffic_flows_over_the_data_network(host):
    """The head logs in to gpu01-data (/etc/hosts: 10.213.18.11): the data addresses work."""
    if not is_head(host):
        pytest.skip("the head is the SSH client")
    route = host.check_output("ip route get 10.213.18.11")
    assert "dev eth1" in route and "via" not in route
    out = host.run(
        "ssh -i /root/molecule-keys/alice -o BatchMode=yes -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 alice@gpu01-data "
        "ip -o addr show to 10.213.18.11"
    )
    assert out.rc == 0 and " eth1 " in out.stdout, out.stderr
