"""The head node after converge: dnsmasq, nginx and pxe-state run with the manifest's nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest

testinfra_hosts = ["ansible://pxe-server"]


@pytest.mark.parametrize("service", ["dnsmasq", "nginx", "pxe-state"])
def test_services_run_and_start_at_boot(host: Any, service: str) -> None:
    svc = host.service(service)
    assert svc.is_running
    assert svc.is_enabled


@pytest.mark.parametrize(
    "socket",
    ["udp://0.0.0.0:67", "udp://10.10.0.10:69", "tcp://0.0.0.0:80", "tcp://127.0.0.1:8071"],
)
def test_ports_listen(host: Any, socket: str) -> None:
    assert host.socket(socket).is_listening


def test_dnsmasq_serves_no_dns(host: Any) -> None:
    assert not host.socket("udp://0.0.0.0:53").is_listening
    assert not host.socket("tcp://0.0.0.0:53").is_listening


def test_static_lease_per_manifest_mac(host: Any) -> None:
    conf = host.file("/etc/dnsmasq.d/pxe.conf")
    assert conf.mode == 0o644
    text = conf.content_string
    for i in range(1, 5):
        assert f"dhcp-host=3c:ec:ef:10:00:2{i},set:node-gpu0{i},10.10.0.2{i},gpu0{i}" in text
        assert f"dhcp-boot=tag:ipxe,tag:node-gpu0{i},http://10.10.0.10/boot/gpu0{i}.ipxe" in text
    assert "dhcp-range=10.10.0.0,static,255.255.255.0,12h" in text
    assert "head01" not in text.split("# One line per node")[1]  # the head does not install itself


@pytest.mark.parametrize("conf", ["/etc/dnsmasq.d/pxe.conf", "/root/dnsmasq-pxe-proxy.conf"])
def test_dnsmasq_test_accepts_rendered_configs(host: Any, conf: str) -> None:
    result = host.run("dnsmasq --test --conf-file=%s", conf)
    assert result.rc == 0, result.stderr
    assert "syntax check OK" in result.stderr + result.stdout


def test_proxy_variant_hands_out_no_addresses(host: Any) -> None:
    text = host.file("/root/dnsmasq-pxe-proxy.conf").content_string
    assert "dhcp-range=10.10.0.0,proxy,255.255.255.0" in text
    assert "dhcp-host=3c:ec:ef:10:00:21,set:node-gpu01\n" in text
    assert "pxe-service=tag:!ipxe,x86PC" in text


@pytest.mark.parametrize("binary", ["undionly.kpxe", "snponly.efi", "ipxe.efi"])
def test_ipxe_binaries_published(host: Any, binary: str) -> None:
    published = host.file(f"/srv/pxe/tftp/{binary}")
    assert published.is_file and published.mode == 0o644
    assert published.sha256sum == host.file(f"/usr/lib/ipxe/{binary}").sha256sum


def test_ubuntu_kernel_taken_from_the_iso(host: Any) -> None:
    assert host.file("/srv/pxe/http/media/ubuntu-22.04/live-server.iso").is_symlink
    assert host.file("/srv/pxe/http/media/ubuntu-22.04/vmlinuz").content_string == "FAKE vmlinuz for ubuntu-22.04\n"
    assert host.file("/srv/pxe/http/media/ubuntu-22.04/initrd").content_string == "FAKE initrd for ubuntu-22.04\n"


def test_debian_netboot_published(host: Any) -> None:
    assert host.file("/srv/pxe/http/media/debian-12/linux").content_string == "FAKE linux for debian-12\n"


def test_node_files_published(host: Any) -> None:
    for node, files in {"gpu01": ["install.ipxe", "user-data", "meta-data", "vendor-data"],
                        "gpu02": ["install.ipxe", "deploy.json"],
                        "gpu04": ["install.ipxe", "preseed.cfg", "late.sh"]}.items():
        for name in files:
            f = host.file(f"/srv/pxe/http/nodes/{node}/{name}")
            assert f.is_file and f.mode == 0o644, f"{node}/{name}"
    assert not host.file("/srv/pxe/http/nodes/gpu04/user-data").exists
    assert not host.file("/srv/pxe/http/nodes/gpu02/user-data").exists  # an image deploy needs no seed
    for name in ("ubuntu-22.04.tar.zst", "ubuntu-22.04.tar.zst.sha256", "deploy-ramdisk/vmlinuz",
                 "deploy-ramdisk/initrd.img", "deploy-ramdisk/SHA256SUMS"):
        f = host.file(f"/srv/pxe/http/images/{name}")
        assert f.is_file and f.mode == 0o644, name
    assert host.run("cd /srv/pxe/http/images && sha256sum -c ubuntu-22.04.tar.zst.sha256").rc == 0
    assert not host.file("/srv/pxe/http/nodes/head01").exists


def test_armed_nodes_have_state_files(host: Any) -> None:
    now = int(host.check_output("date +%s"))
    for node in ("gpu02", "gpu04"):
        f = host.file(f"/var/lib/pxe-state/{node}.json")
        assert f.user == "pxe-state"
        state = json.loads(f.content_string)
        assert state["state"] == "armed"
        assert now + 5 * 3600 < state["expires"] <= now + 6 * 3600  # pxe_server_arm_hours: 6
    assert not host.file("/var/lib/pxe-state/gpu03.json").exists


def test_state_service_runs_unprivileged(host: Any) -> None:
    procs = [p for p in host.process.filter(comm="python3") if "pxe_state_server.py" in p.args]
    assert procs, "pxe-state is not running"
    assert {p.user for p in procs} == {"pxe-state"}


def test_nginx_config_valid(host: Any) -> None:
    assert host.run("nginx -t").rc == 0
    assert not host.file("/etc/nginx/sites-enabled/default").exists
