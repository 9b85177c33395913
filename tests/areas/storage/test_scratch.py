"""Local scratch (provisioner.areas.storage.scratch): the volume a node's disks become, the
disk-safety decision the scratch role takes on the node (through its filter plugin), and
validate's checks of the paths that must live on scratch."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

from provisioner.areas.storage import scratch as S
from provisioner.areas.storage.base import StorageError
from provisioner.areas.storage.disks import DiskProbe
from provisioner.inventory import build, groups
from provisioner.manifest.nodes import Node, Scratch
from provisioner.plan import compute, fingerprint, load_plays, node_sections
from provisioner.state import NodeState, State
from provisioner.validate import load_manifest

ROOT = Path(__file__).resolve().parents[3]
PLAYS = load_plays(ROOT / "playbooks" / "site.yml")


def node(disks: list[dict[str, Any]], scratch: dict[str, Any] | None = None, **extra: Any) -> Node:
    data: dict[str, Any] = {
        "name": "gpu1", "roles": ["compute"],
        "interfaces": {"management": {"ip": "10.0.0.5"}},
        "hardware": {"cpu": {"cores_per_socket": 8}, "memory_gb": 64, "disks": disks},
        **extra,
    }
    if scratch is not None:
        data["scratch"] = scratch
    return Node.model_validate(data)


NVME = [{"id": "nvme-A", "use": "os"}, {"id": "nvme-S[1-2]", "kind": "nvme", "use": "scratch"}]


# =========================================================================== the volume
def test_no_scratch_disk_no_volume() -> None:
    assert S.scratch_volume(node([{"id": "nvme-A", "use": "os"}])) is None


def test_scratch_settings_without_a_scratch_disk_are_an_error() -> None:
    with pytest.raises(StorageError, match=r"no disk in hardware\.disks has use: scratch"):
        S.scratch_volume(node([{"id": "nvme-A", "use": "os"}], {"path": "/scratch"}))


def test_one_disk_is_one_partition_mounted_by_id() -> None:
    volume = S.scratch_volume(node([{"id": "nvme-S1", "use": "scratch"}]))
    assert volume is not None
    got = volume.to_vars()
    assert (got["layout"], got["fs"], got["path"]) == ("single", "xfs", "/scratch")
    assert got["members"] == ["/dev/disk/by-id/nvme-S1-part1"]
    assert got["device"] == "/dev/disk/by-id/nvme-S1-part1"
    assert got["mount_options"] == "noatime,nofail"
    assert got["mkfs_options"] == "-L scratch"
    assert (got["label"], got["partlabel"], got["force"]) == ("scratch", "provision-scratch", False)
    assert got["summary"] == "1 disk, xfs at /scratch"


def test_several_disks_are_raid0_by_mdadm_by_default() -> None:
    volume = S.scratch_volume(node(NVME))
    assert volume is not None
    assert volume.layout == "mdadm" and volume.disks == ("nvme-S1", "nvme-S2")
    assert volume.members == ["/dev/disk/by-id/nvme-S1-part1", "/dev/disk/by-id/nvme-S2-part1"]
    assert volume.device == "/dev/disk/by-id/md-name-any:scratch"
    assert volume.summary() == "2 disks, RAID 0 (mdadm), xfs at /scratch"


def test_several_disks_as_a_striped_lv_on_ext4_with_own_options() -> None:
    volume = S.scratch_volume(node(NVME, {"path": "/local", "fs": "ext4", "raid": "lvm",
                                           "options": ["discard", "nofail"], "force": True}))
    assert volume is not None
    assert volume.device == "/dev/disk/by-id/dm-name-scratch-scratch"
    assert volume.to_vars()["mkfs_options"] == "-L scratch -m 0"  # no root reserve on scratch
    assert volume.options == ("noatime", "discard", "nofail")
    assert volume.force and volume.summary() == "2 disks, striped LVM, ext4 at /local"


def test_a_disk_listed_twice_is_an_error() -> None:
    disks = [{"id": "nvme-S1", "use": "scratch"}, {"id": "nvme-S[1-2]", "use": "scratch"}]
    with pytest.raises(StorageError, match="'nvme-S1' is listed twice"):
        S.scratch_volume(node(disks))


@pytest.mark.parametrize(("field", "value", "words"), [
    ("path", "/", "system path"),
    ("path", "/etc/scratch", "system path"),
    ("path", "scratch", "absolute path"),
    ("fs", "btrfs", "'xfs' or 'ext4'"),
    ("raid", "zfs", "'mdadm' or 'lvm'"),
    ("options", ["noatime,discard"], "one mount option per list item"),
])
def test_bad_scratch_settings_are_refused(field: str, value: Any, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        Scratch.model_validate({field: value})


# =========================================================================== on the node
def test_volume_ready_needs_our_type_and_label() -> None:
    ours = "DEVNAME=/dev/md127\nLABEL=scratch\nUUID=1b2c\nBLOCK_SIZE=512\nTYPE=xfs\nUSAGE=filesystem\n"
    assert S.volume_ready(ours, "xfs")
    assert not S.volume_ready(ours, "ext4")
    assert not S.volume_ready(ours.replace("LABEL=scratch", "LABEL=data"), "xfs")
    assert not S.volume_ready("", "xfs")  # no signature, or no such device (blkid rc 2)


def lsblk(name: str, *, pttype: str | None = None, fstype: str | None = None, mountpoint: str | None = None,
          parts: list[dict[str, Any]] | None = None) -> str:
    dev: dict[str, Any] = {"name": name, "type": "disk", "fstype": fstype, "pttype": pttype, "partlabel": None,
                           "mountpoint": mountpoint}
    if parts:
        dev["children"] = parts
    return json.dumps({"blockdevices": [dev]})


def part(name: str, label: str | None = S.PARTLABEL, fstype: str | None = None, mountpoint: str | None = None,
         children: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": "part", "fstype": fstype, "pttype": "gpt", "partlabel": label,
                           "mountpoint": mountpoint}
    if children:
        out["children"] = children
    return out


GPT_SIGS = json.dumps({"signatures": [
    {"device": "vdb", "offset": "0x200", "type": "gpt", "uuid": None, "label": None},
    {"device": "vdb", "offset": "0x3ffffe00", "type": "gpt", "uuid": None, "label": None},
    {"device": "vdb", "offset": "0x1fe", "type": "PMBR", "uuid": None, "label": None},
]})
EXT4_SIGS = json.dumps({"signatures": [
    {"device": "vdc", "offset": "0x438", "type": "ext4", "uuid": "cdb5", "label": "keepme"}]})


def probe(disk: str, lsblk_text: str, wipefs_text: str = "", exists: bool = True) -> DiskProbe:
    return DiskProbe.from_outputs(disk, exists, lsblk_text, wipefs_text)


def test_a_blank_disk_may_be_used() -> None:
    verdict = S.scratch_safety([probe("virtio-a", lsblk("vdb"))], force=False)
    assert verdict.ok and verdict.refused == () and verdict.overridden == ()


def test_a_disk_with_a_filesystem_is_refused_without_force() -> None:
    p = probe("virtio-keep", lsblk("vdc", fstype="ext4"), EXT4_SIGS)
    verdict = S.scratch_safety([p], force=False)
    assert not verdict.ok
    assert verdict.refused == ("virtio-keep: holds a ext4 signature",)
    forced = S.scratch_safety([p], force=True)
    assert forced.ok and forced.overridden == ("virtio-keep: holds a ext4 signature",)
    assert S.wipe_targets([p]) == ["/dev/vdc"]


def test_a_foreign_partition_table_is_refused() -> None:
    p = probe("virtio-a", lsblk("vdb", pttype="gpt", parts=[part("vdb1", label="EFI System", fstype="vfat")]),
              GPT_SIGS)
    verdict = S.scratch_safety([p], force=False)
    assert not verdict.ok
    assert "virtio-a: has a gpt partition table" in verdict.refused
    assert "virtio-a: has part vdb1 (vfat)" in verdict.refused
    assert "virtio-a: carries a PMBR signature at offset 0x1fe" in verdict.refused
    # forced: the partition's signatures go first, then the disk's table
    assert S.wipe_targets([p]) == ["/dev/vdb1", "/dev/vdb"]


def test_our_own_empty_partition_is_no_data() -> None:
    """A first run that stopped after partitioning: the disk is picked up again."""
    p = probe("virtio-a", lsblk("vdb", pttype="gpt", parts=[part("vdb1")]), GPT_SIGS)
    assert S.scratch_safety([p], force=False).ok
    assert S.wipe_targets([p]) == []


@pytest.mark.parametrize("inside", [
    {"fstype": "xfs"},  # a file system (of a volume whose label is not ours: blkid said not ready)
    {"fstype": "linux_raid_member"},  # an array member
    {"fstype": "LVM2_member"},
    {"children": [{"name": "md127", "type": "raid0", "fstype": None, "mountpoint": None}]},
])
def test_our_partition_holding_anything_is_data(inside: dict[str, Any]) -> None:
    p = probe("virtio-a", lsblk("vdb", pttype="gpt", parts=[part("vdb1", **inside)]), GPT_SIGS)
    verdict = S.scratch_safety([p], force=False)
    assert not verdict.ok and "virtio-a: has a gpt partition table" in verdict.refused


def test_a_second_partition_is_not_ours() -> None:
    p = probe("virtio-a", lsblk("vdb", pttype="gpt", parts=[part("vdb1"), part("vdb2", label="data")]), GPT_SIGS)
    assert not S.scratch_safety([p], force=False).ok


def test_a_mounted_or_missing_disk_is_refused_even_with_force() -> None:
    mounted = probe("virtio-a", lsblk("vdb", pttype="gpt", parts=[part("vdb1", fstype="xfs", mountpoint="/data")]))
    missing = probe("virtio-gone", "", exists=False)
    verdict = S.scratch_safety([mounted, missing], force=True)
    assert not verdict.ok
    assert "virtio-a: vdb1 is in use (mounted at /data)" in verdict.refused
    assert "virtio-gone: not present under /dev/disk/by-id" in verdict.refused


def test_a_leftover_signature_beside_our_table_is_data() -> None:
    sigs = json.loads(GPT_SIGS)
    sigs["signatures"].append({"device": "vdb", "offset": "0x3fffc000", "type": "zfs_member"})
    p = probe("virtio-a", lsblk("vdb", pttype="gpt", parts=[part("vdb1")]), json.dumps(sigs))
    verdict = S.scratch_safety([p], force=False)
    assert not verdict.ok
    assert verdict.refused == ("virtio-a: carries a zfs_member signature at offset 0x3fffc000 "
                               "(a ZFS label: an old or foreign pool)",)


# --------------------------------------------------------------------------- the filter plugin
def _plugin() -> ModuleType:
    path = ROOT / "roles" / "scratch" / "filter_plugins" / "scratch_storage.py"
    spec = importlib.util.spec_from_file_location("scratch_storage", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_filter_plugin_decides_from_the_registered_loops() -> None:
    """The role's two loops, as Ansible registers them: a blank disk, one with ext4, one absent."""
    f = _plugin().FilterModule().filters()
    lsblk_results = [
        {"item": "virtio-a", "rc": 0, "stdout": lsblk("vdb")},
        {"item": "virtio-keep", "rc": 0, "stdout": lsblk("vdc", fstype="ext4")},
        {"item": "virtio-gone", "rc": 32, "stdout": "", "stderr": "lsblk: not a block device"},
    ]
    wipefs_results = [
        {"item": "virtio-a", "rc": 0, "stdout": ""},
        {"item": "virtio-keep", "rc": 0, "stdout": EXT4_SIGS},
        {"item": "virtio-gone", "rc": 1, "stdout": ""},
    ]
    verdict = f["scratch_disk_safety"](lsblk_results, wipefs_results, False)
    assert verdict == {"ok": False, "refused": ["virtio-keep: holds a ext4 signature",
                                                "virtio-gone: not present under /dev/disk/by-id"],
                       "overridden": [], "wipe": []}
    forced = f["scratch_disk_safety"](lsblk_results[:2], wipefs_results[:2], True)
    assert forced["ok"] and forced["wipe"] == ["/dev/vdc"]
    assert f["scratch_volume_ready"]("LABEL=scratch\nTYPE=ext4\n", "ext4") is True
    assert f["scratch_volume_ready"](None, "ext4") is False


