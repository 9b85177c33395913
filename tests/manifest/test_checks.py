"""provisioner.manifest.checks: whole-manifest rules, each error on the offending line."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.errors import Diagnostic
from provisioner.manifest import SelectorError, select_nodes


def extra_node(name: str, ip: str, **more: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "name": name,
        "roles": ["compute"],
        "interfaces": {"management": {"ip": ip}},
        "hardware": {"cpu": {"cores_per_socket": 4}, "memory_gb": 32},
    }
    node.update(more)
    return node


def only(kit: Any, data: dict[str, Any], contains: str) -> tuple[Diagnostic, str]:
    """The single diagnostic containing ``contains`` and the text it was loaded from."""
    text = kit.dump(data)
    return kit.error(text, contains), text


def assert_at(kit: Any, d: Diagnostic, text: str, needle: str, nth: int = 1) -> None:
    assert (d.line, d.col) == kit.pos_of(text, needle, nth), d.format()
    assert d.format().startswith(f"m.yaml:{d.line}:{d.col}: ")
    assert d.severity == "error"


# --------------------------------------------------------------------------- uniqueness
def test_duplicate_host_name(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append(extra_node("head01", "10.0.0.50"))
    d, text = only(kit, data, "duplicate host name")
    assert d.message == "duplicate host name 'head01'"
    assert d.path == "nodes[2].name"
    assert_at(kit, d, text, "name: head01", nth=2)


def test_duplicate_host_name_from_overlapping_ranges(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append(extra_node("node[02-03]", "10.0.0.60"))
    d, text = only(kit, data, "duplicate host name")
    assert d.message == "duplicate host name 'node02'"
    assert_at(kit, d, text, "name: node[02-03]")


def test_duplicate_ip(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append(extra_node("extra", "10.0.0.22"))
    d, text = only(kit, data, "IP 10.0.0.22")
    assert d.message == "extra: IP 10.0.0.22 is already used by node02 (management)"
    assert d.path == "nodes[2].interfaces.management.ip"
    assert_at(kit, d, text, "ip: 10.0.0.22")


def test_duplicate_ip_from_overlapping_ranges(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append(extra_node("extra[1-2]", "10.0.0.20"))  # extra2 = .21 = node01
    d, text = only(kit, data, "already used")
    assert d.message == "extra2: IP 10.0.0.21 is already used by node01 (management)"
    assert_at(kit, d, text, "ip: 10.0.0.20")


def test_duplicate_mac_from_a_range(kit: Any) -> None:
    data = kit.base()
    node = extra_node("extra", "10.0.0.50")
    node["interfaces"]["management"]["mac"] = "52:54:00:00:00:22"
    data["nodes"].append(node)
    d, text = only(kit, data, "MAC")
    assert d.message == "extra: MAC 52:54:00:00:00:22 is already used by node02 (management)"
    assert_at(kit, d, text, "mac: '52:54:00:00:00:22'")


def test_mac_comparison_ignores_case_and_separators(kit: Any) -> None:
    data = kit.base()
    node = extra_node("extra", "10.0.0.50")
    node["interfaces"]["management"]["mac"] = "52-54-00-00-00-10"
    data["nodes"].append(node)
    d, _ = only(kit, data, "MAC")
    assert "already used by head01" in d.message


def test_duplicate_bmc_address(kit: Any) -> None:
    data = kit.base()
    bmc = {"type": "ipmi", "address": "10.0.1.22", "user": "u", "password_env": "PW"}
    data["nodes"].append(extra_node("extra", "10.0.0.50", bmc=bmc))
    d, text = only(kit, data, "BMC address")
    assert d.message == "extra: BMC address 10.0.1.22 is already used by node02"
    assert d.path == "nodes[2].bmc.address"
    assert_at(kit, d, text, "address: 10.0.1.22")


@pytest.mark.parametrize("index", [0, 1])
def test_bmc_address_equal_to_a_node_ip(kit: Any, index: int) -> None:
    """Found whether the node owning the IP comes before or after the BMC's node."""
    data = kit.base()
    del data["networks"]["bmc"]
    ip = ["10.0.0.22", "10.0.0.10"][index]  # node02 (listed after head01), head01 (before node01)
    data["nodes"][index]["bmc"]["address"] = ip
    d, text = only(kit, data, "also a node IP")
    owner = ["node02", "head01"][index]
    bmc_node = ["head01", "node01"][index]
    assert d.message == f"{bmc_node}: BMC address {ip} is also a node IP ({owner} (management))"
    assert_at(kit, d, text, f"address: {ip}")


