"""provisioner.areas.storage.nfs: exports, nfsd threads, mount protocol, server address, mount options."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import base, nfs
from provisioner.areas.storage.rolevars import nfs_client_node_vars as nfs_client_vars
from provisioner.areas.storage.rolevars import nfs_server_node_vars as nfs_server_vars
from provisioner.errors import ManifestError
from provisioner.manifest import Manifest
from provisioner.manifest.storage import NfsExport, NfsMount

ROOT = Path(__file__).resolve().parents[3]
HGST = "ata-HGST_HUS726T6TALE6L4_V8G0000"


# =========================================================================== NFS
def test_export_clients_from_network_names_and_cidrs(llm: Manifest) -> None:
    exp = NfsExport(name="x", node="head01", path="/srv/x",
                    clients=["infiniband", "10.10.0.7/24", "infiniband", "management"])
    assert nfs.export_clients(llm, exp) == ["10.10.2.0/24", "10.10.0.0/24"]
    with pytest.raises(base.StorageError, match="'data' is not defined"):
        nfs.export_clients(llm, NfsExport(name="y", node="head01", path="/y", clients=["data"]))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ["rw", "sync", "root_squash", "no_subtree_check"]),
        ({"rw": False, "sync": False, "root_squash": False}, ["ro", "async", "no_root_squash", "no_subtree_check"]),
        ({"options": ["async", "fsid=7"]}, ["rw", "root_squash", "no_subtree_check", "async", "fsid=7"]),
        ({"options": ["no_root_squash", "subtree_check"]}, ["rw", "sync", "no_root_squash", "subtree_check"]),
    ],
)
def test_export_options(fields: dict[str, Any], expected: list[str]) -> None:
    exp = NfsExport.model_validate({"name": "x", "node": "n", "path": "/x", **fields})
    assert nfs.export_options(exp) == expected


def _with_mountpoints(m: Manifest, pool: dict[str, Any], datasets: dict[str, dict[str, Any]]) -> Manifest:
    tank = m.zfs.pools[0]
    new = tank.model_copy(update={
        "properties": {**tank.properties, **pool},
        "datasets": [d.model_copy(update={"properties": {**d.properties, **datasets.get(d.name, {})}})
                     for d in tank.datasets],
    })
    return m.model_copy(update={"zfs": m.zfs.model_copy(update={"pools": [new]})})


@pytest.mark.parametrize(
    ("pool", "datasets", "expected"),
    [
        ({}, {}, "/tank/datasets"),  # ZFS's default: /<pool>/<dataset>
        ({}, {"datasets": {"mountpoint": "/srv/datasets"}}, "/srv/datasets"),
        ({"mountpoint": "/export"}, {}, "/export/datasets"),  # inherited from the pool
        ({"mountpoint": "/"}, {}, "/datasets"),
        ({"mountpoint": "/export"}, {"datasets": {"mountpoint": "/data"}}, "/data"),
    ],
)
def test_dataset_exports_use_the_zfs_mountpoint(llm: Manifest, pool: dict[str, Any],
                                                datasets: dict[str, dict[str, Any]], expected: str) -> None:
    m = _with_mountpoints(llm, pool, datasets)
    exp = m.nfs.exports[0]
    assert exp.dataset == "tank/datasets"
    assert nfs.export_path(m, exp) == expected
    server = nfs_server_vars(m, m.node("head01"))["nfs_server_exports"]
    assert server[0]["path"] == expected
    client = nfs_client_vars(m, m.node("gpu01"))["nfs_client_mounts"]
    assert client[0]["what"] == f"10.10.2.10:{expected}"


def test_dataset_mountpoint_of_a_nested_dataset(llm: Manifest) -> None:
    assert nfs.dataset_mountpoint(llm, "head01", "tank/a/b") == "/tank/a/b"
    m = _with_mountpoints(llm, {"mountpoint": "/export"}, {})
    assert nfs.dataset_mountpoint(m, "head01", "tank/datasets/audio") == "/export/datasets/audio"


@pytest.mark.parametrize("value", ["none", "legacy"])
def test_an_unmounted_dataset_cannot_be_exported(llm: Manifest, value: str) -> None:
    m = _with_mountpoints(llm, {"mountpoint": value}, {})
    with pytest.raises(base.StorageError, match=f"mountpoint={value} \\(inherited from tank\\)"):
        nfs.export_path(m, m.nfs.exports[0])


def test_exports_lines(llm: Manifest) -> None:
    exp = llm.nfs.exports[0]
    line = nfs.exports_line(nfs.export_path(llm, exp), nfs.export_clients(llm, exp), nfs.export_options(exp))
    assert line == "/tank/datasets 10.10.2.0/24(rw,sync,root_squash,no_subtree_check)"
    assert nfs.exports_line("/srv/my data", ["10.0.0.0/24", "10.1.0.0/24"], ["ro"]) == (
        '"/srv/my data" 10.0.0.0/24(ro) 10.1.0.0/24(ro)'
    )
    with pytest.raises(base.StorageError):
        nfs.exports_line("/x", [], ["rw"])


@pytest.mark.parametrize(("cores", "override", "expected"), [(1, None, 8), (16, None, 64), (128, None, 256),
                                                              (16, 12, 12)])
def test_nfsd_threads(cores: int, override: int | None, expected: int) -> None:
    assert nfs.nfsd_threads(cores, override) == expected


def ib_manifest(kit: Any, rdma: bool = True, client_ib: bool = True, proto: str = "auto",
                clients: list[str] | None = None) -> Manifest:
    data = kit.base(storage=True)
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24", "rdma": rdma}
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    if client_ib:
        data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    data["nfs"]["exports"][0]["clients"] = clients or ["infiniband", "data"]
    data["nfs"]["mounts"][0]["proto"] = proto
    m: Manifest = kit.load(data).manifest
    return m


def test_auto_proto_uses_rdma_on_an_rdma_fabric(kit: Any) -> None:
    m = ib_manifest(kit)
    mnt, exp = m.nfs.mounts[0], m.nfs.exports[0]
    node01 = m.node("node01")
    assert nfs.mount_proto(m, mnt, node01) == "rdma"
    assert nfs.server_address(m, exp, node01, "rdma") == "10.0.3.10"
    assert nfs.mount_options(mnt, "rdma")[:3] == ["vers=4.2", "proto=rdma", "port=20049"]


def test_no_nconnect_over_rdma() -> None:
    mount = NfsMount(export="x", path="/x", nodes=["n"], nconnect=8, options=["nconnect=4", "noatime"])
    rdma = nfs.mount_options(mount, "rdma")
    assert not [o for o in rdma if o.startswith("nconnect")]
    assert "noatime" in rdma
    assert "nconnect=4" in nfs.mount_options(mount, "tcp")


def test_validate_warns_about_nconnect_over_rdma(kit: Any) -> None:
    data = kit.base(storage=True)
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    for node in data["nodes"]:
        node["interfaces"]["infiniband"] = {"ip": "10.0.3." + node["interfaces"]["management"]["ip"].split(".")[-1],
                                            "interface": "ib0"}
    data["nfs"]["exports"][0]["clients"] = ["infiniband"]
    mount = data["nfs"]["mounts"][0]
    assert kit.load(data).warnings == []  # the default nconnect is simply left out over RDMA
    mount["nconnect"] = 8
    warnings = kit.load(data).warnings
    assert [w.path for w in warnings] == ["nfs.mounts[0].nconnect"]
    assert "no effect with proto=rdma" in warnings[0].message and "left out for node[01-02];" in warnings[0].message
    del mount["nconnect"]
    mount["options"] = ["nconnect=4"]
    assert [w.path for w in kit.load(data).warnings] == ["nfs.mounts[0].options"]
    data["nfs"]["exports"][0]["clients"] = ["data"]  # over TCP nconnect works: no warning
    assert kit.load(data).warnings == []


def test_auto_proto_falls_back_to_tcp(kit: Any) -> None:
    no_rdma = ib_manifest(kit, rdma=False)
    assert nfs.mount_proto(no_rdma, no_rdma.nfs.mounts[0], no_rdma.node("node01")) == "tcp"
    # node01 is on the fabric, node02 is not: node02 mounts over the data network
    m = ib_manifest(kit, client_ib=False)
    node02 = m.node("node02")
    assert nfs.mount_proto(m, m.nfs.mounts[0], node02) == "tcp"
    assert nfs.server_address(m, m.nfs.exports[0], node02, "tcp") == "10.0.2.10"
    # the export does not serve the fabric
    data_only = ib_manifest(kit, clients=["data"])
    assert nfs.mount_proto(data_only, data_only.nfs.mounts[0], data_only.node("node01")) == "tcp"


def test_explicit_rdma_needs_both_ends_on_the_fabric(kit: Any) -> None:
    # validate refuses it (a deep check runs the same decision) ...
    with pytest.raises(ManifestError, match="node02 has no infiniband interface"):
        ib_manifest(kit, client_ib=False, proto="rdma")
    # ... which is mount_proto's: the same mount is fine once the client is on the fabric
    m = ib_manifest(kit, client_ib=False, proto="auto")
    with pytest.raises(base.StorageError, match="node02 has no infiniband interface"):
        nfs.mount_proto(m, m.nfs.mounts[0].model_copy(update={"proto": "rdma"}), m.node("node02"))
    tcp = ib_manifest(kit, proto="tcp")
    assert nfs.mount_proto(tcp, tcp.nfs.mounts[0], tcp.node("node01")) == "tcp"


def test_server_address_prefers_served_network_then_management(llm: Manifest, lab: Manifest) -> None:
    gpu01 = llm.node("gpu01")
    home = nfs.export_by_name(llm, "home")
    assert nfs.server_address(llm, home, gpu01, "tcp") == "10.10.2.10"  # served on infiniband
    llm = llm.model_copy(deep=True)  # the fixture is shared
    home = nfs.export_by_name(llm, "home")
    home.clients = ["management"]
    assert nfs.server_address(llm, home, gpu01, "tcp") == "10.10.0.10"
    corpus2 = nfs.export_by_name(lab, "corpus2")
    assert nfs.server_address(lab, corpus2, lab.node("gpu3"), "tcp") == "192.168.60.12"
    # a client off the served network has no address the export allows: the server would
    # refuse its mount over management (issue 19 item 21), so it is an error
    with pytest.raises(base.StorageError, match=re.escape("labhead cannot mount export 'corpus2': store2 allows "
                                                       "only 192.168.60.0/24")):
        nfs.server_address(lab, corpus2, lab.with_role("head")[0], "tcp")
    # a CIDR that spans networks allows the client's management address
    lab = lab.model_copy(deep=True)
    corpus2 = nfs.export_by_name(lab, "corpus2")
    corpus2.clients = ["data", "192.168.0.0/16"]
    assert nfs.server_address(lab, corpus2, lab.with_role("head")[0], "tcp") == "192.168.50.12"
    assert nfs.server_address(lab, corpus2, lab.node("gpu3"), "tcp") == "192.168.60.12"  # named network first


def test_spread_takes_a_servers_nics_in_turn_by_the_clients_address() -> None:
    assert [nfs.spread(f"10.0.2.{i}", 2) for i in range(20, 25)] == [0, 1, 0, 1, 0]
    assert [nfs.spread(f"10.0.2.{i}", 3) for i in range(21, 25)] == [0, 1, 2, 0]  # 10.0.2.21 divides by 3
    assert {nfs.spread(f"10.0.2.{i}", 1) for i in range(1, 255)} == {0}


def two_nic_server(kit: Any, clients: int = 4, named: bool = True) -> Manifest:
    """head01 serves tank/data on the data network over two NICs (ens1 10.0.2.10, ens2
    10.0.2.11; ``named``: the second has its interface name); node01..node0<clients> mount it."""
    data = kit.base(storage=True)
    second = {"ip": "10.0.2.11", **({"interface": "ens2"} if named else {})}
    data["nodes"][0]["interfaces"]["data"] = [{"ip": "10.0.2.10", "interface": "ens1"}, second]
    data["nodes"][1]["name"] = f"node[01-{clients:02d}]"
    return kit.load(data).manifest  # type: ignore[no-any-return]


def test_clients_spread_over_a_servers_data_nics(kit: Any) -> None:
    """Issue 28: a server with two data NICs served every client from the first. Now the
    clients (10.0.2.21..24) take its NICs in turn, and the mount's rendered source says so."""
    m = two_nic_server(kit)
    export = nfs.export_by_name(m, "data")
    got = {n: nfs.server_address(m, export, m.node(n), "tcp") for n in ("node01", "node02", "node03", "node04")}
    assert got == {"node01": "10.0.2.11", "node02": "10.0.2.10", "node03": "10.0.2.11", "node04": "10.0.2.10"}
    assert nfs_client_vars(m, m.node("node02"))["nfs_client_mounts"][0]["what"] == "10.0.2.10:/tank/data"
    assert nfs_client_vars(m, m.node("node03"))["nfs_client_mounts"][0]["what"] == "10.0.2.11:/tank/data"
    # a client's choice is its own: more clients move none of the others
    more = two_nic_server(kit, clients=9)
    assert {n: nfs.server_address(more, export, more.node(n), "tcp") for n in got} == got
    # a NIC the OS does not configure (no interface name) is not mounted from
    unnamed = two_nic_server(kit, named=False)
    assert {nfs.server_address(unnamed, export, unnamed.node(n), "tcp") for n in got} == {"10.0.2.10"}


