"""provisioner.areas.slurm.rolevars, and the role's templates rendered with its output.

The templates (roles/slurm/templates) use plain Jinja2 only, so they are rendered here the
way Ansible's template module does (trim_blocks), with variables layered like Ansible:
role defaults < inventory (cluster_vars, node_vars) < the role's OS vars file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from provisioner.areas.slurm import rolevars
from provisioner.areas.slurm.releases import problems
from provisioner.manifest import Manifest
from provisioner.platforms import PLATFORMS, os_vars_path

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "slurm"
MUNGE = ROOT / "roles" / "munge"
EXAMPLES = ["llm-200k.yaml", "music-lab.yaml"]
OS_VARS = {name: os_vars_path(ROLE / "vars", p) for name, p in PLATFORMS.items()}  # what include_vars finds


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def example(kit: Any, name: str) -> Manifest:
    m: Manifest = kit.load(kit.example(name), name).manifest
    return m


def role_vars(m: Manifest, node_name: str) -> dict[str, Any]:
    node = m.node(node_name)
    merged: dict[str, Any] = dict(load_yaml(ROLE / "defaults" / "main.yml"))
    merged.update(rolevars.cluster_vars(m))
    merged.update(rolevars.node_vars(m, node))
    merged.update(load_yaml(OS_VARS[node.os]))
    return merged


def render(template: str, variables: dict[str, Any]) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROLE / "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
    )
    return env.get_template(template).render(**variables)


def config_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def keys(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        if line.startswith(("NodeName=", "PartitionName=")):
            continue
        key, _, value = line.partition("=")
        assert key not in out, f"{key} set twice"
        out[key] = value
    return out


def spec_options(role: Path, entry: str) -> set[str]:
    specs = load_yaml(role / "meta" / "argument_specs.yml")["argument_specs"]
    return set(specs[entry]["options"])


# --------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", EXAMPLES)
def test_emitted_variables_are_declared(kit: Any, name: str) -> None:
    m = example(kit, name)
    declared = spec_options(ROLE, "main") | spec_options(MUNGE, "main")
    config = spec_options(ROLE, "config")
    cluster = rolevars.cluster_vars(m)
    assert set(cluster) <= declared
    assert set(cluster) - {"munge_key_file"} <= config
    for node in m.nodes:
        emitted = rolevars.node_vars(m, node)
        assert set(emitted) <= declared & config, node.name
    defaults = set(load_yaml(ROLE / "defaults" / "main.yml"))
    assert spec_options(ROLE, "main") - {"slurm_controller_host"} == defaults


def test_munge_key_file_points_into_the_state_directory(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")
    assert rolevars.cluster_vars(m)["munge_key_file"] == "{{ provision_state_dir }}/secrets/munge.key"
    assert rolevars.MUNGE_KEY_FILE.endswith(rolevars.MUNGE_KEY_RELATIVE)


def test_llm_cluster_vars(kit: Any) -> None:
    v = rolevars.cluster_vars(example(kit, "llm-200k.yaml"))
    assert v["slurm_cluster_name"] == "llm200k"
    assert v["slurm_controller_host"] == "head01"
    assert v["slurm_accounting"] is True
    assert v["slurm_proctrack_type"] == "proctrack/linuxproc"  # Ubuntu 22.04: Slurm 21.08 on cgroup v2
    assert v["slurm_constrain_devices"] is False
    assert v["slurm_def_mem_per_cpu"] == (256 * 1024 - 13107) // 48


def test_music_lab_cluster_vars(kit: Any) -> None:
    v = rolevars.cluster_vars(example(kit, "music-lab.yaml"))
    assert v["slurm_cluster_name"] == "musiclab"
    assert v["slurm_accounting"] is False
    assert (v["slurm_proctrack_type"], v["slurm_task_plugin"]) == ("proctrack/cgroup", "task/cgroup,task/affinity")
    assert v["slurm_constrain_cores"] and v["slurm_constrain_memory"] and v["slurm_constrain_devices"]


def test_cluster_name_override(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["cluster_name"] = "Blue"
    assert rolevars.cluster_vars(kit.load(data).manifest)["slurm_cluster_name"] == "blue"


def test_node_vars_per_role(kit: Any) -> None:
    m = example(kit, "music-lab.yaml")
    head = rolevars.node_vars(m, m.head)
    assert head == {"slurm_is_controller": True, "slurm_is_compute": False, "slurm_node_gres": [],
                    "slurm_node_expected": {}, "slurm_node_mounts": []}
    gpu = rolevars.node_vars(m, m.node("gpu2"))
    assert gpu["slurm_is_controller"] is False and gpu["slurm_is_compute"] is True
    assert gpu["slurm_node_gres"] == [{"name": "gpu", "type": "rtx3090", "file": "/dev/nvidia[0-1]"}]
    assert gpu["slurm_node_expected"] == {
        "name": "gpu2", "cpus": 48, "real_memory_mb": 256 * 1024 - 13107, "memory_gb": 256,
        "gpu_count": 2, "gpu_type": "rtx3090", "gpu_files": "/dev/nvidia[0-1]"}
    # what the health check insists on: its NFS mounts and the MergerFS union over them
    assert gpu["slurm_node_mounts"] == ["/corpus", "/mnt/corpus1", "/mnt/corpus2"]
    # storage nodes are not Slurm nodes
    assert rolevars.node_vars(m, m.node("store1")) == {}
    assert not rolevars.is_slurm_node(m, m.node("store1"))


def test_login_node_is_a_client(kit: Any) -> None:
    data = kit.base()
    data["nodes"].append({"name": "login01", "roles": ["login"], "os": "ubuntu-24.04",
                          "interfaces": {"management": {"ip": "10.0.0.50"}},
                          "hardware": {"cpu": {"cores_per_socket": 4}, "memory_gb": 16}})
    m = kit.load(data).manifest
    assert rolevars.is_slurm_node(m, m.node("login01"))
    assert rolevars.node_vars(m, m.node("login01")) == {
        "slurm_is_controller": False, "slurm_is_compute": False, "slurm_node_gres": [], "slurm_node_expected": {},
        "slurm_node_mounts": []}


def test_disabled_slurm_emits_nothing(kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False}
    m = kit.load(data).manifest
    assert rolevars.cluster_vars(m) == {}
    assert all(rolevars.node_vars(m, n) == {} for n in m.nodes)


# --------------------------------------------------------------------------- slurm.conf
@pytest.mark.parametrize("name", EXAMPLES)
def test_slurm_conf_identical_on_every_node(kit: Any, name: str) -> None:
    m = example(kit, name)
    texts = {render("slurm.conf.j2", role_vars(m, n.name)) for n in m.nodes if rolevars.is_slurm_node(m, n)}
    assert len(texts) == 1


def test_llm_slurm_conf(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")
    lines = config_lines(render("slurm.conf.j2", role_vars(m, "gpu03")))
    assert [line for line in lines if line.startswith("NodeName=")] == [
        "NodeName=gpu[01-04] Sockets=1 CoresPerSocket=24 ThreadsPerCore=2 RealMemory=249037 "
        "Gres=gpu:rtx_a6000:2 State=UNKNOWN"
    ]
    assert [line for line in lines if line.startswith("PartitionName=")] == [
        "PartitionName=gpu Nodes=gpu[01-04] Default=YES MaxTime=7-00:00:00 State=UP"
    ]
    k = keys(lines)
    assert k["ClusterName"] == "llm200k"
    assert k["SlurmctldHost"] == "head01"
    assert k["SelectType"] == "select/cons_tres"
    assert k["SelectTypeParameters"] == "CR_Core_Memory"
    assert k["GresTypes"] == "gpu"
    assert k["AuthType"] == "auth/munge"
    assert k["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert k["AccountingStorageHost"] == "head01"
    assert k["AccountingStorageTRES"] == "gres/gpu"
    assert k["ProctrackType"] == "proctrack/linuxproc"
    assert k["TaskPlugin"] == "task/affinity"
    assert k["StateSaveLocation"] == "/var/lib/slurm/slurmctld"
    assert k["DefMemPerCPU"] == str((256 * 1024 - 13107) // 48)


def test_music_lab_slurm_conf(kit: Any) -> None:
    m = example(kit, "music-lab.yaml")
    lines = config_lines(render("slurm.conf.j2", role_vars(m, m.head.name)))
    assert [line for line in lines if line.startswith(("NodeName=", "PartitionName="))] == [
        "NodeName=gpu[1-3] Sockets=1 CoresPerSocket=24 ThreadsPerCore=2 RealMemory=249037 "
        "Gres=gpu:rtx3090:2 State=UNKNOWN",
        "PartitionName=gpu Nodes=gpu[1-3] Default=YES MaxTime=2-00:00:00 State=UP",
        "PartitionName=debug Nodes=gpu1 Default=NO MaxTime=01:00:00 State=UP",
    ]
    k = keys(lines)
    assert k["ClusterName"] == "musiclab"
    assert k["SlurmctldHost"] == m.head.name == "labhead"
    assert k["AccountingStorageType"] == "accounting_storage/none"
    assert "AccountingStorageHost" not in k
    assert k["ProctrackType"] == "proctrack/cgroup"
    assert k["TaskPlugin"] == "task/cgroup,task/affinity"
    assert k["JobAcctGatherType"] == "jobacct_gather/cgroup"


def test_default_time_rendered(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["partitions"] = [{"name": "short", "nodes": ["@compute"], "max_time": "4:00:00",
                                    "default_time": "30"}]
    m = kit.load(data).manifest
    lines = config_lines(render("slurm.conf.j2", role_vars(m, "head01")))
    assert "PartitionName=short Nodes=node[01-02] Default=YES MaxTime=4:00:00 DefaultTime=30 State=UP" in lines


@pytest.mark.parametrize("name", EXAMPLES)
def test_restart_keys_cover_nodes_but_not_partitions(kit: Any, name: str) -> None:
    m = example(kit, name)
    v = role_vars(m, m.head.name)
    keys_text = render("restart-keys.j2", v)
    conf = render("slurm.conf.j2", v)
    node_lines = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert node_lines and all(line in keys_text.splitlines() for line in node_lines)
    assert "PartitionName=" not in keys_text
    assert "ProctrackType=" in keys_text and "SlurmctldHost=" in keys_text
    # every non-comment line of the keys file is a line of slurm.conf
    assert set(config_lines(keys_text)) <= set(config_lines(conf))


def test_adding_a_node_changes_restart_keys_and_partitions_do_not(kit: Any) -> None:
    data = kit.base()
    before = role_vars(kit.load(data).manifest, "head01")
    data["slurm"]["partitions"][0]["max_time"] = "1-00:00:00"
    changed_partition = role_vars(kit.load(data).manifest, "head01")
    assert render("restart-keys.j2", before) == render("restart-keys.j2", changed_partition)
    assert render("slurm.conf.j2", before) != render("slurm.conf.j2", changed_partition)
    data["nodes"][1]["name"] = "node[01-03]"
    added = role_vars(kit.load(data).manifest, "head01")
    assert render("restart-keys.j2", before) != render("restart-keys.j2", added)


# --------------------------------------------------------------------------- gres, cgroup
@pytest.mark.parametrize(("name", "node", "line"), [
    ("llm-200k.yaml", "gpu01", "Name=gpu Type=rtx_a6000 File=/dev/nvidia[0-1]"),
    ("music-lab.yaml", "gpu3", "Name=gpu Type=rtx3090 File=/dev/nvidia[0-1]"),
])
def test_gres_conf(kit: Any, name: str, node: str, line: str) -> None:
    m = example(kit, name)
    assert config_lines(render("gres.conf.j2", role_vars(m, node))) == [line]
    assert config_lines(render("gres.conf.j2", role_vars(m, m.head.name))) == []


def test_gres_conf_matches_slurm_conf_count(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["gpu"] = {"model": "NVIDIA A100-SXM4-80GB", "count": 8}
    m = kit.load(data).manifest
    v = role_vars(m, "node01")
    conf = render("slurm.conf.j2", v)
    assert "Gres=gpu:a100_sxm4_80gb:8" in conf
    assert config_lines(render("gres.conf.j2", v)) == ["Name=gpu Type=a100_sxm4_80gb File=/dev/nvidia[0-7]"]


def test_cgroup_conf_music_lab(kit: Any) -> None:
    m = example(kit, "music-lab.yaml")  # Ubuntu 24.04, Slurm 23.11
    assert config_lines(render("cgroup.conf.j2", role_vars(m, "gpu1"))) == [
        "CgroupPlugin=autodetect", "ConstrainCores=yes", "ConstrainRAMSpace=yes", "ConstrainDevices=yes"]


def test_cgroup_conf_llm(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")  # Ubuntu 22.04, Slurm 21.08: no CgroupPlugin key, no cgroups
    assert config_lines(render("cgroup.conf.j2", role_vars(m, "gpu01"))) == [
        "ConstrainCores=no", "ConstrainRAMSpace=no", "ConstrainDevices=no"]


def test_cgroup_conf_follows_manifest_switches(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12")
    data["slurm"].update({"constrain_cores": False, "constrain_memory": False})
    m = kit.load(data).manifest
    assert config_lines(render("cgroup.conf.j2", role_vars(m, "node02"))) == [
        "CgroupPlugin=autodetect", "ConstrainCores=no", "ConstrainRAMSpace=no", "ConstrainDevices=yes"]


def test_slurmdbd_conf_has_no_password(kit: Any) -> None:
    m = example(kit, "llm-200k.yaml")
    k = keys(config_lines(render("slurmdbd.conf.j2", role_vars(m, "head01"))))
    assert k["StorageType"] == "accounting_storage/mysql"
    assert k["StorageUser"] == "slurm" and k["StorageLoc"] == "slurm_acct_db"
    assert k["DbdHost"] == "head01"
    assert "StoragePass" not in k


def test_molecule_manifests_match_examples_rules(kit: Any) -> None:
    """The scenario's manifests load, and the added node only extends the first."""
    base = kit.load((ROOT / "molecule/slurm/manifests/base.yml").read_text()).manifest
    added = kit.load((ROOT / "molecule/slurm/manifests/added.yml").read_text()).manifest
    assert [n.name for n in added.nodes] == [*base.node_names(), "slurm-gpu03"]
    assert problems(base) == [] and problems(added) == []
    assert rolevars.cluster_vars(added)["slurm_nodes"][0]["name"] == "slurm-gpu[01-03]"