def test_bmc_range_overlapping_another_bmc(kit: Any) -> None:
    data = kit.base()
    bmc = {"type": "ipmi", "address": "10.0.1.20", "user": "u", "password_env": "PW"}
    data["nodes"].append(extra_node("extra[1-2]", "10.0.0.50", bmc=bmc))
    d, text = only(kit, data, "BMC address")
    assert d.message == "extra2: BMC address 10.0.1.21 is already used by node01"
    assert_at(kit, d, text, "address: 10.0.1.20")


@pytest.mark.parametrize("name", ["all", "localhost", "compute", "gpu", "head", "docker", "zfs"])
def test_reserved_names(kit: Any, name: str) -> None:
    data = kit.base()
    data["nodes"].append(extra_node(name, "10.0.0.50"))
    d, text = only(kit, data, "reserved")
    assert d.message.startswith(f"{name!r} is reserved")
    lines = text.splitlines()
    assert lines[d.line - 1] == f"- name: {name}"
    assert d.col == 3


# --------------------------------------------------------------------------- addresses
def test_ip_outside_its_network(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["interfaces"]["data"]["ip"] = "10.0.3.10"
    d, text = only(kit, data, "outside")
    assert d.message == "head01: 10.0.3.10 is outside 10.0.2.0/24"
    assert d.path == "nodes[0].interfaces.data.ip"
    assert_at(kit, d, text, "ip: 10.0.3.10")


@pytest.mark.parametrize(
    ("ip", "what"),
    [("10.0.0.0", "network or broadcast"), ("10.0.0.255", "network or broadcast"), ("10.0.0.1", "gateway")],
)
def test_network_broadcast_and_gateway_addresses(kit: Any, ip: str, what: str) -> None:
    data = kit.base()
    data["nodes"][0]["interfaces"]["management"]["ip"] = ip
    d, text = only(kit, data, what)
    assert d.message.startswith(f"head01: {ip} is the {what}")
    assert_at(kit, d, text, f"ip: {ip}")


def test_range_running_into_the_broadcast_address(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["interfaces"]["management"]["ip"] = "10.0.0.254"
    data["nodes"][1]["interfaces"]["management"]["mac"] = "52:54:00:00:00:fe"
    d, text = only(kit, data, "broadcast")
    assert d.message == "node02: 10.0.0.255 is the network or broadcast address of 10.0.0.0/24"
    assert_at(kit, d, text, "ip: 10.0.0.254")


def test_point_to_point_networks_allow_both_addresses(kit: Any) -> None:
    data = kit.base()
    data["networks"]["data"]["cidr"] = "10.0.2.0/31"
    data["nodes"][0]["interfaces"]["data"]["ip"] = "10.0.2.0"
    del data["nodes"][1]["interfaces"]["data"]
    data["nodes"][1]["name"] = "node01"
    kit.load(data)


def test_bmc_outside_the_bmc_network(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["bmc"]["address"] = "10.0.9.10"
    d, text = only(kit, data, "BMC")
    assert d.message == "head01: BMC 10.0.9.10 is outside 10.0.1.0/24"
    assert_at(kit, d, text, "address: 10.0.9.10")


def test_undefined_network(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.5.10"}
    d, text = only(kit, data, "not defined")
    assert d.message == "head01: network 'infiniband' is not defined under networks"
    assert d.path == "nodes[0].interfaces.infiniband"
    assert_at(kit, d, text, "infiniband:")


def test_overlapping_networks(kit: Any) -> None:
    data = kit.base()
    data["networks"]["data"]["cidr"] = "10.0.0.0/16"
    diags = kit.errors(data)
    text = kit.dump(data)
    overlap = [d for d in diags if "overlaps" in d.message]
    assert [d.message for d in overlap] == [
        "10.0.0.0/16 overlaps the bmc network 10.0.1.0/24",
        "10.0.0.0/16 overlaps the management network 10.0.0.0/24",
    ]
    for d in overlap:
        assert d.path == "networks.data.cidr"
        assert (d.line, d.col) == kit.pos_of(text, "cidr: 10.0.0.0/16")


# --------------------------------------------------------------------------- roles, disks
def test_no_head(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["roles"] = ["storage"]
    d, text = only(kit, data, "no node has role 'head'")
    assert d.path == "nodes"
    assert_at(kit, d, text, "nodes:")


def test_two_heads(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append(extra_node("head02", "10.0.0.11", roles=["head"]))
    d, text = only(kit, data, "only one head")
    assert d.message == "head02: only one head node is supported (already head01)"
    assert d.path == "nodes[2].roles"
    assert (d.line, d.col) == (kit.line_of(text, "name: head02") + 1, 3)


def test_same_install_disk_twice(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["install_disks"] = ["nvme-A", "nvme-A"]
    d, text = only(kit, data, "install disks")
    assert_at(kit, d, text, "install_disks:")


def test_hardware_disk_listed_twice(kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["hardware"]["disks"].append({"id": "ata-DISK_3"})  # also in ata-DISK_[1-4]
    d, text = only(kit, data, "listed twice")
    assert d.message == "head01: disk 'ata-DISK_3' is listed twice"
    assert_at(kit, d, text, "disks:")


# --------------------------------------------------------------------------- zfs
def zfs_base(kit: Any) -> dict[str, Any]:
    return kit.base(storage=True)  # type: ignore[no-any-return]


def test_mirror_disk_count_not_divisible(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"]["disks"] = ["ata-DISK_[1-3]"]
    d, text = only(kit, data, "do not divide")
    assert d.message == "3 disks do not divide into mirror groups of 2"
    assert d.path == "zfs.pools[0].vdevs.disks"
    assert_at(kit, d, text, "disks:", nth=3)


@pytest.mark.parametrize(("kind", "minimum"), [("raidz1", 3), ("raidz2", 4), ("raidz3", 5), ("mirror", 2)])
def test_width_too_small(kit: Any, kind: str, minimum: int) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"].update(type=kind, width=minimum - 1)
    d, text = only(kit, data, "width of at least")
    assert d.message == f"a {kind} group needs a width of at least {minimum}"
    assert d.path == "zfs.pools[0].vdevs.width"
    assert_at(kit, d, text, f"width: {minimum - 1}")


def test_disk_used_twice_in_one_pool(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["log"] = ["ata-DISK_3"]
    d, text = only(kit, data, "used twice")
    assert d.message == "disk 'ata-DISK_3' is used twice (also in pool 'tank' vdevs)"
    assert d.path == "zfs.pools[0].log"
    assert_at(kit, d, text, "log:")


def test_disk_repeated_inside_a_group(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"]["disks"] = ["ata-DISK_[1-2]", "ata-DISK_2", "ata-DISK_3"]
    d, text = only(kit, data, "used twice")
    assert d.path == "zfs.pools[0].vdevs.disks"
    assert d.message == "disk 'ata-DISK_2' is used twice (also in pool 'tank' vdevs)"
    assert_at(kit, d, text, "disks:", nth=3)


def test_disk_used_by_two_pools_on_one_node(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"]["disks"] = ["ata-DISK_[1-2]"]
    data["zfs"]["pools"].append(
        {"name": "other", "node": "head01", "vdevs": {"type": "mirror", "disks": ["ata-DISK_[2-3]"]}}
    )
    d, text = only(kit, data, "used twice")
    assert d.message == "disk 'ata-DISK_2' is used twice (also in pool 'tank' vdevs)"
    assert d.path == "zfs.pools[1].vdevs.disks"
    assert d.line == kit.line_of(text, "- ata-DISK_[2-3]") - 1


def test_same_disk_names_on_two_nodes_are_fine(kit: Any) -> None:
    loaded = kit.load((kit.examples / "music-lab.yaml").read_text())
    assert [p.node for p in loaded.manifest.zfs.pools] == ["store1", "store2"]


def test_pool_on_unknown_or_non_storage_node(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["node"] = "ghost"
    d, text = only(kit, data, "unknown node")
    assert d.message == "pool 'tank' names unknown node 'ghost'"
    assert_at(kit, d, text, "node: ghost")
    data["zfs"]["pools"][0]["node"] = "node01"
    d, text = only(kit, data, "does not have role 'storage'")
    assert_at(kit, d, text, "node: node01")


def test_pool_defined_twice_on_a_node(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"]["disks"] = ["ata-DISK_[1-2]"]
    data["zfs"]["pools"].append({"name": "tank", "node": "head01", "vdevs": {"disks": ["ata-DISK_[3-4]"]}})
    d, text = only(kit, data, "defined twice")
    assert d.path == "zfs.pools[1].name"
    assert_at(kit, d, text, "name: tank", nth=2)


def test_dataset_listed_twice(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["datasets"].append({"name": "data"})
    d, text = only(kit, data, "listed twice")
    assert d.message == "dataset 'data' is listed twice"
    assert_at(kit, d, text, "datasets:")


def test_raidz_for_training_data_is_a_warning(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["purpose"] = "training-data"
    data["zfs"]["pools"][0]["vdevs"].update(type="raidz1", width=4)
    text = kit.dump(data)
    loaded = kit.load(text)
    (w,) = loaded.warnings
    assert w.severity == "warning"
    assert "holds training data on raidz1" in w.message
    assert (w.line, w.col) == kit.pos_of(text, "type: raidz1")
    assert w.format().startswith(f"m.yaml:{w.line}:{w.col}: warning: zfs.pools[0].vdevs.type: ")


def test_raidz_for_general_purpose_is_quiet(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"].update(type="raidz1", width=4)
    assert kit.load(data).warnings == []


def test_stripe_is_a_warning(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"].update(type="stripe", width=1)
    (w,) = kit.load(data).warnings
    assert "no redundancy" in w.message


def test_single_slog_warning_and_mirrored_slog(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"]["disks"] = ["ata-DISK_[1-2]"]
    data["zfs"]["pools"][0]["log"] = ["ata-DISK_3"]
    (w,) = kit.load(data).warnings
    assert "single SLOG" in w.message
    data["zfs"]["pools"][0]["log"] = ["ata-DISK_3", "ata-DISK_4"]
    assert kit.load(data).warnings == []
    # one entry, two devices: a mirror, as rendered (devices counted after ranges expand)
    data["zfs"]["pools"][0]["log"] = ["ata-DISK_[3-4]"]
    assert kit.load(data).warnings == []


def test_bad_disk_range_in_a_pool(kit: Any) -> None:
    data = zfs_base(kit)
    data["zfs"]["pools"][0]["vdevs"]["disks"] = ["ata-DISK_[4-1]"]
    d, text = only(kit, data, "bad range")
    assert d.path == "zfs.pools[0].vdevs.disks"
    assert_at(kit, d, text, "disks:", nth=3)


# --------------------------------------------------------------------------- nfs, mergerfs
def test_export_on_unknown_node(kit: Any) -> None:
    data = zfs_base(kit)
    exp = data["nfs"]["exports"][0]
    exp["node"] = "ghost"
    diags = kit.errors(data)
    text = kit.dump(data)
    unknown = [d for d in diags if "unknown node" in d.message and d.path.startswith("nfs")]
    assert [d.message for d in unknown] == ["export 'data' names unknown node 'ghost'"]
    assert (unknown[0].line, unknown[0].col) == kit.pos_of(text, "node: ghost")
    assert any(d.message == "export 'data': no pool 'tank' on ghost" for d in diags)


def test_export_dataset_pool_missing(kit: Any) -> None:
    data = zfs_base(kit)
    data["nfs"]["exports"][0]["dataset"] = "pool2/data"
    d, text = only(kit, data, "no pool")
    assert d.message == "export 'data': no pool 'pool2' on head01"
    assert_at(kit, d, text, "dataset: pool2/data")


def test_export_path_instead_of_dataset(kit: Any) -> None:
    data = zfs_base(kit)
    data["nfs"]["exports"][0] = {"name": "data", "node": "head01", "path": "/srv/data", "clients": ["10.0.2.0/24"]}
    m = kit.load(data).manifest
    assert m.nfs.exports[0].path == "/srv/data" and m.nfs.exports[0].dataset is None


def test_export_name_used_twice(kit: Any) -> None:
    data = zfs_base(kit)
    data["nfs"]["exports"].append({"name": "data", "node": "head01", "path": "/srv"})
    d, text = only(kit, data, "used twice")
    assert d.path == "nfs.exports[1].name"
    assert (d.line, d.col) == (kit.line_of(text, "path: /srv") - 2, 5)


@pytest.mark.parametrize(
    ("client", "needle"), [("infiniband", "network 'infiniband' is not defined"), ("nowhere", "neither a network")]
)
def test_export_clients(kit: Any, client: str, needle: str) -> None:
    data = zfs_base(kit)
    data["nfs"]["exports"][0]["clients"] = ["data", client]
    d, text = only(kit, data, needle)
    assert d.path == "nfs.exports[0].clients[1]"
    line, col = kit.pos_of(text, f"- {client}")
    assert (d.line, d.col) == (line, col + 2)  # the list item itself


def test_mount_names_unknown_export(kit: Any) -> None:
    data = zfs_base(kit)
    data["nfs"]["mounts"][0]["export"] = "nope"
    d, text = only(kit, data, "unknown export")
    assert d.message == "mount /data: unknown export 'nope'"
    assert_at(kit, d, text, "export: nope")


@pytest.mark.parametrize(
    ("nodes", "needle"),
    [
        (["ghost"], "unknown node 'ghost'"),
        (["node[01-05]"], "unknown node 'node03' (and 2 more)"),
        (["@login"], "'@login' matches no node"),
        (["node[2-1]"], "bad range"),
    ],
)
def test_mount_with_bad_node_selectors(kit: Any, nodes: list[str], needle: str) -> None:
    data = zfs_base(kit)
    data["nfs"]["mounts"][0]["nodes"] = nodes
    d, text = only(kit, data, needle)
    assert d.path == "nfs.mounts[0].nodes"
    assert d.message.startswith("mount /data: ")
    assert (d.line, d.col) == (kit.line_of(text, "path: /data") + 1, 5)


def test_two_mounts_at_one_path_on_a_node(kit: Any) -> None:
    data = zfs_base(kit)
    data["nfs"]["mounts"].append({"export": "data", "path": "/data", "nodes": ["node02"]})
    d, text = only(kit, data, "mounts two things")
    assert d.message == "node02 mounts two things at /data"
    assert d.path == "nfs.mounts[1].path"
    assert_at(kit, d, text, "path: /data", nth=2)


def test_rdma_mount_needs_an_rdma_fabric(kit: Any) -> None:
    data = zfs_base(kit)
    data["nfs"]["mounts"][0]["proto"] = "rdma"
    d, text = only(kit, data, "rdma")
    assert d.message == "proto rdma needs an infiniband or roce network with rdma: true"
    assert_at(kit, d, text, "proto: rdma")
    data["networks"]["infiniband"] = {"cidr": "10.0.5.0/24", "rdma": False}
    d, text = only(kit, data, "rdma")
    assert_at(kit, d, text, "proto: rdma")
    data["networks"]["infiniband"]["rdma"] = True
    # the fabric exists now, but the nodes are not on it: a deep check names each one
    messages = [d.message for d in kit.errors(data)]
    assert messages and all("has no infiniband interface" in msg for msg in messages)


def test_mergerfs_unknown_nodes_and_branches(kit: Any) -> None:
    data = zfs_base(kit)
    data["mergerfs"][0]["nodes"] = ["node09"]
    d, text = only(kit, data, "unknown node")
    assert d.message == "union /union: unknown node 'node09'"
    assert d.path == "mergerfs[0].nodes"
    assert (d.line, d.col) == (kit.line_of(text, "- /scratch") + 1, 3)
    data = zfs_base(kit)
    data["mergerfs"][0]["branches"] = ["/data", "/union"]
    d, _ = only(kit, data, "itself")
    assert d.path == "mergerfs[0].branches"
    data["mergerfs"][0]["branches"] = ["/data", "/data"]
    d, _ = only(kit, data, "listed twice")
    assert d.path == "mergerfs[0].branches"


# --------------------------------------------------------------------------- slurm
def test_partition_with_non_compute_node(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"][0]["nodes"] = ["@compute", "head01"]
    d, text = only(kit, data, "does not have role 'compute'")
    assert d.message == "partition 'batch': head01 does not have role 'compute'"
    assert d.path == "slurm.partitions[0].nodes"
    assert_at(kit, d, text, "nodes:", nth=2)


def test_two_default_partitions(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"].append({"name": "debug", "nodes": ["node01"], "default": True})
    d, text = only(kit, data, "default: true")
    assert d.path == "slurm.partitions"
    assert_at(kit, d, text, "partitions:")


def test_partition_defined_twice_and_unknown_nodes(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"].append({"name": "batch", "nodes": ["node01"]})
    d, _ = only(kit, data, "defined twice")
    assert d.path == "slurm.partitions[1].name"
    data = kit.base()
    data["slurm"]["partitions"][0]["nodes"] = ["node07"]
    d, _ = only(kit, data, "unknown node")
    assert d.message == "partition 'batch': unknown node 'node07'"


def test_slurm_without_partitions_warns(kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {}
    (w,) = kit.load(data).warnings
    assert w.message == "slurm is enabled but has no partitions"
    assert w.path == "slurm"


def test_disabled_slurm_is_not_checked(kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False, "partitions": [{"name": "x", "nodes": ["ghost"]}]}
    assert kit.load(data).warnings == []


# --------------------------------------------------------------------------- docker
def test_docker_address_pool_collides_with_a_network(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"address_pools": [{"base": "10.0.0.0/16", "size": 24}]}
    diags = kit.errors(data)
    text = kit.dump(data)
    assert [d.message for d in diags] == [
        "10.0.0.0/16 collides with the bmc network 10.0.1.0/24",
        "10.0.0.0/16 collides with the data network 10.0.2.0/24",
        "10.0.0.0/16 collides with the management network 10.0.0.0/24",
    ]
    for d in diags:
        assert d.path == "docker.address_pools[0].base"
        assert (d.line, d.col) == kit.pos_of(text, "base: 10.0.0.0/16")


def test_docker_default_pool_collides_with_a_172_31_network(kit: Any) -> None:
    data = kit.base()
    data["networks"]["data"]["cidr"] = "172.31.4.0/24"
    for node in data["nodes"]:
        node["interfaces"]["data"]["ip"] = node["interfaces"]["data"]["ip"].replace("10.0.2.", "172.31.4.")
    d, _ = only(kit, data, "collides")
    assert d.message == "172.31.0.0/16 collides with the data network 172.31.4.0/24"
    assert d.path == "docker.address_pools[0].base"
    assert (d.line, d.col) == (1, 1)  # the default is not in the file: the closest parent is the document


def test_docker_pool_size_larger_than_base(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"address_pools": [{"base": "192.168.0.0/24", "size": 20}]}
    d, text = only(kit, data, "larger than the pool")
    assert_at(kit, d, text, "size: 20")


def test_docker_users_must_be_admins(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"users": ["ops", "mallory"]}
    d, text = only(kit, data, "admin_users")
    assert d.message == "'mallory' is not one of cluster.admin_users"
    assert d.path == "docker.users[1]"
    line, col = kit.pos_of(text, "- mallory")
    assert (d.line, d.col) == (line, col + 2)


def test_docker_nodes_unknown(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"nodes": ["@compute", "ghost"]}
    d, text = only(kit, data, "unknown node")
    assert d.path == "docker.nodes"
    assert d.message == "unknown node 'ghost'"
    assert (d.line, d.col) == (kit.line_of(text, "docker:") + 1, 3)


def test_disabled_docker_is_not_checked(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"enabled": False, "users": ["nobody"], "nodes": ["ghost"]}
    kit.load(data)


# --------------------------------------------------------------------------- select_nodes
def test_select_nodes(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert select_nodes(m, ["@compute"]) == ["node01", "node02"]
    assert select_nodes(m, ["@head"]) == ["head01"]
    assert select_nodes(m, ["node[01-02]"]) == ["node01", "node02"]
    assert select_nodes(m, ["node02", "head01"]) == ["head01", "node02"]  # manifest order
    assert select_nodes(m, ["node01", "@compute", "node[01-01]"]) == ["node01", "node02"]  # no duplicates
    assert select_nodes(m, []) == []


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["@login"], "'@login' matches no node (no node has role 'login')"),
        (["@nope"], "'@nope' matches no node (no node has role 'nope')"),
        (["ghost"], "unknown node 'ghost'"),
        (["node[01-04]"], "unknown node 'node03' (and 1 more)"),
        (["node[1-2]"], "unknown node 'node1' (and 1 more)"),
        (["node[02-01]"], "bad range 'node[02-01]': 01 is below 02"),
    ],
)
def test_select_nodes_errors(kit: Any, items: list[str], message: str) -> None:
    m = kit.load(kit.base()).manifest
    with pytest.raises(SelectorError) as info:
        select_nodes(m, items)
    assert str(info.value) == message


def test_all_errors_are_reported_at_once(kit: Any) -> None:
    data = kit.base(storage=True)
    data["nodes"][0]["interfaces"]["data"]["ip"] = "10.0.9.9"
    data["docker"] = {"users": ["nobody"]}
    data["nfs"]["mounts"][0]["export"] = "nope"
    diags = kit.errors(data)
    assert {d.path for d in diags} >= {"nodes[0].interfaces.data.ip", "docker.users[0]", "nfs.mounts[0].export"}
    assert diags == sorted(diags)


# --------------------------------------------------------------------------- bonds (issue 28 item 2)
def bonded(kit: Any, **bond: Any) -> dict[str, Any]:
    """node[01-02] carry the data network on bond0 of two NICs."""
    data = kit.base()
    data["nodes"][1]["interfaces"]["data"]["interface"] = "bond0"
    data["nodes"][1]["bonds"] = {"bond0": {"mode": "802.3ad", "members": ["ens1f0", "ens1f1"], **bond}}
    return data


def test_a_bond_carries_the_data_network(kit: Any) -> None:
    m = kit.load(bonded(kit, mtu=9000)).manifest
    assert m.node("node02").bonds["bond0"].members == ["ens1f0", "ens1f1"]


@pytest.mark.parametrize(("change", "needle", "message"), [
    (lambda d: d["nodes"][1]["bonds"].update(bond1={"members": ["ens2f0", "ens2f1"]}), "bond1:",
     "node01: bond bond1 carries no network; name it as the interface of one (management, data: interface: bond1)"),
    (lambda d: d["nodes"][1]["bonds"]["bond0"].update(mtu=1500), "mtu: 1500",
     "node01: bond bond0 MTU 1500 disagrees with the data network's MTU 9000"),
    (lambda d: d["nodes"][1]["bonds"]["bond0"]["members"].__setitem__(1, "eno1"), "- eno1",
     "node01: eno1 is the management network's own interface; a NIC is in one place"),
    (lambda d: d["nodes"][1]["bonds"].update(bond1={"members": ["ens1f1", "ens2f1"]}), "- ens1f1#2",
     "node01: ens1f1 is a member of bond bond0 too"),
    (lambda d: d["nodes"][1]["interfaces"]["data"].update(interface="bond7"), "interface: bond7",
     "node01: no bond bond7 under the node's bonds"),
    (lambda d: d["nodes"][1]["bonds"]["bond0"]["members"].__setitem__(1, "52:54:00:00:00:21"), "- '52:54:00:00:00:21'",
     "node01: 52:54:00:00:00:21 is the MAC of the management network's interface; a NIC is in one place"),
    (lambda d: d["nodes"][1]["interfaces"]["management"].update(interface="bond0"), "bond0:",
     "node01: bond bond0 is the interface of management and data; a bond carries one network"),
    (lambda d: d["nodes"][1]["interfaces"].update(bmc={"ip": "10.0.1.21", "interface": "bond0"}), "interface: bond0#2",
     "node01: bonds carry the management or data network, not bmc"),
])
def test_bond_mistakes_are_errors_at_their_line(kit: Any, change: Any, needle: str, message: str) -> None:
    data = bonded(kit)
    change(data)
    text = kit.dump(data)
    d = kit.error(text, message.split(": ", 1)[1][:30])
    assert d.message == message
    needle, _, nth = needle.partition("#")
    assert d.line == kit.line_of(text, needle, int(nth or 1)), d.format()


def test_bond_members_by_mac_are_unique_across_the_cluster(kit: Any) -> None:
    data = bonded(kit)
    data["nodes"][1]["bonds"]["bond0"]["members"] = ["52:54:00:AA:00:01", "52-54-00-aa-00-02"]
    # a ranged entry: the same MACs (normalised) on node01 and node02
    assert [d.message for d in kit.errors(data)] == [
        "node02: MAC 52:54:00:aa:00:01 is already used by node01 (bond bond0)",
        "node02: MAC 52:54:00:aa:00:02 is already used by node01 (bond bond0)"]
    data["nodes"][1]["bonds"]["bond0"]["members"] = ["ens1f0"]
    assert "at least 2 items" in kit.error(data, "at least 2").message
    data["nodes"][1]["bonds"]["bond0"]["members"] = ["ens1f0", "ens1f0"]
    assert kit.error(data, "listed twice").path == "nodes[1].bonds.bond0.members"
    data["nodes"][1]["bonds"]["bond0"]["members"] = ["ens1f0", "not a nic"]
    assert "neither a network interface name nor a MAC" in kit.error(data, "neither").message


# --------------------------------------------------------------------------- several NICs on a network
def test_several_nics_on_data_each_with_its_address(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["interfaces"]["data"] = [{"ip": "10.0.2.21", "interface": "ens1"},
                                              {"ip": "10.0.2.121", "interface": "ens2", "mac": "52:54:00:02:00:21"}]
    m = kit.load(data).manifest
    more = m.node("node02").interfaces["data"].more
    assert [(n.ip.exploded, n.mac) for n in more] == [("10.0.2.122", "52:54:00:02:00:22")]  # per node, like the first
    data["nodes"][1]["interfaces"]["data"][1]["ip"] = "10.0.2.10"  # head01's data address
    text = kit.dump(data)
    d = kit.error(text, "is already used by head01")
    assert d.path == "nodes[1].interfaces.data[1].ip" and d.line == kit.line_of(text, "ip: 10.0.2.10", 2)
    data["nodes"][1]["interfaces"]["data"][1].update(ip="10.0.2.121", interface="eno1")
    assert kit.error(data, "in one place").message == (
        "node01: NIC eno1 is already on the management network; a NIC is in one place")
    data = kit.base()
    data["nodes"][1]["interfaces"]["management"] = [data["nodes"][1]["interfaces"]["management"],
                                                    {"ip": "10.0.0.121", "interface": "eno2"}]
    assert kit.error(data, "several NICs").message == (
        "node01: one NIC on the management network; several NICs go on data or roce "
        "(or bond the management or data network)")


def mgmt_bonded(kit: Any, members: list[str], **bond: Any) -> dict[str, Any]:
    """node[01-02]'s management link is bond0 (the data network keeps its own NIC)."""
    data = kit.base()
    data["nodes"][1]["interfaces"]["management"]["interface"] = "bond0"
    data["nodes"][1]["bonds"] = {"bond0": {"mode": "active-backup", "members": members, **bond}}
    return data


def test_a_bond_carries_the_management_network(kit: Any) -> None:
    """Members by name, or by MAC with the NIC the node PXE-boots from among them."""
    m = kit.load(mgmt_bonded(kit, ["eno1", "eno2"], mtu=1500)).manifest
    assert m.node("node02").interfaces["management"].interface == "bond0"
    data = mgmt_bonded(kit, ["52:54:00:00:00:21", "52:54:00:00:00:99"])
    data["nodes"][1]["name"] = "node01"  # one node: a ranged entry would share the member MACs
    assert kit.load(data).manifest.node("node01").bonds["bond0"].members[0] == "52:54:00:00:00:21"


def test_a_management_bond_lists_its_pxe_nic(kit: Any) -> None:
    data = mgmt_bonded(kit, ["52:54:00:00:00:98", "52:54:00:00:00:99"])
    data["nodes"][1]["name"] = "node01"
    text = kit.dump(data)
    d = kit.error(text, "not a member")
    assert d.message == ("node01: the management MAC 52:54:00:00:00:21 (the NIC the node boots and installs over) "
                         "is not a member of bond bond0; list it among them")
    assert d.path == "nodes[1].bonds.bond0.members"


def test_a_management_bond_keeps_the_network_mtu(kit: Any) -> None:
    d = kit.error(mgmt_bonded(kit, ["eno1", "eno2"], mtu=9000), "disagrees")
    assert d.message == "node01: bond bond0 MTU 9000 disagrees with the management network's MTU 1500"
