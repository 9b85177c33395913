"""A node of the manifest (gpu01's MAC) boots: static lease, iPXE over TFTP, its script,
seed and preseed over HTTP, the install report, then boot from disk."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import yaml

testinfra_hosts = ["ansible://pxe-client"]

SERVER_IP = "10.10.0.10"
CLIENT_IP = "10.10.0.21"  # gpu01 in examples/llm-200k.yaml
CLIENT_MAC = "3c:ec:ef:10:00:21"
BASE = f"http://{SERVER_IP}"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl root@gpu01"


def lease(client: Any, iface: str, *options: str) -> dict[str, str]:
    """One DHCP exchange with busybox udhcpc; the offered values as a dict."""
    extra = " ".join(f"-x {o}" for o in options)
    result = client.run(
        f"busybox udhcpc -i {iface} -n -q -f -t 4 -T 2 -A 1 -s /usr/local/sbin/udhcpc-record {extra}"
    )
    if result.rc != 0:
        return {}
    env = client.file(f"/run/udhcpc/{iface}.env").content_string
    return dict(line.split("=", 1) for line in env.splitlines() if "=" in line)


@pytest.fixture(scope="module")
def iface(client: Any) -> str:
    name = client.check_output("ip -o link show | grep -i %s | cut -d: -f2 | cut -d@ -f1", CLIENT_MAC).strip()
    assert name, "no interface with gpu01's MAC"
    return str(name)


@pytest.fixture(scope="module")
def bios_lease(client: Any, iface: str) -> dict[str, str]:
    return lease(client, iface)


def curl(client: Any, url: str, *args: str) -> tuple[int, str]:
    """(HTTP status, body) of one request made on the client."""
    cmd = " ".join(["curl -sS -o /tmp/body -w '%{http_code}'", *(shlex.quote(a) for a in args), shlex.quote(url)])
    out = client.run(cmd)
    assert out.rc == 0, out.stderr
    return int(out.stdout), client.file("/tmp/body").content_string


def post(client: Any, url: str, body: str) -> tuple[int, str]:
    return curl(client, url, "-X", "POST", "--data-binary", body)


def test_static_lease_for_the_manifest_mac(bios_lease: dict[str, str]) -> None:
    assert bios_lease["ip"] == CLIENT_IP
    assert bios_lease["subnet"] == "255.255.255.0"
    assert bios_lease["router"] == "10.10.0.1"
    assert bios_lease["dns"].split() == ["10.10.0.1"]
    assert bios_lease["domain"] == "llm.internal"
    assert bios_lease["hostname"] == "gpu01"


def test_bios_firmware_gets_undionly(bios_lease: dict[str, str]) -> None:
    assert bios_lease["boot_file"] == "undionly.kpxe"
    assert bios_lease["siaddr"] == SERVER_IP


def test_uefi_firmware_gets_the_efi_binary(client: Any, iface: str) -> None:
    offered = lease(client, iface, "0x5d:0007")  # client-arch 7: x86-64 UEFI
    assert offered["ip"] == CLIENT_IP
    assert offered["boot_file"] == "snponly.efi"


def test_ipxe_gets_its_per_node_script_url(client: Any, iface: str) -> None:
    offered = lease(client, iface, "0xaf:150101")  # option 175: this is iPXE
    assert offered["ip"] == CLIENT_IP
    assert offered["boot_file"] == f"{BASE}/boot/gpu01.ipxe"


@pytest.mark.parametrize("binary", ["undionly.kpxe", "snponly.efi"])
def test_ipxe_binary_over_tftp(client: Any, server: Any, bios_lease: dict[str, str], binary: str) -> None:
    client.run("rm -f /tmp/%s", binary)
    got = client.run("cd /tmp && tftp -m binary %s -c get %s", SERVER_IP, binary)
    assert got.rc == 0, got.stderr
    assert client.file(f"/tmp/{binary}").sha256sum == server.file(f"/usr/lib/ipxe/{binary}").sha256sum


def test_armed_node_gets_its_installer(client: Any, bios_lease: dict[str, str]) -> None:
    status, script = curl(client, f"{BASE}/boot/gpu01.ipxe")
    assert status == 200
    assert script.startswith("#!ipxe\n")
    assert f"kernel {BASE}/media/ubuntu-22.04/vmlinuz " in script
    assert f"ds=nocloud-net;s={BASE}/nodes/gpu01/" in script
    assert f"url={BASE}/media/ubuntu-22.04/live-server.iso" in script
    assert f"initrd {BASE}/media/ubuntu-22.04/initrd" in script


def test_installer_media_over_http(client: Any, bios_lease: dict[str, str]) -> None:
    assert curl(client, f"{BASE}/media/ubuntu-22.04/vmlinuz") == (200, "FAKE vmlinuz for ubuntu-22.04\n")
    assert curl(client, f"{BASE}/media/debian-12/initrd.gz") == (200, "FAKE initrd.gz for debian-12\n")


def test_autoinstall_seed_over_http(client: Any, bios_lease: dict[str, str]) -> None:
    status, text = curl(client, f"{BASE}/nodes/gpu01/user-data")
    assert status == 200 and text.startswith("#cloud-config\n")
    auto = yaml.safe_load(text)["autoinstall"]
    assert auto["version"] == 1
    assert auto["network"]["ethernets"]["eno1"]["addresses"] == [f"{CLIENT_IP}/24"]
    assert auto["user-data"]["hostname"] == "gpu01"
    assert auto["late-commands"][-1].endswith(f"{BASE}/api/installed/gpu01")
    status, meta = curl(client, f"{BASE}/nodes/gpu01/meta-data")
    assert status == 200 and yaml.safe_load(meta)["local-hostname"] == "gpu01"


def test_debian_node_gets_preseed(client: Any, bios_lease: dict[str, str]) -> None:
    status, script = curl(client, f"{BASE}/boot/gpu04.ipxe")
    assert status == 200
    assert f"kernel {BASE}/media/debian-12/linux " in script
    assert f"url={BASE}/nodes/gpu04/preseed.cfg" in script
    status, preseed = curl(client, f"{BASE}/nodes/gpu04/preseed.cfg")
    assert status == 200
    assert "d-i netcfg/get_ipaddress string 10.10.0.24\n" in preseed
    assert "d-i partman-auto/method string raid\n" in preseed
    status, late = curl(client, f"{BASE}/nodes/gpu04/late.sh")
    assert status == 200 and late.startswith("#!/bin/sh\n")


def test_image_deploy_node_gets_the_deploy_ramdisk_and_its_plan(client: Any, bios_lease: dict[str, str]) -> None:
    status, script = curl(client, f"{BASE}/boot/gpu02.ipxe")
    assert status == 200
    assert f"kernel {BASE}/images/deploy-ramdisk/vmlinuz " in script
    assert f"provision.plan={BASE}/nodes/gpu02/deploy.json" in script
    assert f"initrd {BASE}/images/deploy-ramdisk/initrd.img" in script
    assert curl(client, f"{BASE}/images/deploy-ramdisk/vmlinuz") == (200, "FAKE vmlinuz of the deploy ramdisk\n")
    # the image over HTTP, and its checksum in the plan (filled in by the role), armed: may erase
    assert client.run(f"curl -sSf -o /tmp/image.tar.zst {BASE}/images/ubuntu-22.04.tar.zst").rc == 0
    served = client.check_output("sha256sum /tmp/image.tar.zst").split()[0]
    status, text = curl(client, f"{BASE}/nodes/gpu02/deploy.json")
    assert status == 200
    plan = json.loads(text)
    assert plan["image"] == {"url": f"{BASE}/images/ubuntu-22.04.tar.zst", "sha256": served}
    assert plan["node"] == "gpu02" and plan["mac"] == "3c:ec:ef:10:00:22" and plan["erase_allowed"] is True
    assert plan["disks"] == ["/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W200002"]
    assert plan["report_url"] == f"{BASE}/api/installed/gpu02"
    # a node this run did not arm: its plan may not erase a disk with data on it
    status, text = curl(client, f"{BASE}/nodes/gpu03/deploy.json")
    assert status == 200 and json.loads(text)["erase_allowed"] is False


def test_a_deploy_failure_for_another_node_is_refused(client: Any, bios_lease: dict[str, str]) -> None:
    status, body = post(client, f"{BASE}/api/failed/gpu02", "download: checksum mismatch")
    assert status == 403 and "must come from 10.10.0.22" in body


def test_unarmed_node_boots_from_disk(client: Any, bios_lease: dict[str, str]) -> None:
    status, script = curl(client, f"{BASE}/boot/gpu03.ipxe")
    assert status == 200
    assert "sanboot --no-describe --drive 0x80" in script
    assert "kernel" not in script


def test_report_for_another_node_is_refused(client: Any, bios_lease: dict[str, str]) -> None:
    status, body = post(client, f"{BASE}/api/installed/gpu02", HOST_KEY)
    assert status == 403, body
    status, body = curl(client, f"{BASE}/api/status/gpu02")
    assert json.loads(body)["state"] == "armed"


def test_report_with_garbage_is_refused(client: Any, bios_lease: dict[str, str]) -> None:
    status, _ = post(client, f"{BASE}/api/installed/gpu01", "rm -rf /")
    assert status == 400


def test_installed_report_switches_the_node_to_its_disk(client: Any, bios_lease: dict[str, str]) -> None:
    status, body = post(client, f"{BASE}/api/installed/gpu01", HOST_KEY)
    assert status == 200, body
    state = json.loads(curl(client, f"{BASE}/api/status/gpu01")[1])
    assert state["state"] == "installed"
    assert state["reported_from"] == CLIENT_IP
    assert state["host_keys"] == [" ".join(HOST_KEY.split()[:2])]
    status, script = curl(client, f"{BASE}/boot/gpu01.ipxe")
    assert status == 200
    assert "sanboot --no-describe --drive 0x80" in script
    assert "kernel" not in script
    # a repeated report (the installer retried) changes nothing
    assert post(client, f"{BASE}/api/installed/gpu01", HOST_KEY)[0] == 200


def test_unknown_mac_gets_no_lease(client: Any, iface: str) -> None:
    client.run("ip link set dev %s address 3c:ec:ef:99:99:99", iface)
    try:
        assert lease(client, iface) == {}
    finally:
        client.run("ip link set dev %s address %s", iface, CLIENT_MAC)