def test_light_keys_are_cluster_vars(kit: Any) -> None:
    data = kit.example("music-lab.yaml")
    data["users"] = [{"name": "trainee", "uid": 2001}]  # with people: pam_slurm_adopt's keys too
    data["slurm"]["containers"] = {"enabled": True}  # with containers: the registry logins' keys too
    v = rolevars.cluster_vars(kit.load(data).manifest)
    assert set(v) >= rolevars.LIGHT_KEYS
    assert not {"slurm_accounting", "munge_key_file", "slurm_controller_host"} & rolevars.LIGHT_KEYS


def test_fair_share_priority_with_accounting_and_enforcement_with_declared_accounts(kit: Any) -> None:
    data = kit.base()
    m = kit.load(data).manifest
    assert rolevars.cluster_vars(m)["slurm_fairshare"] is None
    assert "PriorityType" not in keys(config_lines(render("slurm.conf.j2", role_vars(m, "head01"))))
    data["slurm"]["accounting"] = True
    conf = keys(config_lines(render("slurm.conf.j2", role_vars(kit.load(data).manifest, "head01"))))
    assert (conf["PriorityType"], conf["PriorityWeightFairshare"]) == ("priority/multifactor", "10000")
    assert "AccountingStorageEnforce" not in conf  # accounts not declared: jobs need no association
    data["slurm"]["qos"] = [{"name": "low"}, {"name": "high", "priority": 10, "preempt": ["low"]}]
    data["slurm"]["accounts"] = [{"name": "lab", "qos": ["normal", "low", "high"]}]
    data["users"] = [{"name": "alice", "uid": 2001, "account": "lab"}]
    m = kit.load(data).manifest
    fairshare = rolevars.cluster_vars(m)["slurm_fairshare"]
    assert fairshare["assocs"] == [["alice", "lab"]] and fairshare["default_account"] == {"alice": "lab"}
    conf = keys(config_lines(render("slurm.conf.j2", role_vars(m, "head01"))))
    assert conf["AccountingStorageEnforce"] == "associations,limits,qos"
    assert (conf["PreemptType"], conf["PreemptMode"]) == ("preempt/qos", "REQUEUE")


