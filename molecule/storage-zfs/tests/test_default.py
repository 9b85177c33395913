"""ZFS role in a container: real files and units, no kernel module (see molecule.yml)."""

import base64
import json

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


PROGRAM = "/usr/local/lib/provision/provision_zfs_snapshot.py"
CONFIG = "/etc/provision/zfs-snapshots.json"


def test_snapshot_program_and_policies_installed(host):
    program = host.file(PROGRAM)
    assert program.is_file and program.user == "root" and program.mode == 0o644
    assert "def to_destroy(" in program.content_string  # the package's own module
    assert json.loads(host.file(CONFIG).content_string) == {
        "datasets": {"tank/datasets": {"hourly": 3, "daily": 7}}}


@pytest.mark.parametrize(("frequency", "calendar", "on"), [
    ("hourly", "*-*-* *:00:00", True),
    ("daily", "*-*-* 00:00:00", True),
    ("weekly", "Mon *-*-* 00:00:00", False),
    ("monthly", "*-*-01 00:00:00", False),
])
def test_snapshot_timer_per_frequency_the_policies_keep(host, frequency, calendar, on):
    timer = f"provision-zfs-snapshot@{frequency}.timer"
    assert host.service(timer).is_enabled is on
    assert host.service(timer).is_running is on
    assert f"OnCalendar={calendar} " in host.check_output(f"systemctl show -P TimersCalendar {timer}")
    service = f"provision-zfs-snapshot@{frequency}.service"
    assert host.check_output(f"systemctl show -P Triggers {timer}") == service
    execs = host.check_output(f"systemctl show -P ExecStart {service}")
    assert f"/usr/bin/python3 {PROGRAM} --config {CONFIG}" in execs and f" {frequency} " in execs


FAKE_ZFS = """#!/usr/bin/python3
import json, sys
state = "/tmp/fake-zfs/snaps.json"
snaps = json.load(open(state))
if sys.argv[1] == "list":
    print("\\n".join(s for s in snaps if s.split("@")[0] == sys.argv[-1]))
elif sys.argv[1] == "snapshot":
    snaps.append(sys.argv[2])
elif sys.argv[1] == "destroy":
    snaps.remove(sys.argv[2])
json.dump(snaps, open(state, "w"))
"""


def test_the_installed_program_prunes_only_its_own_beyond_the_count(host):
    """The node's program on the node's Python, against a stand-in zfs (no kernel here)."""
    ours = [f"tank/datasets@provision-hourly-20250101T{h:02d}0000Z" for h in range(4)]
    foreign = ["tank/datasets@before-upgrade", "tank/datasets@provision-hourly-keep"]
    host.check_output("rm -rf /tmp/fake-zfs && mkdir -p /tmp/fake-zfs/bin /tmp/fake-zfs/prom")
    for path, text in (("bin/zfs", FAKE_ZFS), ("snaps.json", json.dumps(ours + foreign))):
        host.check_output(f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > /tmp/fake-zfs/{path}")
    host.check_output("chmod 755 /tmp/fake-zfs/bin/zfs")
    run = host.run(f"PATH=/tmp/fake-zfs/bin:$PATH timeout 60 /usr/bin/python3 {PROGRAM} --config {CONFIG} "
                   "--textfile-dir /tmp/fake-zfs/prom hourly")
    assert run.rc == 0, run.stderr
    left = json.loads(host.file("/tmp/fake-zfs/snaps.json").content_string)
    (taken,) = [s for s in left if s not in ours + foreign]
    assert set(left) == {*foreign, ours[2], ours[3], taken}  # 3 hourly kept, foreign untouched
    prom = host.file("/tmp/fake-zfs/prom/provision_zfs_snapshots.prom").content_string
    assert 'provision_zfs_snapshot_run_success{frequency="hourly"} 1' in prom
    host.check_output("rm -rf /tmp/fake-zfs")


REPLICATE = "/usr/local/lib/provision/provision_zfs_replicate.py"


def test_the_sender_has_the_key_its_replications_and_a_timer(host):
    key = host.file("/etc/provision/zfs-replication.key")
    assert key.exists and key.user == "root" and key.mode == 0o600
    assert "PRIVATE KEY" in host.check_output("cat /etc/provision/zfs-replication.key")
    config = json.loads(host.file("/etc/provision/zfs-replication.json").content_string)
    assert config["replications"][0]["target"] == "scratch/datasets"
    assert config["key"] == "/etc/provision/zfs-replication.key"
    assert host.file(REPLICATE).exists
    timer = host.file("/etc/systemd/system/provision-zfs-replicate.timer").content_string
    assert "OnCalendar=*-*-* *:10:00" in timer
    assert host.service("provision-zfs-replicate.timer").is_enabled


def test_the_receiver_s_key_runs_serve_alone_and_serve_refuses_the_rest(host):
    user = host.user("zfsrecv")
    assert user.exists and user.shell == "/bin/sh" and user.uid < 1000
    keys = host.file("/var/lib/provision/zfsrecv/.ssh/authorized_keys")
    assert keys.user == "zfsrecv" and keys.mode == 0o600
    line = keys.content_string.strip()
    assert line.startswith('restrict,from="127.0.0.1",command="/usr/bin/python3 ' + REPLICATE
                           + ' serve --config /etc/provision/zfs-replicas.json" ssh-ed25519 ')
    assert len(line.splitlines()) == 1
    replicas = json.loads(host.file("/etc/provision/zfs-replicas.json").content_string)
    assert replicas["replicas"]["scratch/datasets"]["parent"] == "scratch"
    for request in ("zfs destroy -r scratch", "recv tank/datasets", "sh"):
        r = host.run(f"su -s /bin/sh zfsrecv -c 'SSH_ORIGINAL_COMMAND=\"{request}\" /usr/bin/python3 {REPLICATE} "
                     "serve --config /etc/provision/zfs-replicas.json'")
        assert r.rc == 2 and "refused" in r.stderr, (request, r.stdout, r.stderr)
