"""provisioner.areas.baremetal.deploy: the image deploy plan (disks, RAID1, refusals, identity)."""

from __future__ import annotations

import configparser
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.baremetal import deploy
from provisioner.areas.baremetal.decide import install_server
from provisioner.manifest.model import Manifest
from provisioner.plan import compute
from provisioner.state import State

SHA = "a" * 64
IMAGES = {os_name: deploy.ImageRef(f"http://10.0.0.10/images/{os_name}.tar.gz", SHA)
          for os_name in ("debian-12", "ubuntu-22.04", "ubuntu-24.04")}


def debian_base(kit: Any) -> dict[str, Any]:
    """The test manifest with its compute nodes on Debian 12."""
    return kit.on_os(kit.base(), "debian-12", (1,))  # type: ignore[no-any-return]


def pxe_manifest(kit: Any, *, disks: list[str], os_name: str = "debian-12", **node: Any) -> Manifest:
    data = kit.on_os(kit.base(), os_name, (1,))
    data["nodes"][1].update(install="pxe", install_disks=disks, **node)
    return kit.load(data).manifest  # type: ignore[no-any-return]


def plan_of(m: Manifest, name: str = "node01", *, erase: bool = True,
            images: dict[str, deploy.ImageRef] | None = None) -> deploy.DeployPlan:
    return deploy.deploy_plan(m, m.node(name), IMAGES if images is None else images, install_server(m),
                              erase_allowed=erase)


def files(plan: deploy.DeployPlan) -> dict[str, deploy.DeployFile]:
    return {f.path: f for f in plan.files}


def test_one_disk_is_named_by_id_without_raid(kit: Any) -> None:
    m = pxe_manifest(kit, disks=["nvme-DISK_A_[1-2]"])
    p1, p2 = plan_of(m, "node01"), plan_of(m, "node02")
    assert p1.disks == ("/dev/disk/by-id/nvme-DISK_A_1",) and not p1.raid1
    assert p2.disks == ("/dev/disk/by-id/nvme-DISK_A_2",)
    assert p1.image == IMAGES["debian-12"] and p1.boot_mode == "uefi"
    assert p1.report_url == "http://10.0.0.10/api/installed/node01"


def test_two_disks_make_a_raid1_in_manifest_order(kit: Any) -> None:
    m = pxe_manifest(kit, disks=["ata-X_[1-2]", "ata-Y_[1-2]"])
    p = plan_of(m, "node02")
    assert p.raid1 and p.disks == ("/dev/disk/by-id/ata-X_2", "/dev/disk/by-id/ata-Y_2")


def test_legacy_boot_mode_comes_from_the_bmc(kit: Any) -> None:
    data = debian_base(kit)
    data["nodes"][1].update(install="pxe", install_disks=["ata-D_[1-2]"])
    data["nodes"][1]["bmc"]["boot_mode"] = "legacy"
    assert plan_of(kit.load(data).manifest).boot_mode == "legacy"


def test_debian_gets_systemd_networkd_for_its_management_address(kit: Any) -> None:
    p = plan_of(pxe_manifest(kit, disks=["ata-D_[1-2]"]))
    f = files(p)
    assert f["/etc/hostname"].content == "node01\n"
    assert "10.0.0.21\tnode01.test.internal\tnode01" in f["/etc/hosts"].content
    net = configparser.ConfigParser(strict=False)
    net.read_string(f["/etc/systemd/network/10-provision-mgmt.network"].content)
    assert net["Match"]["MACAddress"] == "52:54:00:00:00:21"
    # configured once udev renamed it, never under the name the initramfs gave it (udev
    # cannot rename an interface that is up)
    assert net["Match"]["Name"] == "eno1"
    assert net["Network"]["Address"] == "10.0.0.21/24" and net["Network"]["Gateway"] == "10.0.0.1"
    link = configparser.ConfigParser()
    link.read_string(f["/etc/systemd/network/10-provision-mgmt.link"].content)
    assert link["Link"]["Name"] == "eno1"
    assert not any(path.startswith("/etc/netplan") for path in f)