# --------------------------------------------------------------------------- job tmp (issue 28 item 3)
def test_job_tmp_on_scratch_renders_job_container_tmpfs(kit: Any) -> None:
    """slurm.job_tmp: each job's /tmp under the compute nodes' scratch (job_container/tmpfs with
    PrologFlags=Contain, BasePath there) and TmpFS; unset, slurm.conf has none of it."""
    plain = keys(config_lines(render("slurm.conf.j2", role_vars(kit.load(kit.base()).manifest, "node01"))))
    assert not {"JobContainerType", "PrologFlags", "TmpFS"} & set(plain)
    data = kit.base()
    data["slurm"]["job_tmp"] = "/scratch/slurm"
    m = kit.load(data).manifest
    assert "slurm_job_tmp" in rolevars.LIGHT_KEYS  # slurm.conf's light play renders it
    variables = role_vars(m, "node01")
    k = keys(config_lines(render("slurm.conf.j2", variables)))
    assert (k["JobContainerType"], k["PrologFlags"], k["TmpFS"]) == ("job_container/tmpfs", "Contain", "/scratch/slurm")
    assert config_lines(render("job_container.conf.j2", variables)) == ["AutoBasePath=true", "BasePath=/scratch/slurm"]
    # plugins: a change restarts the daemons, not just scontrol reconfigure
    assert "JobContainerType=job_container/tmpfs" in render("restart-keys.j2", variables)


