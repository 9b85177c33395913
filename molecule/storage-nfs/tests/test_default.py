"""nfs_server + nfs_client in a container: what nfs-utils and systemd read back."""


import pytest

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
testinfra_hosts = ["ansible://nfs-node"]


# ----------------------------------------------------------------------------- server
def test_server_package(host):
    assert host.package("nfs-kernel-server").is_installed


def test_exports_file(host):
    f = host.file("/etc/exports")
    assert f.user == "root" and f.mode == 0o644
    lines = [ln for ln in f.content_string.splitlines() if ln and not ln.startswith("#")]
    assert lines == [
        "/tank/datasets 10.10.2.0/24(rw,sync,root_squash,no_subtree_check)",
        "/srv/nfs/scratch 10.10.0.0/24(rw,async,no_root_squash,no_subtree_check) "
        "10.10.2.0/24(rw,async,no_root_squash,no_subtree_check)",
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [("threads", "24"), ("vers3", "n"), ("vers4.0", "n"), ("vers4.1", "y"),
     ("vers4.2", "y"), ("rdma", "y"), ("rdma-port", "20049")],
)
def test_nfsd_settings_as_nfs_utils_reads_them(host, key, value):
    assert host.check_output(f"nfsconf --get nfsd {key}") == value


def test_path_export_created_dataset_left_to_zfs(host):
    d = host.file("/srv/nfs/scratch")
    assert d.is_directory and d.mode == 0o755
    assert not host.file("/tank/datasets").exists


def test_server_enabled(host):
    assert host.service("nfs-server").is_enabled


def test_rdma_module_at_boot(host):
    for name in ("provision-nfs-rdma.conf", "provision-nfs-client-rdma.conf"):
        f = host.file(f"/etc/modules-load.d/{name}")
        assert "rpcrdma" in f.content_string.splitlines()


# ----------------------------------------------------------------------------- client
def test_client_package(host):
    assert host.package("nfs-common").is_installed


def _show(host, unit, prop):
    return host.check_output(f"systemctl show -P {prop} {unit}")


def test_rdma_mount_unit(host):
    unit = "data.mount"
    assert _show(host, unit, "LoadState") == "loaded"
    assert _show(host, unit, "What") == "10.10.2.10:/tank/datasets"
    assert _show(host, unit, "Where") == "/data"
    assert _show(host, unit, "Type") == "nfs"
    opts = _show(host, unit, "Options").split(",")
    assert opts == ["vers=4.2", "proto=rdma", "port=20049", "nconnect=8", "rsize=1048576",
                    "wsize=1048576", "hard", "_netdev"]
    assert "network-online.target" in _show(host, unit, "After").split()
    assert host.check_output(f"systemctl is-enabled {unit}") == "enabled"
    assert "remote-fs.target" in _show(host, unit, "WantedBy").split()
    assert host.file("/data").is_directory


def test_automount_unit(host):
    auto = "home-shared.automount"
    assert _show(host, auto, "LoadState") == "loaded"
    assert _show(host, auto, "Where") == "/home/shared"
    assert _show(host, auto, "TimeoutIdleUSec") == "5min"
    assert host.check_output(f"systemctl is-enabled {auto}") == "enabled"
    mount = "home-shared.mount"
    assert _show(host, mount, "What") == "10.10.0.10:/tank/home"
    assert "proto=tcp" in _show(host, mount, "Options").split(",")
    # mounted on demand through the automount, not at boot
    assert host.run(f"systemctl is-enabled {mount}").stdout.strip() != "enabled"


def test_stale_unit_removed(host):
    assert not host.file("/etc/systemd/system/old-export.mount").exists
    assert not host.file("/etc/systemd/system/remote-fs.target.wants/old-export.mount").exists
    assert _show(host, "old-export.mount", "LoadState") == "not-found"