def test_a_single_nic_server_renders_its_clients_byte_for_byte_as_before(kit: Any) -> None:
    """The spread changes nothing where a server has one NIC on the network: the clients'
    variables (and so their fingerprints) stay as they were: the server's first address."""
    m = kit.load(kit.base(storage=True)).manifest
    export = nfs.export_by_name(m, "data")
    for name in ("node01", "node02"):
        node = m.node(name)
        assert nfs.server_address(m, export, node, "tcp") == nfs.node_network_ip(m.node("head01"), "data")
        assert nfs_client_vars(m, node)["nfs_client_mounts"][0]["what"] == "10.0.2.10:/tank/data"


def test_rdma_clients_spread_over_a_servers_roce_nics(kit: Any) -> None:
    data = kit.base(storage=True)
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 4200}
    data["nodes"][0]["interfaces"]["roce"] = [{"ip": "10.0.4.10", "interface": "ens3f0"},
                                              {"ip": "10.0.4.11", "interface": "ens3f1"}]
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens3f0"}
    data["nfs"]["exports"][0]["clients"] = ["roce"]
    data["nfs"]["mounts"][0]["proto"] = "rdma"
    m = kit.load(data).manifest
    export = nfs.export_by_name(m, "data")
    assert [nfs.server_address(m, export, m.node(n), "rdma") for n in ("node01", "node02")] == [
        "10.0.4.11", "10.0.4.10"]
    assert nfs_client_vars(m, m.node("node01"))["nfs_client_mounts"][0]["what"] == "10.0.4.11:/tank/data"