def test_ubuntu_gets_netplan_readable_by_root_only(kit: Any) -> None:
    p = plan_of(pxe_manifest(kit, disks=["ata-D_[1-2]"], os_name="ubuntu-24.04"), "node02")
    f = files(p)["/etc/netplan/50-provision.yaml"]
    assert f.mode == "0600"
    eth = yaml.safe_load(f.content)["network"]["ethernets"]["eno1"]
    assert eth["match"]["macaddress"] == "52:54:00:00:00:22" and eth["addresses"] == ["10.0.0.22/24"]
    assert not any("systemd/network" in path for path in files(p))


def test_root_gets_only_the_keys_allowed_root(kit: Any) -> None:
    data = debian_base(kit)
    data["nodes"][1].update(install="pxe", install_disks=["ata-D_[1-2]"])
    nosudo = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB guest"
    data["cluster"]["admin_users"].append({"name": "guest", "ssh_keys": [nosudo], "sudo": False})
    p = plan_of(kit.load(data).manifest)
    users = {u.name: u for u in p.users}
    assert nosudo in users["guest"].keys and not users["guest"].sudo
    assert nosudo not in users["root"].keys and kit.ssh_key in users["root"].keys


def test_the_plan_is_plain_json(kit: Any) -> None:
    p = plan_of(pxe_manifest(kit, disks=["ata-D_[1-2]"]), erase=False)
    data = p.to_json()
    assert data["erase_allowed"] is False and data["image"]["sha256"] == SHA
    assert data["files"][0] == {"path": "/etc/hostname", "mode": "0644", "content": "node01\n"}


# --------------------------------------------------------------------------- refusals
def test_a_zfs_or_scratch_disk_is_refused_as_install_disk(kit: Any) -> None:
    data = debian_base(kit)
    data["nodes"][1].update(install="pxe", install_disks=["ata-POOL_1"])
    data["nodes"][1]["hardware"]["disks"] = [{"id": "ata-POOL", "use": "zfs"}]
    text = kit.text(data)
    diag = kit.error(text, "is the manifest's zfs disk ata-POOL")
    assert diag.line == kit.line_of(text, "ata-POOL_1")
    # the installer method is not this check's business (its installer asks nothing about it)
    data["nodes"][1]["install_method"] = "installer"
    m = kit.load(data).manifest
    with pytest.raises(deploy.DeployRefused, match="a deploy would erase it"):
        plan_of(m)


def test_the_os_disk_of_the_hardware_list_is_fine(kit: Any) -> None:
    data = debian_base(kit)
    data["nodes"][1].update(install="pxe", install_disks=["ata-OS_1"])
    data["nodes"][1]["hardware"]["disks"] = [{"id": "ata-OS", "use": "os"}, {"id": "ata-SCR", "use": "scratch"}]
    assert plan_of(kit.load(data).manifest).disks == ("/dev/disk/by-id/ata-OS_1",)


def test_no_image_for_the_os_is_refused_with_the_way_out(kit: Any) -> None:
    m = pxe_manifest(kit, disks=["ata-D_[1-2]"])
    with pytest.raises(deploy.DeployRefused, match=r"no debian-12 image: run `provision image build"):
        plan_of(m, images={})
    assert "REFUSED" in deploy.destructive_summary(m, m.node("node01"), {})


def test_the_head_and_nodes_without_disks_are_refused(kit: Any) -> None:
    m = pxe_manifest(kit, disks=["ata-D_[1-2]"])
    with pytest.raises(deploy.DeployRefused, match="head node"):
        plan_of(m, "head01")
    bare = m.node("node01").model_copy(update={"install_disks": []})
    assert any("no install_disks" in r for r in deploy.deploy_refusals(m, bare, IMAGES))
    twice = m.node("node01").model_copy(update={"install_disks": ["ata-A", "ata-A"]})
    assert any("same disk twice" in r for r in deploy.deploy_refusals(m, twice, IMAGES))


