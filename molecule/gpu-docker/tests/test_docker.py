"""Verify nvidia_container_toolkit + docker on Debian 12 in a privileged container.

What is real: docker.io from Debian, dockerd running with the merged daemon.json, an
imported image running, the toolkit role's repository/pin/hold logic. What is a STAND-IN:
the toolkit packages come from a local signed repository built by prepare.yml (NVIDIA's is
unreachable here); their nvidia-container-runtime only hands containers to runc.
"""

from __future__ import annotations

import json
import re

import pytest

TOOLKIT = ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
           "libnvidia-container1"]


def _daemon(host):
    return json.loads(host.file("/etc/docker/daemon.json").content_string)


def _info(host):
    return json.loads(host.check_output("docker info --format '{{json .}}'"))


def test_docker_io_installed(host):
    assert host.package("docker.io").is_installed


def test_dockerd_running_and_enabled(host):
    svc = host.service("docker")
    assert svc.is_running
    assert svc.is_enabled
    assert host.socket("unix:///run/docker.sock").is_listening


def test_daemon_json_managed_keys(host):
    f = host.file("/etc/docker/daemon.json")
    assert f.user == "root" and f.mode == 0o644
    cfg = _daemon(host)
    assert cfg["data-root"] == "/srv/docker-data"
    assert cfg["log-driver"] == "json-file"
    assert cfg["log-opts"] == {"max-size": "50m", "max-file": "3"}
    assert cfg["live-restore"] is True
    assert cfg["default-address-pools"] == [{"base": "172.31.0.0/16", "size": 24}]
    assert cfg["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    assert "default-runtime" not in cfg


def test_admin_keys_survive_the_merge(host):
    cfg = _daemon(host)
    assert cfg["max-concurrent-downloads"] == 7
    assert cfg["runtimes"]["admin-runc"] == {"path": "/usr/sbin/runc"}


def test_running_daemon_uses_the_configuration(host):
    info = _info(host)
    assert info["DockerRootDir"] == "/srv/docker-data"
    assert info["Driver"] == "overlay2"
    assert info["LoggingDriver"] == "json-file"
    assert info["LiveRestoreEnabled"] is True
    assert info["DefaultRuntime"] == "runc"
    # docker info lists the registered runtimes: ours and the admin's
    assert info["Runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    assert "admin-runc" in info["Runtimes"]


def test_import_and_run_an_image(host):
    host.run("docker rmi -f provision-test/busybox:1 >/dev/null 2>&1")
    host.check_output("docker import /root/busybox-rootfs.tar provision-test/busybox:1")
    out = host.check_output("docker run --rm provision-test/busybox:1 /bin/echo hello-from-docker")
    assert out == "hello-from-docker"


def test_bridge_network_comes_from_the_address_pool(host):
    host.run("docker network rm provision-test-net >/dev/null 2>&1")
    host.check_output("docker network create provision-test-net")
    try:
        subnet = host.check_output(
            "docker network inspect provision-test-net --format '{{(index .IPAM.Config 0).Subnet}}'")
        assert re.match(r"^172\.31\.\d+\.0/24$", subnet), subnet
    finally:
        host.run("docker network rm provision-test-net")


def test_nvidia_runtime_is_callable(host):
    # STAND-IN runtime (hands the container to runc): proves dockerd execs the registered
    # runtime path, not that GPUs are reachable (there are none here)
    host.check_output("docker image inspect provision-test/busybox:1 >/dev/null 2>&1 "
                      "|| docker import /root/busybox-rootfs.tar provision-test/busybox:1")
    out = host.check_output("docker run --rm --runtime nvidia provision-test/busybox:1 /bin/echo via-nvidia-runtime")
    assert out == "via-nvidia-runtime"


def test_users_in_docker_group(host):
    assert "docker" in host.user("ops").groups


@pytest.mark.parametrize("name", TOOLKIT)
def test_toolkit_packages_pinned_and_held(host, name):
    pkg = host.package(name)
    assert pkg.is_installed
    assert pkg.version == "1.17.8-1"
    sel = host.check_output("dpkg --get-selections %s", name)
    assert re.match(rf"^{re.escape(name)}\s+hold$", sel), sel


def test_toolkit_repository_is_signed(host):
    sources = host.file("/etc/apt/sources.list.d/nvidia-container-toolkit.sources").content_string
    assert "Signed-By:" in sources
    assert "URIs: file:/srv/standin-toolkit-repo/amd64" in sources


def test_no_cdi_spec_without_gpus(host):
    assert not host.file("/etc/cdi/nvidia.yaml").exists


def test_only_one_cdi_spec_mechanism(host):
    # prepare left /var/run/cdi/nvidia.yaml (what nvidia-cdi-refresh of toolkit 1.18+ writes);
    # with toolkit 1.17 the role's own /etc/cdi/nvidia.yaml is the spec, so the stale one is gone
    assert not host.file("/var/run/cdi/nvidia.yaml").exists
    # no GPU in the container: no spec generated, no stamp
    assert not host.file("/etc/cdi/nvidia.yaml").exists
    assert not host.file("/var/lib/provision/nvidia-cdi.stamp").exists