def test_validate_rejects_an_export_on_a_network_its_server_is_not_on(kit: Any) -> None:
    """clients: [infiniband] on a server without InfiniBand: every mount would be refused."""
    data = kit.base(storage=True)
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    data["nfs"]["exports"][0]["clients"] = ["infiniband"]
    with pytest.raises(ManifestError) as err:
        kit.load(data)
    paths = {d.path: d.message for d in err.value.diagnostics}
    assert "nfs.exports[0].clients[0]" in paths
    assert "head01 has no infiniband interface" in paths["nfs.exports[0].clients[0]"]
    data["nfs"]["exports"][0]["clients"] = ["infiniband", "data"]  # still names a network head01 is not on
    assert [d.path for d in kit.errors(data)] == ["nfs.exports[0].clients[0]"]
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    m = kit.load(data).manifest  # head01 on the fabric too: the clients mount over it, first in the list
    assert nfs.server_address(m, m.nfs.exports[0], m.node("node01"), "tcp") == "10.0.3.10"


def test_mount_options_defaults_and_overrides() -> None:
    mnt = NfsMount(export="x", path="/x", nodes=["n"])
    assert nfs.mount_options(mnt, "tcp") == [
        "vers=4.2", "proto=tcp", "nconnect=8", "rsize=1048576", "wsize=1048576", "hard", "_netdev"
    ]
    custom = NfsMount(export="x", path="/x", nodes=["n"], vers="3", hard=False, nconnect=2,
                      options=["nconnect=4", "noatime", "actimeo=60"])
    assert nfs.mount_options(custom, "tcp") == [
        "vers=3", "proto=tcp", "rsize=1048576", "wsize=1048576", "soft", "_netdev",
        "nconnect=4", "noatime", "actimeo=60",
    ]


