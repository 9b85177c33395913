"""provisioner.manifest.model + load: schema errors as ``file:LINE:COL: path: message``."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import ManifestError
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Gpu, Hardware
from provisioner.validate import load_manifest, load_text

# Line numbers in the tests below refer to this text; keep it in step with them.
CRAFTED = """\
version: 1
cluster:
  name: demo
networks:
  management: {cidr: 10.1.0.0/24}
  bmc: {cidr: 10.1.1.0/24}
nodes:
  - name: ctl
    roles: [head]
    interfaces:
      management: {ip: 10.1.0.10}
    hardware:
      cpu: {cores_per_socket: 4}
      memory_gb: 16
  - name: gpu[1-3]
    roles: [compute]
    interfaces:
      management: {ip: 10.1.0.21, mac: "52:54:00:00:01:21"}
    bmc: {type: ipmi, address: 10.1.1.21, user: admin, password_env: BMC_PW}
    hardware:
      cpu: {cores_per_socket: 8}
      memory_gb: 64
      gpu: {model: RTX 3090, count: 2}
slurm:
  partitions: [{name: gpu, nodes: ["@compute"], default: true}]
"""


def mutate(old: str, new: str, text: str = CRAFTED) -> str:
    assert text.count(old) == 1, f"{old!r} must occur once"
    return text.replace(old, new)


def formatted(text: str, file: str = "m.yaml") -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_text(text, file)
    lines = [d.format() for d in info.value.diagnostics]
    assert str(info.value).splitlines() == lines
    return lines


def test_crafted_manifest_loads() -> None:
    loaded = load_text(CRAFTED, "m.yaml")
    assert loaded.manifest.node_names() == ["ctl", "gpu1", "gpu2", "gpu3"]
    # no admin and no cluster.ssh.public_key: no key is allowed root, so apply leaves root's
    # keys alone (issue 19 item 20); the default OS (Ubuntu 22.04) cannot fence
    # cores/memory/GPUs in Slurm; its GPU nodes have no scratch disk: each said once
    assert sorted((w.path, w.severity) for w in loaded.warnings) == [
        ("cluster.admin_users", "warning"), ("nodes[1].hardware.disks", "warning"), ("slurm", "warning")]
    assert loaded.path == Path("m.yaml")


# --------------------------------------------------------------------------- exact positions
def test_wrong_type_exact_position() -> None:
    assert formatted(mutate("memory_gb: 16", "memory_gb: lots")) == [
        "m.yaml:14:7: nodes[0].hardware.memory_gb: Input should be a valid integer, "
        "unable to parse string as an integer"
    ]


def test_out_of_range_in_flow_mapping_exact_position() -> None:
    assert formatted(mutate("count: 2", "count: 0")) == [
        "m.yaml:23:30: nodes[1].hardware.gpu.count: Input should be greater than or equal to 1"
    ]


def test_missing_field_points_at_the_parent_item() -> None:
    text = mutate("    hardware:\n      cpu: {cores_per_socket: 4}\n      memory_gb: 16\n", "")
    assert formatted(text) == ["m.yaml:8:5: nodes[0].hardware: required field is missing"]


def test_literal_errors_list_the_choices() -> None:
    assert formatted(mutate("roles: [head]", "roles: [head, chief]")) == [
        "m.yaml:9:19: nodes[0].roles[1]: got 'chief'; "
        "expected one of 'head', 'compute', 'storage', 'services' or 'login'"
    ]
    assert formatted(mutate("roles: [head]", "roles: [head]\n    os: ubuntu-20.04")) == [
        "m.yaml:10:5: nodes[0].os: got 'ubuntu-20.04'; expected one of 'ubuntu-22.04', 'ubuntu-24.04' or 'debian-12'"
    ]


def test_unknown_key_did_you_mean_and_the_missing_field() -> None:
    assert formatted(mutate("roles: [head]", "rols: [head]")) == [
        "m.yaml:8:5: nodes[0].roles: required field is missing",
        "m.yaml:9:5: nodes[0].rols: unknown field; did you mean 'roles'?",
    ]


def test_unknown_key_without_a_close_match_lists_allowed_fields() -> None:
    (line,) = formatted(mutate("name: demo", "name: demo\n  colour: blue"))
    assert line.startswith("m.yaml:4:3: cluster.colour: unknown field; allowed: ")
    assert "admin_users" in line
    assert "ntp_servers" in line


def test_unknown_top_level_key_did_you_mean() -> None:
    (line,) = formatted(CRAFTED + "sofware: {}\n")
    assert line == "m.yaml:26:1: sofware: unknown field; did you mean 'software'?"


def test_unknown_key_deep_in_a_list_item() -> None:
    text = CRAFTED + "zfs:\n  pools:\n    - name: p\n      node: ctl\n      vdevs: {disks: [a, b], widht: 2}\n"
    lines = formatted(text)
    assert "m.yaml:30:30: zfs.pools[0].vdevs.widht: unknown field; did you mean 'width'?" in lines


def test_bad_network_name_in_interfaces() -> None:
    assert formatted(mutate("management: {ip: 10.1.0.10}", "mgmt: {ip: 10.1.0.10}")) == [
        "m.yaml:11:7: nodes[0].interfaces.mgmt: got 'mgmt'; expected one of 'management', 'bmc', 'data', "
        "'infiniband' or 'roce'"
    ]


def test_management_interface_is_required() -> None:
    text = mutate("management: {ip: 10.1.0.10}", "bmc: {ip: 10.1.1.10}")
    (line,) = formatted(text)
    assert line.startswith("m.yaml:10:5: nodes[0].interfaces: ")
    assert "'management' interface" in line


# --------------------------------------------------------------------------- BMC credentials
def test_inline_bmc_password_is_rejected_without_echoing_it() -> None:
    lines = formatted(mutate("password_env: BMC_PW", "password: hunter2-secret"))
    assert lines == [
        "m.yaml:19:5: nodes[1].bmc: inline BMC passwords are not allowed; use password_env "
        "(an environment variable name) or password_file"
    ]
    assert "hunter2" not in "\n".join(lines)


def test_password_env_and_password_file_are_exclusive() -> None:
    both = mutate("password_env: BMC_PW", "password_env: BMC_PW, password_file: /etc/bmc.pass")
    assert formatted(both) == ["m.yaml:19:5: nodes[1].bmc: give exactly one of password_env or password_file"]
    neither = mutate(", password_env: BMC_PW", "")
    assert formatted(neither) == ["m.yaml:19:5: nodes[1].bmc: give exactly one of password_env or password_file"]


def test_password_file_alone_is_fine() -> None:
    loaded = load_text(mutate("password_env: BMC_PW", "password_file: /etc/bmc.pass"))
    bmc = loaded.manifest.node("gpu2").bmc
    assert bmc is not None
    assert (bmc.password_file, bmc.password_env) == ("/etc/bmc.pass", None)


def test_password_env_must_be_a_variable_name() -> None:
    (line,) = formatted(mutate("password_env: BMC_PW", "password_env: 'BMC-PW'"))
    assert line.startswith("m.yaml:19:5: nodes[1].bmc: password_env 'BMC-PW'")


@pytest.mark.parametrize("value", ["null", "''", "[a]", "{x: 1}"])
def test_bmc_address_must_be_a_string(value: str) -> None:
    (line,) = formatted(mutate("address: 10.1.1.21", f"address: {value}"))
    assert line.startswith("m.yaml:19:23: nodes[1].bmc.address: ")


# --------------------------------------------------------------------------- version
def test_version_missing() -> None:
    assert formatted(mutate("version: 1\n", "")) == [
        "m.yaml:1:1: version: required field is missing; this tool reads version: 1"
    ]


@pytest.mark.parametrize("value", ["2", "'2'", "yes", "true", "[1]", "0"])
def test_unsupported_versions(value: str) -> None:
    (line,) = formatted(mutate("version: 1", f"version: {value}"))
    assert line.startswith("m.yaml:1:1: version: schema version ")
    assert line.endswith("is not supported; this tool reads version: 1")


@pytest.mark.parametrize("value", ["'1'", '"1"', "' 1'"])
def test_version_as_a_string_says_so(value: str) -> None:
    """Issue 18: `version: "1"` was refused as "not supported", which reads as wrong."""
    assert formatted(mutate("version: 1", f"version: {value}")) == [
        "m.yaml:1:1: version: a number, not a string: write version: 1 (without quotes)"
    ]


def test_version_2_message() -> None:
    assert formatted(mutate("version: 1", "version: 2")) == [
        "m.yaml:1:1: version: schema version 2 is not supported; this tool reads version: 1"
    ]


# --------------------------------------------------------------------------- node ranges
def test_range_expansion_names_and_addresses() -> None:
    m = load_text(CRAFTED).manifest
    gpus = [m.node(f"gpu{i}") for i in (1, 2, 3)]
    assert [str(n.ip) for n in gpus] == ["10.1.0.21", "10.1.0.22", "10.1.0.23"]
    assert [n.interfaces["management"].mac for n in gpus] == [
        "52:54:00:00:01:21",
        "52:54:00:00:01:22",
        "52:54:00:00:01:23",
    ]
    assert [n.bmc.address if n.bmc else None for n in gpus] == ["10.1.1.21", "10.1.1.22", "10.1.1.23"]
    assert all(n.bmc is not None and n.bmc.password_env == "BMC_PW" for n in gpus)
    assert m.node("ctl").interfaces["management"].mac is None


def test_source_index_maps_back_to_the_entry() -> None:
    m = load_text(CRAFTED).manifest
    assert [n.source_index for n in m.nodes] == [0, 1, 1, 1]


def test_every_interface_increments(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert [str(m.node(n).interfaces["data"].ip) for n in ("node01", "node02")] == ["10.0.2.21", "10.0.2.22"]
    assert m.node("node02").interfaces["data"].interface == "ens1"


def test_zero_padded_range_expansion(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["name"] = "node[08-11]"
    m = kit.load(data).manifest
    assert m.node_names() == ["head01", "node08", "node09", "node10", "node11"]
    assert str(m.node("node11").ip) == "10.0.0.24"


def test_per_node_disk_ids_of_a_ranged_entry(kit: Any) -> None:
    """Issue 28: the nodes of one entry whose disks carry different serials each get their
    own id (``per_node``, in the entry's order; an item may be a range: that node's disks)."""
    data = kit.base()
    data["nodes"][1]["name"] = "node[01-03]"
    data["nodes"][1]["hardware"]["disks"] = [
        {"id": "nvme-OS", "kind": "nvme", "use": "os"},
        {"per_node": ["nvme-990PRO_S7KGNJ0W1", "nvme-990PRO_S7KGNJ0X[7-8]", "nvme-990PRO_S7KGNJ0Z4"],
         "kind": "nvme", "use": "scratch"}]
    m = kit.load(data).manifest
    disks = {n: [(d.id, d.per_node) for d in m.node(n).hardware.disks] for n in ("node01", "node02", "node03")}
    assert disks == {"node01": [("nvme-OS", None), ("nvme-990PRO_S7KGNJ0W1", None)],
                     "node02": [("nvme-OS", None), ("nvme-990PRO_S7KGNJ0X[7-8]", None)],
                     "node03": [("nvme-OS", None), ("nvme-990PRO_S7KGNJ0Z4", None)]}
    assert m.node("head01").hardware.disks[0].id == "ata-DISK_[1-4]"  # no per_node: as before


def test_per_node_disk_ids_must_match_the_entry(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["disks"] = [{"per_node": ["nvme-A", "nvme-B", "nvme-C"], "use": "scratch"}]
    text = kit.dump(data)
    (diag,) = kit.errors(text)
    assert diag.path == "nodes[1].hardware.disks[0].per_node"
    assert diag.message == ("node[01-02]: per_node lists 3 disk id(s) for 2 node(s); give one per node, "
                            "in the entry's order")
    assert (diag.line, diag.col) == kit.pos_of(text, "per_node")
    data["nodes"][1]["hardware"]["disks"] = [{"id": "nvme-A", "per_node": ["nvme-A", "nvme-B"]}]
    assert "give id or per_node, not both" in kit.errors(data)[0].message
    data["nodes"][1]["hardware"]["disks"] = [{"use": "scratch"}]
    assert "give the disk's id (or per_node" in kit.errors(data)[0].message
    data["nodes"][1]["hardware"]["disks"] = [{"per_node": ["nvme-A", "/dev/nvme1n1"]}]
    assert "without a path" in kit.errors(data)[0].message


def test_ranged_node_needs_an_ipv4_bmc_address() -> None:
    assert formatted(mutate("address: 10.1.1.21", "address: bmc-gpu")) == [
        "m.yaml:19:23: nodes[1].bmc.address: gpu[1-3]: a ranged node needs an IPv4 BMC address to increment"
    ]


def test_single_node_may_use_a_bmc_host_name() -> None:
    text = mutate("name: gpu[1-3]", "name: gpu1")
    m = load_text(mutate("address: 10.1.1.21", "address: bmc-gpu1.example.org", text)).manifest
    bmc = m.node("gpu1").bmc
    assert bmc is not None
    assert bmc.address == "bmc-gpu1.example.org"
    assert bmc.ipv4 is None


def test_ip_overflow_points_at_the_ip() -> None:
    assert formatted(mutate("ip: 10.1.0.21", "ip: 255.255.255.254")) == [
        "m.yaml:18:20: nodes[1].interfaces.management.ip: gpu[1-3]: 255.255.255.254 + 2 leaves the IPv4 address space"
    ]


def test_mac_overflow_points_at_the_mac() -> None:
    assert formatted(mutate('mac: "52:54:00:00:01:21"', 'mac: "ff:ff:ff:ff:ff:fe"')) == [
        "m.yaml:18:35: nodes[1].interfaces.management.mac: "
        "gpu[1-3]: ff:ff:ff:ff:ff:fe + 2 overflows the MAC address space"
    ]


def test_bmc_overflow_points_at_the_bmc_address() -> None:
    (line,) = formatted(mutate("address: 10.1.1.21", "address: 255.255.255.255"))
    assert line.startswith("m.yaml:19:23: nodes[1].bmc.address: gpu[1-3]: BMC ")


def test_bad_range_in_node_name() -> None:
    assert formatted(mutate("name: gpu[1-3]", "name: gpu[3-1]")) == [
        "m.yaml:15:5: nodes[1].name: bad range 'gpu[3-1]': 1 is below 3"
    ]


def test_invalid_expanded_host_name() -> None:
    (line,) = formatted(mutate("name: gpu[1-3]", "name: GPU[1-3]"))
    assert line.startswith("m.yaml:15:5: nodes[1].name: 'GPU1' is not a valid host name")


# --------------------------------------------------------------------------- examples
def test_llm_200k_example(kit: Any) -> None:
    loaded = load_manifest(kit.examples / "llm-200k.yaml")
    m = loaded.manifest
    assert m.node_names() == ["head01", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert sum(n.gpu_count for n in m.nodes) == 8
    assert m.head.name == "head01"
    assert [n.source_index for n in m.nodes] == [0, 1, 1, 1, 1]
    assert [str(m.node(f"gpu0{i}").interfaces["infiniband"].ip) for i in range(1, 5)] == [
        "10.10.2.21",
        "10.10.2.22",
        "10.10.2.23",
        "10.10.2.24",
    ]
    # a single SLOG, Ubuntu 22.04's Slurm 21.08 cannot fence GPUs under cgroup v2, and its
    # node_exporter cannot read the statistics of NFS mounts over RDMA
    assert [w.path for w in loaded.warnings] == ["zfs.pools[0].log", "slurm", "monitoring"]
    assert "no cgroup v2 support" in loaded.warnings[1].message
    assert "mountstats collector stays off" in loaded.warnings[2].message
    warning = loaded.warnings[0]
    assert warning.severity == "warning"
    assert warning.path == "zfs.pools[0].log"
    assert "single SLOG" in warning.message
    text = (kit.examples / "llm-200k.yaml").read_text()
    assert warning.line == kit.line_of(text, "log: [nvme-INTEL")
    assert warning.format().startswith(f"{kit.examples / 'llm-200k.yaml'}:{warning.line}:")


def test_music_lab_example(kit: Any) -> None:
    loaded = load_manifest(kit.examples / "music-lab.yaml")
    m = loaded.manifest
    assert m.node_names() == ["labhead", "store1", "store2", "gpu1", "gpu2", "gpu3"]
    assert sum(n.gpu_count for n in m.nodes) == 6
    # its only warning: an Ubuntu-only site with a mirror gets its deploy ramdisk from Debian
    assert [(w.path, w.severity) for w in loaded.warnings] == [("cluster.mirrors.apt", "warning")]
    assert "deploy ramdisk" in loaded.warnings[0].message
    assert m.node("gpu3").hardware.gpu is not None
    assert m.node("gpu3").hardware.gpu.gres_type == "rtx3090"
    assert [m.node(f"store{i}").bmc.address for i in (1, 2)] == ["192.168.51.11", "192.168.51.12"]  # type: ignore[union-attr]


def test_yaml11_off_reaches_zfs_as_the_word_off(kit: Any) -> None:
    m = load_manifest(kit.examples / "llm-200k.yaml").manifest
    props = m.zfs.pools[0].datasets[0].properties
    assert props["atime"] == "off"
    assert props["recordsize"] == "1M"
    assert m.zfs.pools[0].properties["atime"] == "off"  # the default


def test_yaml11_on_and_off_in_pool_properties(kit: Any) -> None:
    data = kit.base(storage=True)
    data["zfs"]["pools"][0]["properties"] = {"atime": False, "relatime": True, "copies": 2}
    props = kit.load(data).manifest.zfs.pools[0].properties
    assert props == {"atime": "off", "relatime": "on", "copies": 2}


# --------------------------------------------------------------------------- field rules
@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("networks", "management", "cidr"), "10.0.0.1/24", "is not an IPv4 network"),
        (("networks", "management", "gateway"), "10.9.9.1", "gateway 10.9.9.1 is outside 10.0.0.0/24"),
        (("cluster", "name"), "Test_C", "lower-case letters"),
        (("cluster", "domain"), "bad..domain", "not a valid DNS domain"),
        (("cluster", "timezone"), "Mars Time", "not a timezone name"),
        (("cluster", "mirrors"), {"apt": "ftp://x"}, "not an http(s):// or file:// URL"),
        (("cluster", "admin_users", 0, "name"), "root", "'root' is not an admin user"),
        (("cluster", "admin_users", 0, "ssh_keys", 0), "not-a-key AAAA", "not an OpenSSH public key"),
        (("slurm", "partitions", 0, "max_time"), "forever", "not a Slurm time"),
        (("software",), {"cuda": {"versions": ["12.4"], "default": "12.8"}}, "default 12.8 is not one of versions"),
        (("software",), {"nvidia_driver": {"branch": "55"}}, "not a driver branch"),
        (("software",), {"nccl": {"version": "2.x"}}, "not an NCCL version"),
        (("nodes", 0, "hardware", "disks", 0, "id"), "/dev/sda", "without a path"),
        (("nodes", 0, "roles"), ["head", "head"], "a role is listed twice"),
        (("nodes", 1, "hardware", "gpu", "type"), "RTX-3090", "GRES type"),
        (
            ("nodes", 0, "interfaces", "management", "interface"),
            "a very long interface name",
            "not a network interface",
        ),
    ],
)
def test_field_rules(kit: Any, path: tuple[Any, ...], value: Any, needle: str) -> None:
    data = kit.base()
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    diags = kit.errors(data)
    hits = [d for d in diags if needle in d.message]
    assert hits, [d.format() for d in diags]
    assert all(d.line > 0 and d.file == "m.yaml" for d in hits)


@pytest.mark.parametrize("path", ["data", "/data/", "/a//b", "/a/../b", "/with space", "/new\nline", "/tab\there"])
def test_mount_paths_must_be_clean_absolute_paths(kit: Any, path: str) -> None:
    data = kit.base(storage=True)
    data["nfs"]["mounts"][0]["path"] = path
    d = kit.error(data, repr(path))
    assert d.path == "nfs.mounts[0].path"
    assert "\n" not in d.format()
    text = kit.dump(data)
    assert (d.line, d.col) == (kit.line_of(text, "- export: data") + 1, 5)


def test_gres_type_and_memory_helpers() -> None:
    assert Gpu(model="NVIDIA GeForce RTX 4090", count=1).gres_type == "rtx_4090"
    assert Gpu(model="H100 SXM", count=8, type="h100").gres_type == "h100"
    hw = Hardware.model_validate(
        {"cpu": {"cores_per_socket": 8, "sockets": 2, "threads_per_core": 2}, "memory_gb": 256}
    )
    assert (hw.cpu.cores, hw.cpu.threads) == (16, 32)
    assert hw.real_memory_mb == 256 * 1024 - 13107  # 5 % reserve
    small = Hardware.model_validate({"cpu": {"cores_per_socket": 1}, "memory_gb": 8})
    assert small.real_memory_mb == 8 * 1024 - 2048  # at least 2 GiB reserve


@pytest.mark.parametrize("memory_gb", [1, 2, 4, 8, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 65536])
def test_real_memory_stays_below_what_the_kernel_reports(memory_gb: int) -> None:
    """The kernel reports ~98 % of a large node as MemTotal (2 TB: struct page 1/64 of RAM,
    firmware and crashkernel reservations), a small VM ~94 % (1 GiB: ~960 MiB); RealMemory
    must stay below on every size, or the fact check stops apply and slurmctld drains the
    node as "Low RealMemory"."""
    hw = Hardware.model_validate({"cpu": {"cores_per_socket": 1}, "memory_gb": memory_gb})
    total = memory_gb * 1024
    memtotal = min(total * 98 // 100, total - 64)  # what the kernel leaves, generously
    assert 0 < hw.real_memory_mb < memtotal
    assert hw.real_memory_mb >= total * 90 // 100 or total < 64 * 1024  # not wasteful on real servers


def test_manifest_helpers(kit: Any) -> None:
    m: Manifest = kit.load(kit.base()).manifest
    assert m.head.name == "head01"
    assert [n.name for n in m.with_role("compute")] == ["node01", "node02"]
    assert m.node("node02").ip == ipaddress.IPv4Address("10.0.0.22")
    assert m.node("node02").gpu_count == 2
    assert m.node("head01").gpu_count == 0
    with pytest.raises(KeyError):
        m.node("nope")


def test_whitespace_is_stripped_from_strings(kit: Any) -> None:
    data = kit.base()
    data["cluster"]["name"] = "  testc  "
    assert kit.load(data).manifest.cluster.name == "testc"


def test_password_file_must_be_absolute() -> None:
    (line,) = formatted(mutate("password_env: BMC_PW", "password_file: bmc.pass"))
    assert line == "m.yaml:19:5: nodes[1].bmc: password_file 'bmc.pass' must be an absolute path"


def test_unquoted_cuda_version_is_refused(kit: Any) -> None:
    data = kit.base()
    data["software"] = {"cuda": {"versions": [12.10]}}
    diags = kit.errors(data)
    assert len(diags) == 1
    assert diags[0].path == "software.cuda.versions"
    assert "quote CUDA versions" in diags[0].message and "12.10 becomes 12.1" in diags[0].message


@pytest.mark.parametrize(("written", "expected"), [("off", "off"), ("'off'", "off"), ("weekly", "weekly")])
def test_zfs_scrub_accepts_a_bare_off(written: str, expected: str) -> None:
    # YAML 1.1 reads a bare `off` as false; the field wants the word
    loaded = load_text(CRAFTED + f"zfs:\n  scrub: {written}\n", "m.yaml")
    assert loaded.manifest.zfs.scrub == expected


def test_zfs_scrub_rejects_true() -> None:
    lines = formatted(CRAFTED + "zfs:\n  scrub: on\n")
    assert lines == ["m.yaml:27:3: zfs.scrub: got True; expected one of 'weekly', 'monthly' or 'off'"]


# --------------------------------------------------------------------------- node index
def test_node_lookups(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert m.node("node02") is m.nodes[2]
    with pytest.raises(KeyError, match="ghost"):
        m.node("ghost")
    assert [n.name for n in m.with_role("compute")] == ["node01", "node02"]
    assert m.with_role("login") == []
    assert m.role_names("compute") == frozenset({"node01", "node02"})
    assert m.role_names("login") == frozenset()
    m.with_role("compute").clear()  # a copy: the index keeps its own
    assert m.node_names() == ["head01", "node01", "node02"]


def test_the_index_follows_the_node_list(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert m.node_names() == ["head01", "node01", "node02"]
    fewer = m.model_copy(update={"nodes": m.nodes[:2]})
    assert fewer.node_names() == ["head01", "node01"]
    with pytest.raises(KeyError):
        fewer.node("node02")
    m.nodes.append(m.nodes[1].model_copy(update={"name": "node03"}))  # in place: the length tells
    assert m.node("node03").name == "node03"
    assert m.role_names("compute") == frozenset({"node01", "node02", "node03"})


def test_the_index_is_no_part_of_the_value(kit: Any) -> None:
    a = kit.load(kit.base()).manifest
    b = kit.load(kit.base()).manifest
    a.node("node01")  # builds a's index only
    assert a == b
    assert a.model_copy() == b


def test_ipoib_connected_mode_needs_the_operator_to_say_the_hcas_run_it(kit: Any) -> None:
    """ConnectX-4 and newer run Enhanced IPoIB, datagram only: connected mode (and the
    large MTU it allows) fails there (issue 19 item 9)."""
    data = kit.example("llm-200k.yaml")
    data["networks"]["infiniband"]["mode"] = "connected"
    d = kit.error(data, "connected mode")
    assert d.path == "networks.infiniband"
    assert "hca_supports_connected: true" in d.message and "ConnectX-4" in d.message
    data["networks"]["infiniband"]["hca_supports_connected"] = True
    data["networks"]["infiniband"]["mtu"] = 65520
    assert kit.load(data).manifest.networks.infiniband.mode == "connected"
    data["networks"]["infiniband"]["mode"] = "datagram"
    assert "at most 4092 bytes" in kit.error(data, "4092").message
    data["networks"]["infiniband"]["mtu"] = 4092
    assert kit.load(data).manifest.networks.infiniband.mtu == 4092


def test_roce_is_ethernet_rdma_and_validate_tells_it_from_infiniband(kit: Any) -> None:
    """Issue 28 item 1: 100 GbE RoCE NICs at MTU 9000 have a network of their own; a manifest
    that mixes the two fabrics' settings up is told which belongs where, at the line."""
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    roce = kit.load(data).manifest.networks.roce
    assert roce is not None and (roce.mtu, roce.gid_index, roce.traffic_class, roce.rdma) == (9000, 3, None, True)
    data["networks"]["roce"]["mtu"] = 9216  # jumbo frames stop at 9000 here
    assert kit.error(data, "9000").path == "networks.roce.mtu"
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "subnet_manager": "opensm", "pkey": "0x8001"}
    text = kit.dump(data)
    d = kit.error(text, "subnet manager")
    assert d.path == "networks.roce" and d.line == kit.line_of(text, "roce:")
    assert "subnet_manager on a roce network: a subnet manager runs on InfiniBand only" in d.message
    assert "pkey on a roce network: partition keys are InfiniBand's" in d.message
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mode": "connected"}
    assert "IPoIB mode is InfiniBand's" in kit.error(data, "mode on a roce network").message
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "traffic_class": 256}
    assert kit.error(data, "less than or equal to 255").path == "networks.roce.traffic_class"
    # RoCE's settings on InfiniBand, and RoCE NICs at MTU 9000 put on InfiniBand
    del data["networks"]["roce"]
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24", "gid_index": 3}
    assert "networks.roce" in kit.error(data, "gid_index on a infiniband network").message
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24", "mtu": 9000}
    assert "Ethernet NICs running RDMA (RoCE) at MTU 9000 go under networks.roce" in kit.error(data, "4092").message