def test_job_tmp_must_lie_on_every_compute_nodes_scratch(kit: Any) -> None:
    data = kit.base()
    data["slurm"]["job_tmp"] = "/scratch"  # the mount point itself
    text = kit.dump(data)
    d = kit.error(text, "slurm.job_tmp /scratch is the mount point")
    assert d.line == kit.line_of(text, "job_tmp:") and d.path == "slurm.job_tmp"
    assert d.message == ("slurm.job_tmp /scratch is the mount point of node01's scratch itself; use a folder "
                         "below it (e.g. /scratch/slurm) (and 1 more compute node)")
    data["slurm"]["job_tmp"] = "/var/lib/slurm/jobs"  # the root disk on purpose, like the daemons' defaults
    assert kit.load(data).manifest.slurm.job_tmp == "/var/lib/slurm/jobs"
    data["slurm"]["job_tmp"] = "/scratch/slurm"
    data["nodes"][1]["hardware"]["disks"] = []  # node[01-02] without scratch: the root disk would fill
    assert kit.error(data, "job_tmp").message.startswith(
        "slurm.job_tmp /scratch/slurm is on no file system the manifest makes on node01 (it has no disk with "
        "use: scratch)")
    data["slurm"]["job_tmp"] = "scratch/slurm"
    assert "must be an absolute path" in kit.error(data, "absolute").message