def test_one_path_per_server_for_nfs4_clients(llm: Manifest) -> None:
    llm = llm.model_copy(deep=True)  # the fixture is shared
    gpu01 = llm.node("gpu01")
    nfs.check_one_path_per_server(llm, gpu01)  # every export of head01 over the fabric
    nfs.export_by_name(llm, "home").clients = ["management"]
    with pytest.raises(base.StorageError, match=r"mounts /data and /home/shared reach server head01 over "
                       r"10\.10\.2\.10 \(rdma\) and 10\.10\.0\.10 \(tcp\)"):
        nfs.check_one_path_per_server(llm, gpu01)
    # NFSv3 has no session trunking: a v3 mount may take another path
    home_mount = next(mnt for mnt in llm.nfs.mounts if mnt.export == "home")
    home_mount.vers = "3"
    nfs.check_one_path_per_server(llm, gpu01)


def test_one_path_per_server_is_a_validate_error(kit: Any) -> None:
    data = kit.example("llm-200k.yaml")
    for exp in data["nfs"]["exports"]:
        if exp["name"] == "home":
            exp["clients"] = ["management"]
    with pytest.raises(ManifestError, match=r"NFS 4.1\+ shares one connection per server"):
        kit.load(data)


def roce_manifest(kit: Any, clients: list[str], server_ib: bool = False, proto: str = "auto") -> Manifest:
    """head01 exports /data; head01 and node[01-02] on a RoCE fabric (head01 on InfiniBand
    too where ``server_ib``)."""
    data = kit.base(storage=True)
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    data["nodes"][0]["interfaces"]["roce"] = {"ip": "10.0.4.10", "interface": "ens2f0np0"}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0"}
    if server_ib:
        data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
        data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    data["nfs"]["exports"][0]["clients"] = clients
    data["nfs"]["mounts"][0]["proto"] = proto
    m: Manifest = kit.load(data).manifest
    return m