def test_rdma_devices_belong_to_the_fabrics_once(kit: Any) -> None:
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24"}
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][0]["interfaces"]["data"]["rdma_device"] = "mlx5_0"
    data["nodes"][0]["interfaces"]["roce"] = {"ip": "10.0.4.10", "interface": "ens2f0", "rdma_device": "mlx5_1"}
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0", "rdma_device": "mlx5_1"}
    text = kit.dump(data)
    d = kit.error(text, "rdma_device is for")
    assert d.message == "head01: rdma_device is for the infiniband and roce networks, not data"
    assert d.line == kit.line_of(text, "rdma_device: mlx5_0")
    d = kit.error(text, "already on")
    assert d.message == "head01: RDMA device mlx5_1 is already on the roce network"
    assert d.line == kit.line_of(text, "rdma_device: mlx5_1", 2)
    data["nodes"][0]["interfaces"]["roce"]["rdma_device"] = "mlx5 1"
    assert "not an RDMA device name" in kit.error(data, "mlx5 1").message


def test_a_list_section_given_as_a_mapping_says_what_the_section_looks_like(kit: Any) -> None:
    """Issue 19 item 18: `mergerfs:` as a mapping got pydantic's raw "Input should be a valid
    list"."""
    data = kit.base(storage=True)
    data["mergerfs"] = data["mergerfs"][0]  # one union, without its '- '
    (d,) = kit.errors(data)
    assert d.path == "mergerfs"
    assert "valid list" not in d.message
    assert "expected a list" in d.message and "put '- ' before its first key" in d.message
    assert "mergerfs: [{path: /corpus, branches: [" in d.message
    assert "\n" not in d.format()
    data = kit.base()
    data["slurm"]["partitions"] = {"gpu": {"nodes": ["@compute"]}}
    (d,) = kit.errors(data)
    assert d.path == "slurm.partitions" and "partitions: [{name: gpu" in d.message