def test_method_defaults_to_image_and_a_node_overrides_the_cluster(kit: Any) -> None:
    data = kit.base()
    m = kit.load(data).manifest
    assert deploy.method(m, m.node("node01")) == "image"
    data["cluster"]["install_method"] = "installer"
    data["nodes"][1]["install_method"] = "image"
    m = kit.load(data).manifest
    assert deploy.method(m, m.node("node01")) == "image" and deploy.method(m, m.head) == "installer"


def test_named_images_are_verified_urls(kit: Any) -> None:
    data = kit.base()
    data["cluster"]["images"] = {"debian-12": {"url": "http://10.0.0.10/d.tar.xz", "sha256": "sha256:" + "B" * 64}}
    m = kit.load(data).manifest
    assert deploy.named_images(m) == {"debian-12": deploy.ImageRef("http://10.0.0.10/d.tar.xz", "b" * 64)}
    data["cluster"]["images"] = {"debian-12": {"url": "http://10.0.0.10/d.qcow2", "sha256": SHA}}
    kit.error(data, "is not an http(s):// or file:// URL of a .tar.gz")
    data["cluster"]["images"] = {"debian-12": {"url": "http://10.0.0.10/d.tar.gz", "sha256": "abc"}}
    kit.error(data, "is not a SHA-256")


@pytest.mark.parametrize(("named", "published"), [
    (None, "debian-12.tar.zst"),  # built
    ("http://mirror.example.org/images/noble-server-cloudimg-amd64-root.tar.xz", "debian-12.tar.xz"),
    ("file:///srv/images/site.tar.gz", "debian-12.tar.gz"),
])
def test_the_deploy_plan_downloads_the_image_under_its_own_compression(kit: Any, named: str | None,
                                                                       published: str) -> None:
    data = kit.on_os(kit.base(), "debian-12", (1,))
    data["nodes"][1].update(install="pxe", install_disks=["ata-D_1"])
    if named:
        data["cluster"]["images"] = {"debian-12": {"url": named, "sha256": SHA}}
    m = kit.load(data).manifest
    assert deploy.image_file(m, "debian-12") == published
    plan = json.loads(deploy.deploy_files(m, m.node("node01"), install_server(m))[deploy.PLAN_FILE])
    assert plan["image"]["url"] == f"{install_server(m).base_url}/images/{published}"


def test_plan_shows_the_installer_method_apart(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1].update(install="pxe", install_disks=["ata-D_[1-2]", "ata-E_[1-2]"], install_method="installer")
    m = kit.load(data).manifest
    node01 = next(n for n in compute(m, State(), []).nodes if n.name == "node01")
    assert node01.install == "PXE install: wipes ata-D_1, ata-E_1 (the ubuntu-24.04 installer)"
    data["nodes"][1]["install_method"] = "image"
    node01 = next(n for n in compute(kit.load(data).manifest, State(), []).nodes if n.name == "node01")
    assert node01.install == (
        "PXE install: wipes RAID1 over ata-D_1 + ata-E_1, writes the ubuntu-24.04 image (GPT: ESP + root)")


# --------------------------------------------------------------------------- a bonded management link
def mgmt_bond_manifest(kit: Any, os_name: str, members: list[str], mode: str = "802.3ad") -> Manifest:
    """node01 alone (no range), its management link bond0 over ``members``."""
    data = kit.on_os(kit.base(), os_name, (1,))
    node = data["nodes"][1]
    node.update(name="node01", install="pxe", install_disks=["ata-D_1"])
    node["interfaces"]["management"]["interface"] = "bond0"
    node["bonds"] = {"bond0": {"mode": mode, "members": members}}
    return kit.load(data).manifest  # type: ignore[no-any-return]


def networkd_units(p: deploy.DeployPlan) -> dict[str, str]:
    return {Path(path).name: f.content for path, f in files(p).items() if "systemd/network" in path}