def test_nfs_over_rdma_on_roce(kit: Any) -> None:
    m = roce_manifest(kit, ["roce", "data"])
    mnt, exp, node01 = m.nfs.mounts[0], m.nfs.exports[0], m.node("node01")
    assert nfs.rdma_network(m, exp, node01) == "roce"
    assert nfs.mount_proto(m, mnt, node01) == "rdma"
    assert nfs.server_address(m, exp, node01, "rdma") == "10.0.4.10"
    # auto stays on TCP where the export does not serve the RoCE fabric
    m = roce_manifest(kit, ["data"])
    assert nfs.mount_proto(m, m.nfs.mounts[0], m.node("node01")) == "tcp"
    # ... and proto rdma still finds the fabric both ends share
    m = roce_manifest(kit, ["data", "roce"], proto="rdma")
    assert nfs.server_address(m, m.nfs.exports[0], m.node("node02"), "rdma") == "10.0.4.10"
    # a server on InfiniBand and RoCE serves a RoCE-only client over RoCE
    m = roce_manifest(kit, ["infiniband", "roce"], server_ib=True)
    assert nfs.rdma_network(m, m.nfs.exports[0], m.node("node01")) == "roce"
    assert nfs.server_address(m, m.nfs.exports[0], m.node("node01"), "rdma") == "10.0.4.10"


def test_rdma_mount_across_two_fabrics_is_refused(kit: Any) -> None:
    data = kit.base(storage=True)
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24"}
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0"}
    data["nfs"]["mounts"][0]["proto"] = "rdma"
    with pytest.raises(ManifestError, match=re.escape(
            "mount /data: proto rdma but node01 (roce) and head01 (infiniband) share no RDMA fabric")):
        kit.load(data)
    del data["nodes"][1]["interfaces"]["roce"]
    with pytest.raises(ManifestError, match="proto rdma but node01 has no infiniband interface"):
        kit.load(data)
