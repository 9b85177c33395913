"""provisioner.areas.storage.rolevars, checked against the roles' argument specs and templates.

The templates use plain Jinja2 only, so they are rendered here the way Ansible's template
module does (trim_blocks), with role defaults < inventory variables (< OS vars).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from provisioner import inventory
from provisioner.areas import registry as rolevars
from provisioner.areas.storage import rolevars as storage
from provisioner.areas.storage.scratch import scratch_disks
from provisioner.manifest import Manifest
from provisioner.validate import load_manifest
from tests.areas.roletemplates import body, render

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ["llm-200k.yaml", "music-lab.yaml"]
ROLES = ("scratch", "zfs", "nfs_server", "nfs_client", "mergerfs")
GROUP_KEYS = {
    "scratch": {"scratch_volume"},
    "zfs": {"zfs_pools", "zfs_arc_max_bytes", "zfs_snapshots"},
    "nfs_server": {"nfs_server_exports", "nfs_server_threads", "nfs_server_vers3", "nfs_server_rdma"},
    "nfs_client": {"nfs_client_mounts", "nfs_client_rdma"},
    "mergerfs": {"mergerfs_unions"},
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def example(name: str) -> Manifest:
    return load_manifest(ROOT / "examples" / name).manifest


def role_of(key: str) -> str:
    return next(r for r in sorted(ROLES, key=len, reverse=True) if key.startswith(r + "_"))


def role_vars(m: Manifest, node_name: str, role: str) -> dict[str, Any]:
    """Role defaults < cluster vars < node vars, for one role."""
    merged: dict[str, Any] = dict(load_yaml(ROOT / "roles" / role / "defaults" / "main.yml") or {})
    both = storage.cluster_vars(m) | storage.node_vars(m, m.node(node_name))
    merged.update({k: v for k, v in both.items() if role_of(k) == role})
    return merged


# =========================================================================== contract
@pytest.mark.parametrize("name", EXAMPLES)
def test_node_vars_only_for_group_members(name: str) -> None:
    m = example(name)
    for node in m.nodes:
        keys = set(storage.node_vars(m, node))
        groups = [*storage.storage_groups(m, node), *(["scratch"] if scratch_disks(node) else [])]
        wanted = set().union(*(GROUP_KEYS[g] for g in groups))
        assert keys == wanted, node.name


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_variable_passes_the_role_argument_spec(name: str) -> None:
    m = example(name)
    specs = {r: load_yaml(ROOT / "roles" / r / "meta" / "argument_specs.yml")["argument_specs"] for r in ROLES}
    emitted: set[str] = set(storage.cluster_vars(m))
    for node in m.nodes:
        emitted |= set(storage.node_vars(m, node))
        for role in ROLES:
            params = role_vars(m, node.name, role)
            result = ArgumentSpecValidator(specs[role]["main"]["options"]).validate(params)
            assert not result.error_messages, (node.name, role, result.error_messages)
            assert not result.unsupported_parameters, (node.name, role, result.unsupported_parameters)
    for key in emitted:
        assert key in specs[role_of(key)]["main"]["options"], key


def test_variables_are_produced_by_the_aggregator(llm: Manifest) -> None:
    assert rolevars.cluster_vars(llm)["storage"] == storage.cluster_vars(llm)
    merged = rolevars.node_vars(llm, llm.node("head01"))
    for key, value in storage.node_vars(llm, llm.node("head01")).items():
        assert merged[key] == value


# =========================================================================== llm-200k
def test_llm_cluster_vars(llm: Manifest) -> None:
    assert storage.cluster_vars(llm) == {"zfs_scrub": "monthly"}


def test_llm_head_pool(llm: Manifest) -> None:
    v = storage.node_vars(llm, llm.node("head01"))
    assert v["zfs_arc_max_bytes"] == 64 * 1024**3  # 50 % of 128 GiB
    (tank,) = v["zfs_pools"]
    assert tank["name"] == "tank" and tank["force"] is False
    assert tank["summary"] == "4 x mirror(2) + log: 1 disk + cache: 1 disk"
    assert tank["create_args"][:3] == ["create", "-o", "ashift=12"]
    assert tank["create_args"].count("mirror") == 4
    assert len(tank["disks"]) == 10
    assert tank["datasets"] == [
        {"name": "tank/datasets", "properties": {"atime": "off", "compression": "lz4", "recordsize": "1M"}},
        {"name": "tank/checkpoints", "properties": {"compression": "zstd", "recordsize": "1M"}},
        {"name": "tank/home", "properties": {"quota": "2T", "recordsize": "128K"}},
    ]
    assert v["zfs_snapshots"] == {"tank/checkpoints": {"daily": 7},
                                  "tank/home": {"hourly": 24, "daily": 14, "weekly": 8, "monthly": 12}}


def test_llm_exports_and_nfsd(llm: Manifest) -> None:
    variables = role_vars(llm, "head01", "nfs_server")
    assert variables["nfs_server_threads"] == 64  # 16 cores
    assert variables["nfs_server_rdma"] is True  # gpu nodes mount with proto=rdma
    assert variables["nfs_server_vers3"] is False
    assert body(render("nfs_server", "exports.j2", variables)) == [
        "/tank/datasets 10.10.2.0/24(rw,sync,root_squash,no_subtree_check)",
        "/tank/checkpoints 10.10.2.0/24(rw,sync,root_squash,no_subtree_check)",
        "/tank/home 10.10.2.0/24(rw,sync,root_squash,no_subtree_check)",
    ]
    conf = body(render("nfs_server", "nfs.conf.j2", variables))
    assert conf == ["[nfsd]", "threads=64", "vers3=n", "vers4=y", "vers4.0=n", "vers4.1=y",
                    "vers4.2=y", "rdma=y", "rdma-port=20049"]


def test_llm_gpu_mounts(llm: Manifest) -> None:
    variables = role_vars(llm, "gpu02", "nfs_client")
    assert variables["nfs_client_rdma"] is True
    by_path = {x["where"]: x for x in variables["nfs_client_mounts"]}
    assert set(by_path) == {"/data", "/checkpoints", "/home/shared"}
    data = by_path["/data"]
    assert data["what"] == "10.10.2.10:/tank/datasets"
    unit = body(render("nfs_client", "nfs.mount.j2", variables | {"item": data}))
    assert "What=10.10.2.10:/tank/datasets" in unit
    assert "Where=/data" in unit
    assert ("Options=vers=4.2,proto=rdma,port=20049,rsize=1048576,wsize=1048576,"
            "hard,_netdev") in unit  # no nconnect over RDMA
    assert "WantedBy=remote-fs.target" in unit
    home = by_path["/home/shared"]
    # served over the fabric like the other exports of head01 (one path per server)
    assert home["what"] == "10.10.2.10:/tank/home"
    assert home["unit"] == "home-shared.mount"
    assert "proto=rdma" in home["options"]


# =========================================================================== music-lab
def test_lab_pools_per_server(lab: Manifest) -> None:
    for name in ("store1", "store2"):
        v = storage.node_vars(lab, lab.node(name))
        (audio,) = v["zfs_pools"]
        assert audio["summary"] == "10 x mirror(3)"
        assert len(audio["layout"]["data"]) == 10
        assert v["zfs_arc_max_bytes"] == 128 * 1024**3
    assert storage.cluster_vars(lab)["zfs_scrub"] == "monthly"


def test_lab_arc_option_file(lab: Manifest) -> None:
    text = render("zfs", "zfs.conf.j2", role_vars(lab, "store1", "zfs"))
    assert body(text) == ["options zfs zfs_arc_max=137438953472"]
    assert "128.0 GiB" in text


def test_lab_exports_serve_the_data_network(lab: Manifest) -> None:
    for server, export in (("store1", "corpus1"), ("store2", "corpus2")):
        variables = role_vars(lab, server, "nfs_server")
        assert variables["nfs_server_rdma"] is False
        assert variables["nfs_server_exports"] == [{
            "name": export, "path": "/audio/corpus", "clients": ["192.168.60.0/24"],
            "options": ["rw", "sync", "root_squash", "no_subtree_check"], "create_path": False,
        }]


def test_lab_union_after_both_nfs_mounts(lab: Manifest) -> None:
    variables = role_vars(lab, "gpu2", "mergerfs")
    (union,) = variables["mergerfs_unions"]
    assert union["unit"] == "corpus.mount"
    assert union["requires"] == ["mnt-corpus1.mount", "mnt-corpus2.mount"]
    unit = body(render("mergerfs", "mergerfs.mount.j2", variables | {"item": union}))
    assert unit == [
        "[Unit]",
        "Description=MergerFS union /corpus of /mnt/corpus1 /mnt/corpus2",
        "Documentation=https://github.com/trapexit/mergerfs",
        "RequiresMountsFor=/mnt/corpus1 /mnt/corpus2",
        "Requires=mnt-corpus1.mount mnt-corpus2.mount",
        "After=mnt-corpus1.mount mnt-corpus2.mount",
        "[Mount]",
        "What=/mnt/corpus1:/mnt/corpus2",
        "Where=/corpus",
        "Type=fuse.mergerfs",
        "Options=allow_other,cache.files=partial,dropcacheonclose=true,category.create=mfs,"
        "minfreespace=500G,_netdev",
        "[Install]",
        "WantedBy=remote-fs.target",
    ]
    mounts = role_vars(lab, "gpu2", "nfs_client")["nfs_client_mounts"]
    assert [x["unit"] for x in mounts] == union["requires"]
    assert [x["what"] for x in mounts] == ["192.168.60.11:/audio/corpus", "192.168.60.12:/audio/corpus"]
    assert all("nconnect=16" in x["options"] for x in mounts)


def test_automount_units(kit: Any) -> None:
    data = kit.base(storage=True)
    data["nfs"]["mounts"][0]["automount"] = True
    m = kit.load(data).manifest
    variables = role_vars(m, "node01", "nfs_client")
    (mount,) = variables["nfs_client_mounts"]
    assert (mount["unit"], mount["automount_unit"]) == ("data.mount", "data.automount")
    unit = body(render("nfs_client", "nfs.mount.j2", variables | {"item": mount}))
    assert "[Install]" not in unit  # started by its automount unit
    auto = body(render("nfs_client", "nfs.automount.j2", variables | {"item": mount}))
    assert auto[-4:] == ["Where=/data", "TimeoutIdleSec=600", "[Install]", "WantedBy=remote-fs.target"]
    # /data is an NFS mount on node01: the union requires it and is a network mount
    union = role_vars(m, "node01", "mergerfs")["mergerfs_unions"][0]
    assert union["requires"] == ["data.mount"]
    assert "_netdev" in union["options"]


@pytest.mark.parametrize("name", ["llm-200k.yaml", "music-lab.yaml"])
def test_storage_groups_match_the_inventory(name: str) -> None:
    m = load_manifest(ROOT / "examples" / name).manifest
    groups = inventory.groups(m)
    for node in m.nodes:
        for group in ("zfs", "nfs_server", "nfs_client", "mergerfs"):
            assert (group in storage.storage_groups(m, node)) == (node.name in groups[group]), (node.name, group)
