"""provisioner.areas.baremetal.decide: per-node autoinstall seeds, preseeds and iPXE scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.baremetal import decide as ic
from provisioner.areas.baremetal import media as im
from provisioner.areas.baremetal import seeds
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.validate import load_manifest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def example(name: str) -> Manifest:
    return load_manifest(ROOT / "examples" / name).manifest


def debian(node: Node, **update: Any) -> Node:
    return node.model_copy(update={"os": "debian-12", **update})


def with_node(m: Manifest, node: Node) -> Manifest:
    return m.model_copy(update={"nodes": [node if n.name == node.name else n for n in m.nodes]})


def user_data(m: Manifest, node: Node) -> dict[str, Any]:
    text = seeds.ubuntu_user_data(m, node, ic.install_server(m))
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    assert list(data) == ["autoinstall"]
    return dict(data["autoinstall"])


def installable(m: Manifest) -> list[Node]:
    return [n for n in m.nodes if ic.not_installable(m, n) is None]


# --------------------------------------------------------------------------- selection
def test_head_and_incomplete_nodes_are_not_installable() -> None:
    m = example("llm-200k.yaml")
    assert "head node" in str(ic.not_installable(m, m.head))
    gpu = m.node("gpu01")
    assert ic.not_installable(m, gpu) is None
    assert "no install_disks" in str(ic.not_installable(m, gpu.model_copy(update={"install_disks": []})))
    no_mac = {"management": gpu.interfaces["management"].model_copy(update={"mac": None})}
    assert "no MAC" in str(ic.not_installable(m, gpu.model_copy(update={"interfaces": no_mac})))
    with pytest.raises(ic.InstallConfigError, match="head node"):
        seeds.install_files(m, m.head, ic.install_server(m))


def test_install_server_is_the_head_management_address() -> None:
    m = example("music-lab.yaml")
    server = ic.install_server(m)
    assert server.base_url == "http://192.168.50.2"
    assert server.report_url("gpu1") == "http://192.168.50.2/api/installed/gpu1"
    assert ic.InstallServer("10.0.0.1", 8080).node_url("n1", "user-data") == "http://10.0.0.1:8080/nodes/n1/user-data"


# --------------------------------------------------------------------------- ubuntu
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_node_renders_valid_install_files(path: Path) -> None:
    m = load_manifest(path).manifest
    nodes = installable(m)
    assert nodes
    for node in nodes:
        files = seeds.install_files(m, node, ic.install_server(m))
        assert set(files) == {"install.ipxe", "user-data", "meta-data", "vendor-data"}
        auto = user_data(m, node)
        assert auto["version"] == 1
        assert auto["user-data"]["hostname"] == node.name
        assert auto["user-data"]["fqdn"] == f"{node.name}.{m.cluster.domain}"
        assert yaml.safe_load(files["meta-data"])["local-hostname"] == node.name


def test_static_network_of_the_node() -> None:
    m = example("llm-200k.yaml")
    auto = user_data(m, m.node("gpu03"))
    eth = auto["network"]["ethernets"]["eno1"]
    assert auto["network"]["version"] == 2
    assert eth["match"] == {"macaddress": "3c:ec:ef:10:00:23"}
    assert eth["set-name"] == "eno1"
    assert eth["addresses"] == ["10.10.0.23/24"]
    assert eth["routes"] == [{"to": "default", "via": "10.10.0.1"}]
    assert eth["nameservers"] == {"search": ["llm.internal"], "addresses": ["10.10.0.1"]}


def test_ssh_server_and_keys() -> None:
    m = example("music-lab.yaml")
    auto = user_data(m, m.node("gpu1"))
    assert auto["ssh"] == {"install-server": True, "allow-pw": False}
    users = {u["name"]: u for u in auto["user-data"]["users"]}
    alice, bob = (u.ssh_keys for u in m.cluster.admin_users)
    # Ansible connects as root; root gets only the keys of admins allowed root (bob has sudo: false)
    assert users["root"]["ssh_authorized_keys"] == alice
    assert users["alice"]["ssh_authorized_keys"] == alice
    assert users["alice"]["sudo"] == "ALL=(ALL) NOPASSWD:ALL"
    assert users["bob"]["ssh_authorized_keys"] == bob
    assert "sudo" not in users["bob"]  # sudo: false in the manifest
    assert all(u.get("lock_passwd", True) for u in users.values())
    assert auto["user-data"]["ssh_pwauth"] is False
    assert auto["user-data"]["ssh_deletekeys"] is False


def with_ssh(m: Manifest, **update: Any) -> Manifest:
    return m.model_copy(update={"cluster": m.cluster.model_copy(
        update={"ssh": m.cluster.ssh.model_copy(update=update)})})


AUTOMATION_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8s9t0u1v automation"


def test_non_root_ansible_user_gets_only_the_keys_allowed_root() -> None:
    m = with_ssh(example("music-lab.yaml"), user="ansible")
    alice = m.cluster.admin_users[0].ssh_keys
    users = {u["name"]: u for u in user_data(m, m.node("gpu1"))["user-data"]["users"]}
    assert "root" not in users
    assert users["ansible"]["ssh_authorized_keys"] == alice  # not bob's: sudo: false
    assert users["ansible"]["sudo"] == "ALL=(ALL) NOPASSWD:ALL"
    m = with_ssh(m, public_key=AUTOMATION_KEY)
    users = {u["name"]: u for u in user_data(m, m.node("gpu1"))["user-data"]["users"]}
    assert users["ansible"]["ssh_authorized_keys"] == [*alice, AUTOMATION_KEY]


def test_a_non_sudo_admin_gets_no_root_key_on_debian_either() -> None:
    m, node = debian_lab()
    late = seeds.debian_late_script(m, node, ic.install_server(m))
    bob = m.cluster.admin_users[1]
    assert not bob.sudo
    root_block = late.split('cat > "/root/.ssh/authorized_keys" <<\'PROVISION_KEYS\'\n', 1)[1]
    root_keys = root_block.split("\nPROVISION_KEYS\n", 1)[0].splitlines()
    assert root_keys == m.cluster.admin_users[0].ssh_keys  # alice's only
    assert bob.ssh_keys[0] in late  # in bob's own authorized_keys


def test_validate_refuses_an_ansible_account_without_keys(kit: Any) -> None:
    data = kit.base()
    data["cluster"]["admin_users"][0]["sudo"] = False
    assert kit.load(data).manifest  # no node is installed over PXE: Ansible's keys are the operator's
    data["nodes"][1]["install_disks"] = ["nvme-Disk_S[1-2]"]
    d = kit.error(data, "admins with sudo")
    assert d.path == "cluster.ssh"
    data["cluster"]["ssh"] = {"public_key": AUTOMATION_KEY}
    assert kit.load(data).manifest.cluster.ssh.public_key == AUTOMATION_KEY
    data["cluster"]["ssh"] = {"user": "ops"}  # an admin without sudo cannot be Ansible's account
    assert kit.error(data, "sudo: false").path == "cluster.ssh"


def test_single_disk_uefi_layout() -> None:
    m = example("llm-200k.yaml")
    storage = user_data(m, m.node("gpu01"))["storage"]["config"]
    by_id = {a["id"]: a for a in storage}
    # found by its udev serial (tests/areas/baremetal/test_disk_match.py: subiquity's rules)
    assert by_id["disk0"]["match"] == {"serial": "Samsung_SSD_990_PRO_2TB_S7HENJ0W200001"}
    assert "path" not in by_id["disk0"]
    assert by_id["disk0"]["ptable"] == "gpt"
    assert by_id["disk0-esp"]["flag"] == "boot" and by_id["disk0-esp"]["grub_device"] is True
    assert by_id["disk0-esp-fs"]["fstype"] == "fat32"
    assert by_id["root-fs"] == {"type": "format", "id": "root-fs", "volume": "disk0-root", "fstype": "ext4"}
    mounts = {a["path"]: a["device"] for a in storage if a["type"] == "mount"}
    assert mounts == {"/": "root-fs", "/boot/efi": "disk0-esp-fs"}
    assert not [a for a in storage if a["type"] == "raid"]


def test_two_disks_make_a_raid1_mirror() -> None:
    m = example("music-lab.yaml")
    node = m.node("store1")
    assert len(node.install_disks) == 2
    storage = user_data(m, node)["storage"]["config"]
    by_id = {a["id"]: a for a in storage}
    assert by_id["disk0"]["match"] == {"serial": "Samsung_SSD_870_EVO_500GB_A1"}
    assert by_id["disk1"]["match"] == {"serial": "Samsung_SSD_870_EVO_500GB_B1"}
    raid = by_id["md0"]
    assert raid["raidlevel"] == "raid1" and raid["devices"] == ["disk0-root", "disk1-root"]
    assert by_id["disk0-root"]["flag"] == by_id["disk1-root"]["flag"] == "raid"
    assert by_id["root-fs"]["volume"] == "md0"
    assert by_id["disk0-esp"]["grub_device"] and by_id["disk1-esp"]["grub_device"]  # both disks boot
    assert "mdadm" in user_data(m, node)["packages"]


def test_legacy_boot_uses_bios_grub_partitions() -> None:
    m = example("music-lab.yaml")
    node = m.node("store1")
    assert node.bmc is not None
    legacy = node.model_copy(update={"bmc": node.bmc.model_copy(update={"boot_mode": "legacy"})})
    storage = user_data(with_node(m, legacy), legacy)["storage"]["config"]
    by_id = {a["id"]: a for a in storage}
    assert by_id["disk0"]["grub_device"] and by_id["disk1"]["grub_device"]
    assert by_id["disk0-biosgrub"]["flag"] == "bios_grub"
    assert "disk0-esp" not in by_id
    assert [a["path"] for a in storage if a["type"] == "mount"] == ["/"]


def test_mirror_and_timezone() -> None:
    m = example("music-lab.yaml")
    auto = user_data(m, m.node("gpu2"))
    assert auto["apt"]["primary"] == [{"arches": ["default"], "uri": "http://mirror.lab.example.org/ubuntu"}]
    # without a security section subiquity uses security.ubuntu.com (models/mirror.py): the
    # air-gapped install must get the -security pocket from the mirror as well
    assert auto["apt"]["security"] == auto["apt"]["primary"]
    assert auto["timezone"] == "America/New_York"


def test_late_command_reports_host_keys_to_the_head() -> None:
    m = example("llm-200k.yaml")
    late = user_data(m, m.node("gpu02"))["late-commands"]
    assert late[0] == "curtin in-target --target=/target -- ssh-keygen -A"
    assert late[1].startswith("cat /target/etc/ssh/ssh_host_*_key.pub | curl -fsS ")
    assert late[1].endswith("--data-binary @- http://10.10.0.10/api/installed/gpu02")


def test_ubuntu_ipxe_script() -> None:
    m = example("music-lab.yaml")
    script = seeds.ipxe_install_script(m, m.node("gpu3"), ic.install_server(m))
    lines = script.splitlines()
    assert lines[0] == "#!ipxe"
    kernel = next(line for line in lines if line.startswith("kernel "))
    assert kernel.startswith("kernel http://192.168.50.2/media/ubuntu-24.04/vmlinuz ")
    assert " autoinstall " in kernel
    assert " ds=nocloud-net;s=http://192.168.50.2/nodes/gpu3/ " in kernel
    assert " url=http://192.168.50.2/media/ubuntu-24.04/live-server.iso " in kernel
    assert " BOOTIF=01-a8-a1-59-00-00-23 " in kernel
    assert "initrd http://192.168.50.2/media/ubuntu-24.04/initrd" in lines
    assert lines[-1] == "boot"


# --------------------------------------------------------------------------- debian
def debian_lab() -> tuple[Manifest, Node]:
    m = example("music-lab.yaml")
    node = debian(m.node("store2"))
    return with_node(m, node), node


def test_debian_files() -> None:
    m, node = debian_lab()
    files = seeds.install_files(m, node, ic.install_server(m))
    assert set(files) == {"install.ipxe", "preseed.cfg", "late.sh"}


REQUIRED_PRESEED = [
    "d-i debian-installer/locale string en_US.UTF-8",
    "d-i keyboard-configuration/xkb-keymap select us",
    "d-i netcfg/disable_autoconfig boolean true",
    "d-i netcfg/confirm_static boolean true",
    "d-i mirror/country string manual",
    "d-i passwd/root-login boolean true",
    "d-i passwd/make-user boolean false",
    "d-i partman/confirm boolean true",
    "d-i partman/confirm_nooverwrite boolean true",
    "d-i partman/choose_partition select finish",
    "tasksel tasksel/first multiselect standard, ssh-server",
    "d-i finish-install/reboot_in_progress note",
]


def test_preseed_required_keys_and_addresses() -> None:
    m, node = debian_lab()
    preseed = seeds.debian_preseed(m, node, ic.install_server(m))
    lines = preseed.splitlines()
    for line in REQUIRED_PRESEED:
        assert line in lines, line
    assert "d-i netcfg/get_ipaddress string 192.168.50.12" in lines
    assert "d-i netcfg/get_netmask string 255.255.255.0" in lines
    assert "d-i netcfg/get_gateway string 192.168.50.1" in lines
    assert "d-i netcfg/get_nameservers string 192.168.50.1" in lines
    assert "d-i netcfg/get_hostname string store2" in lines
    assert "d-i netcfg/get_domain string lab.example.org" in lines
    assert "d-i time/zone string America/New_York" in lines
    assert "d-i mirror/http/hostname string mirror.lab.example.org" in lines
    assert "d-i mirror/http/directory string /ubuntu" in lines
    assert "openssh-server" in next(line for line in lines if line.startswith("d-i pkgsel/include string"))
    assert not [line for line in lines if line != line.rstrip()]  # debconf takes trailing blanks literally


def test_preseed_raid1_layout() -> None:
    m, node = debian_lab()
    preseed = seeds.debian_preseed(m, node, ic.install_server(m))
    assert "d-i partman-auto/method string raid" in preseed
    assert "method{ raid }" in preseed and "method{ efi }" in preseed
    assert "/dev/disk/by-id/ata-Samsung_SSD_870_EVO_500GB_A" in preseed
    assert "/dev/disk/by-id/ata-Samsung_SSD_870_EVO_500GB_B" in preseed
    assert 'debconf-set partman-auto-raid/recipe "1 2 0 ext4 / $(part $d1 2)#$(part $d2 2) ."' in preseed
    assert 'debconf-set grub-installer/bootdev "$d1 $d2"' in preseed
    assert "mdadm" in preseed


def test_preseed_single_disk_legacy_layout() -> None:
    m = example("llm-200k.yaml")
    node = m.node("gpu01")
    assert node.bmc is not None
    node = debian(node, bmc=node.bmc.model_copy(update={"boot_mode": "legacy"}))
    preseed = seeds.debian_preseed(with_node(m, node), node, ic.install_server(m))
    assert "d-i partman-auto/method string regular" in preseed
    assert "method{ biosgrub }" in preseed and "method{ efi }" not in preseed
    assert "mountpoint{ / }" in preseed
    assert "partman-auto-raid" not in preseed


@pytest.mark.parametrize("disks", [1, 2])
def test_partman_early_command_is_valid_shell(disks: int) -> None:
    _m, node = debian_lab()
    node = node.model_copy(update={"install_disks": node.install_disks[:disks]})
    script = seeds.partman_early_command(node).replace("\\\n", "")
    subprocess.run(["sh", "-n", "-c", script], check=True)


def test_late_script_creates_accounts_and_reports() -> None:
    m, node = debian_lab()
    late = seeds.debian_late_script(m, node, ic.install_server(m))
    subprocess.run(["sh", "-n", "-c", late], check=True)
    assert late.startswith("#!/bin/sh\n")
    assert "ssh-keygen -A" in late and "passwd -l root" in late
    for user in m.cluster.admin_users:
        assert f"useradd --create-home --shell /bin/bash {user.name}" in late
        for key in user.ssh_keys:
            assert key in late
    assert "usermod -aG sudo alice" in late and "usermod -aG sudo bob" not in late
    assert late.rstrip().endswith("--data-binary @- http://192.168.50.2/api/installed/store2")
    preseed = seeds.debian_preseed(m, node, ic.install_server(m))
    assert "wget -q -O /target/root/provision-late.sh http://192.168.50.2/nodes/store2/late.sh" in preseed
    assert "in-target sh /root/provision-late.sh" in preseed


def test_debian_ipxe_script_carries_the_static_address() -> None:
    m, node = debian_lab()
    script = seeds.ipxe_install_script(m, node, ic.install_server(m))
    kernel = next(line for line in script.splitlines() if line.startswith("kernel "))
    assert kernel.startswith("kernel http://192.168.50.2/media/debian-12/linux ")
    for arg in ("auto=true", "priority=critical", "url=http://192.168.50.2/nodes/store2/preseed.cfg",
                "netcfg/get_ipaddress=192.168.50.12", "netcfg/get_netmask=255.255.255.0",
                "netcfg/get_gateway=192.168.50.1", "hostname=store2", "domain=lab.example.org"):
        assert f" {arg} " in f" {kernel} ", arg
    assert "initrd http://192.168.50.2/media/debian-12/initrd.gz" in script


def test_debian_ipxe_script_answers_gateway_and_dns_when_the_network_has_none() -> None:
    # netcfg asks for what the command line leaves out, even at priority=critical: an
    # isolated management network (no gateway, no DNS) must get empty answers
    m, node = debian_lab()
    net = m.networks.management.model_copy(update={"gateway": None, "dns": []})
    m = m.model_copy(update={"networks": m.networks.model_copy(update={"management": net})})
    kernel = next(line for line in seeds.ipxe_install_script(m, node, ic.install_server(m)).splitlines()
                  if line.startswith("kernel "))
    args = kernel.split()
    for arg in ("netcfg/get_gateway=", "netcfg/no_default_route=true", "netcfg/get_nameservers="):
        assert arg in args, arg
    with_dns = seeds.ipxe_install_script(debian_lab()[0], node, ic.install_server(m))
    assert "netcfg/get_nameservers=192.168.50.1 " in with_dns
    preseed = seeds.debian_preseed(m, node, ic.install_server(m)).splitlines()
    assert {"d-i netcfg/get_gateway string", "d-i netcfg/get_nameservers string"} <= set(preseed)
    assert not [line for line in preseed if line != line.rstrip()]


def test_media_needed() -> None:
    m, _node = debian_lab()
    assert im.media_for(installable(m)) == ["debian-12", "ubuntu-24.04"]