# --------------------------------------------------------------------------- SSH only with a job (issue 29 item 3)
def test_ssh_only_with_job_renders_prolog_contain_and_the_admins_rule(kit: Any) -> None:
    """With people in the manifest: PrologFlags=Contain (a daemon setting: restarts), and the
    compute nodes' pam_access rules let root, the automation account and the admins in, and
    nobody else (pam_slurm_adopt decides for them); the variables are the role's own."""
    data = kit.base()
    data["users"] = [{"name": "alice", "uid": 2001}]
    m = kit.load(data).manifest
    variables = role_vars(m, "node01")
    emitted = set(rolevars.cluster_vars(m)) | set(rolevars.node_vars(m, m.node("node01")))
    assert emitted - {"munge_key_file"} <= spec_options(ROLE, "main")
    conf = keys(config_lines(render("slurm.conf.j2", variables)))
    assert conf["PrologFlags"] == "Contain" and "JobContainerType" not in conf
    assert "PrologFlags=Contain" in render("restart-keys.j2", variables)
    assert config_lines(render("access-slurm-adopt.conf.j2", variables)) == ["+:root ops:ALL", "-:ALL:ALL"]
    # with job_tmp too: one PrologFlags line
    data["slurm"]["job_tmp"] = "/scratch/slurm"
    conf = keys(config_lines(render("slurm.conf.j2", role_vars(kit.load(data).manifest, "node01"))))
    assert (conf["PrologFlags"], conf["JobContainerType"]) == ("Contain", "job_container/tmpfs")


def test_every_os_names_the_pam_slurm_adopt_package() -> None:
    """Debian 12, Ubuntu 22.04 and 24.04 ship libpam-slurm-adopt from their slurm-wlm source
    (packages.debian.org bookworm, packages.ubuntu.com jammy and noble)."""
    for file in OS_VARS.values():
        assert load_yaml(file)["slurm_os_pam_adopt_packages"] == ["libpam-slurm-adopt"]