# =========================================================================== validate
def test_docker_data_root_on_scratch_validates(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"data_root": "/scratch/docker"}
    loaded = kit.load(data)
    assert [w.path for w in loaded.warnings if "scratch" in w.message] == []


def test_docker_data_root_on_no_scratch_is_an_error_at_its_line(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"data_root": "/nvme/docker"}
    text = kit.dump(data)
    errors = kit.errors(data)
    ours = [e for e in errors if e.path == "docker.data_root"]
    assert len(ours) == 1, errors
    d = ours[0]
    assert d.line == kit.line_of(text, "data_root: /nvme/docker")
    assert d.message.startswith("docker.data_root /nvme/docker is on no file system the manifest makes on node01 "
                                "(its scratch is at /scratch)")
    assert d.message.endswith("(the same on node02)")


def test_docker_data_root_names_a_node_without_scratch(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["disks"] = []
    data["docker"] = {"data_root": "/scratch/docker"}
    [d] = [e for e in kit.errors(data) if e.path == "docker.data_root"]
    assert "(it has no disk with use: scratch)" in d.message and "node01" in d.message


def test_docker_data_root_on_the_mount_point_itself_is_an_error(kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"data_root": "/scratch"}
    [d] = [e for e in kit.errors(data) if e.path == "docker.data_root"]
    assert "is the mount point of node01's scratch itself; use a folder below it (e.g. /scratch/docker)" in d.message


@pytest.mark.parametrize("data_root", ["/var/lib/docker", "/var/lib/containers/docker"])
def test_docker_data_root_on_the_root_fs_is_fine(kit: Any, data_root: str) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["disks"] = []
    data["docker"] = {"data_root": data_root}
    kit.load(data)  # no error


def test_docker_data_root_on_a_zfs_dataset_is_fine(kit: Any) -> None:
    data = kit.base(storage=True)
    data["docker"] = {"nodes": ["head01"], "data_root": "/tank/data/docker"}
    kit.load(data)  # no error
    data["docker"]["data_root"] = "/srv/docker"
    [d] = [e for e in kit.errors(data) if e.path == "docker.data_root"]
    assert "on no file system the manifest makes on head01" in d.message


def test_scratch_settings_without_disks_are_an_error_at_the_node(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["disks"] = []
    data["nodes"][1]["scratch"] = {"path": "/scratch"}
    messages = [e.message for e in kit.errors(data)]
    assert any("scratch: is set, but no disk in hardware.disks has use: scratch" in m for m in messages), messages


def test_gpu_compute_nodes_without_scratch_warn_once_per_entry(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["disks"] = [{"id": "nvme-OS", "use": "os"}]
    loaded = kit.load(data)
    [w] = [w for w in loaded.warnings if "without local scratch" in w.message]
    assert w.path == "nodes[1].hardware.disks" and w.severity == "warning"
    assert w.message.startswith("node[01-02]: GPU compute node without local scratch")


def test_the_examples_put_docker_on_scratch() -> None:
    for name in ("llm-200k.yaml", "music-lab.yaml"):
        m = load_manifest(ROOT / "examples" / name).manifest
        for n in m.nodes:
            if n.gpu_count:
                volume = S.scratch_volume(n)
                assert volume is not None and S.under(m.docker.data_root, volume.path), (name, n.name)


# =========================================================================== inventory, plan
def test_inventory_puts_scratch_nodes_in_their_group_with_the_volume(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert groups(m)["scratch"] == ["node01", "node02"]
    files = build(m, source="m.yaml")
    host = json.loads(files["host_vars/node01.json"])
    assert host["scratch_volume"]["device"] == "/dev/disk/by-id/nvme-SCRATCH-part1"
    head = json.loads(files["host_vars/head01.json"])
    assert "scratch_volume" not in head


def test_plan_shows_the_format_where_the_storage_play_runs(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    plan = compute(m, State(), PLAYS)
    assert plan.formats == ["node01", "node02"]
    by = {n.name: n for n in plan.nodes}
    assert by["node01"].formats.startswith("scratch: formats nvme-SCRATCH where blank")
    assert "scratch" in by["node01"].plays and by["head01"].formats == ""
    # settled: nothing runs, nothing is said
    settled = State(nodes={n.name: NodeState(lifecycle="configured", fingerprints=node_sections(m, n))
                           for n in m.nodes})
    assert compute(m, settled, PLAYS).formats == []
    # force is said as such
    data = kit.base()
    data["nodes"][1]["scratch"] = {"force": True}
    forced = compute(kit.load(data).manifest, settled, PLAYS)
    assert forced.formats == ["node01", "node02"]
    assert {n.name: n.formats for n in forced.nodes}["node01"].startswith(
        "scratch FORCE: overwrites nvme-SCRATCH (1 disk, xfs at /scratch) even where they hold data")


def test_a_node_without_scratch_keeps_its_recorded_fingerprint(kit: Any) -> None:
    """States recorded before scratch existed stay valid: no new key in the node section."""
    m = kit.load(kit.base()).manifest
    head = m.node("head01")
    # the old dump: none of the fields added since (scratch; bonds, rdma_device, more, a disk's
    # per_node: issue 28)
    before = head.model_dump(mode="json", exclude={"bmc", "install", "install_method", "scratch", "bonds"})
    for iface in before["interfaces"].values():
        del iface["rdma_device"], iface["more"]
    for disk in before["hardware"]["disks"]:
        del disk["per_node"]
    assert node_sections(m, head)["node"] == fingerprint(before)
    data = kit.base()
    data["nodes"][0]["scratch"] = {"path": "/scratch"}
    data["nodes"][0]["hardware"]["disks"].append({"id": "nvme-S", "use": "scratch"})
    m2 = kit.load(data).manifest
    assert node_sections(m2, m2.node("head01"))["node"] != node_sections(m, head)["node"]


@pytest.mark.parametrize(("section", "value", "what"), [
    ("nfs", {"exports": [{"name": "d", "node": "head01", "path": "/srv/d"}],
             "mounts": [{"export": "d", "path": "/scratch", "nodes": ["@compute"]}]}, "the NFS mount of export 'd'"),
    ("mergerfs", [{"path": "/scratch", "branches": ["/a", "/b"], "nodes": ["node01"]}], "a MergerFS union"),
])
def test_scratch_sharing_a_mount_point_is_an_error_at_its_path(kit: Any, section: str, value: Any,
                                                               what: str) -> None:
    data = kit.base()
    data["nodes"][1]["scratch"] = {"path": "/scratch"}
    data[section] = value
    text = kit.dump(data)
    [d] = [e for e in kit.errors(data) if "would hide the other" in e.message]
    assert d.path == "nodes[1].scratch.path"
    assert d.line == kit.line_of(text, "path: /scratch")
    assert d.message.startswith(f"scratch.path /scratch is also the mount point of {what} on node01")