def test_debian_comes_up_on_its_management_bond(kit: Any) -> None:
    m = mgmt_bond_manifest(kit, "debian-12", ["52:54:00:00:00:21", "eno2"])
    units = networkd_units(plan_of(m))
    assert sorted(units) == ["10-provision-mgmt-bond0.netdev", "10-provision-mgmt-m0.network",
                             "10-provision-mgmt-m1.network", "10-provision-mgmt.network"]  # no .link: no rename
    parsed = {}
    for name, text in units.items():
        parsed[name] = configparser.ConfigParser(strict=False)
        parsed[name].read_string(text)
    netdev, bond = parsed["10-provision-mgmt-bond0.netdev"], parsed["10-provision-mgmt.network"]
    assert (netdev["NetDev"]["Kind"], netdev["NetDev"]["Name"], netdev["Bond"]["Mode"]) == ("bond", "bond0", "802.3ad")
    assert dict(bond["Match"]) == {"name": "bond0"}  # never by MAC: the bond borrows a member's
    assert bond["Network"]["Address"] == "10.0.0.21/24" and bond["Network"]["Gateway"] == "10.0.0.1"
    assert "RequiredForOnline" not in bond["Link"]  # boot waits for the management bond
    m0, m1 = parsed["10-provision-mgmt-m0.network"], parsed["10-provision-mgmt-m1.network"]
    assert m0["Match"]["PermanentMACAddress"] == "52:54:00:00:00:21" and m1["Match"]["Name"] == "eno2"
    assert m0["Network"]["Bond"] == m1["Network"]["Bond"] == "bond0"
    assert m0["Link"]["MTUBytes"] == bond["Link"]["MTUBytes"] == netdev["NetDev"]["MTUBytes"] == "1500"


def test_systemd_networkd_accepts_the_management_bond_units(kit: Any, networkd: Callable[..., list[str]]) -> None:
    m = mgmt_bond_manifest(kit, "debian-12", ["52:54:00:00:00:21", "eno2"], mode="active-backup")
    units = networkd_units(plan_of(m))
    assert networkd(units) == []
    # the check sees a unit networkd would not take as written
    units["10-provision-mgmt-bond0.netdev"] += "MIIMonitorSec=often\n"
    assert any("often" in line for line in networkd(units))


def test_ubuntu_comes_up_on_its_management_bond(kit: Any) -> None:
    m = mgmt_bond_manifest(kit, "ubuntu-24.04", ["52:54:00:00:00:21", "52:54:00:00:00:99"], mode="active-backup")
    net = yaml.safe_load(files(plan_of(m))["/etc/netplan/50-provision.yaml"].content)["network"]
    assert net["ethernets"] == {
        f"bond0-m{i}": {"match": {"macaddress": mac}, "dhcp4": False, "dhcp6": False, "accept-ra": False,
                        "link-local": [], "mtu": 1500}
        for i, mac in enumerate(["52:54:00:00:00:21", "52:54:00:00:00:99"])}
    bond = net["bonds"]["bond0"]
    assert bond["interfaces"] == ["bond0-m0", "bond0-m1"] and bond["addresses"] == ["10.0.0.21/24"]
    assert bond["routes"] == [{"to": "default", "via": "10.0.0.1"}] and bond["mtu"] == 1500
    assert bond["parameters"] == {"mode": "active-backup", "mii-monitor-interval": 100}
    assert "set-name" not in str(net)  # no member is renamed to the bond's name


def test_netplan_generates_the_management_bond_and_networkd_takes_it(kit: Any, netplan: Callable[..., dict[str, str]],
                                                                     networkd: Callable[..., list[str]]) -> None:
    m = mgmt_bond_manifest(kit, "ubuntu-24.04", ["52:54:00:00:00:21", "eno2"])
    units = netplan(yaml.safe_load(files(plan_of(m))["/etc/netplan/50-provision.yaml"].content))
    bond = units["10-netplan-bond0.network"]
    assert "Address=10.0.0.21/24" in bond and "Gateway=10.0.0.1" in bond
    assert "Bond=bond0" in units["10-netplan-bond0-m0.network"] and "Bond=bond0" in units["10-netplan-eno2.network"]
    assert "Mode=802.3ad" in units["10-netplan-bond0.netdev"]
    assert networkd(units) == []
    # the check sees a file netplan refuses
    with pytest.raises(AssertionError, match="bond0"):
        netplan({"network": {"version": 2, "bonds": {"bond0": {"interfaces": ["nowhere"]}}}})
