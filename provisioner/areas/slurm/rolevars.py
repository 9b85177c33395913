"""Variables for the ``munge`` and ``slurm`` roles (playbooks/slurm.yml).

Cluster-wide values (group_vars/all) describe the whole Slurm cluster, so every node
renders the same slurm.conf; node values (host_vars) say which daemons a node runs and
what hardware the manifest promises for it (checked against the node's facts).
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm import accounts, adopt, containers, repo
from provisioner.areas.slurm import decide as slurm
from provisioner.areas.slurm.munge import MUNGE_KEY_NAME
from provisioner.areas.slurm.releases import cgroup_plan
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

# The integrator puts `provision_state_dir` (the state directory on the control machine)
# into group_vars/all; provision apply creates the key there with munge.ensure_munge_key.
MUNGE_KEY_FILE = "{{ provision_state_dir }}/secrets/" + MUNGE_KEY_NAME
MUNGE_KEY_RELATIVE = "secrets/" + MUNGE_KEY_NAME

# Cluster-wide variables only the light config play needs (rolevars.LIGHT_KEYS): adding a
# node or changing partitions re-renders slurm.conf everywhere without re-running the
# heavy plays on settled nodes. The others install something (accounting: slurmdbd and
# MariaDB; controller host, cluster name: registration in the accounting database; the
# munge key) and need the heavy plays.
LIGHT_KEYS = frozenset({
    "slurm_nodes", "slurm_partitions", "slurm_def_mem_per_cpu", "slurm_proctrack_type",
    "slurm_task_plugin", "slurm_jobacct_gather_type", "slurm_constrain_cores",
    "slurm_constrain_memory", "slurm_constrain_devices", "slurm_fairshare", "slurm_prolog_dcgm",
    "slurm_job_tmp", "slurm_ssh_admins", "slurm_prolog_contain",
}) | containers.LIGHT_KEYS


def cluster_vars(m: Manifest) -> dict[str, Any]:
    if not m.slurm.enabled:
        return {}
    plan = cgroup_plan(m)
    return {
        "munge_key_file": MUNGE_KEY_FILE,
        "slurm_cluster_name": slurm.cluster_name(m),
        "slurm_controller_host": slurm.controller(m).name,
        "slurm_accounting": m.slurm.accounting,
        "slurm_nodes": slurm.node_definitions(m),
        "slurm_partitions": slurm.partitions(m),
        "slurm_def_mem_per_cpu": slurm.default_mem_per_cpu(m),
        "slurm_proctrack_type": plan.proctrack_type,
        "slurm_task_plugin": plan.task_plugin,
        "slurm_jobacct_gather_type": plan.jobacct_gather_type,
        "slurm_constrain_cores": plan.constrain_cores,
        "slurm_constrain_memory": plan.constrain_memory,
        "slurm_constrain_devices": plan.constrain_devices,
        # accounts, users' associations and QOS for slurmdbd; None: not managed
        "slurm_fairshare": accounts.to_vars(accounts.wanted(m)) if accounts.managed(m) else None,
        "slurm_prolog_dcgm": m.verify.prolog_diag,
        # job_container/tmpfs BasePath and TmpFS; "": jobs share the nodes' /tmp
        "slurm_job_tmp": m.slurm.job_tmp or "",
    } | containers.cluster_vars(m) | adopt.cluster_vars(m) | repo.cluster_vars(m)


def is_slurm_node(m: Manifest, node: Node) -> bool:
    """Members of the inventory group slurm_node: controller, slurmd nodes, login clients."""
    if not m.slurm.enabled:
        return False
    # the controller, the slurmd (compute) nodes and the clients (login nodes that are neither)
    return (node.name == slurm.controller(m).name or node.name in m.role_names("compute")
            or node.name in m.role_names("login"))


def groups(m: Manifest) -> dict[str, set[str]]:
    """The Slurm area's inventory groups -> members (all empty when Slurm is off)."""
    if not m.slurm.enabled:
        return {"slurm_controller": set(), "slurm_compute": set(), "slurm_node": set(), "slurm_containers": set()}
    return {
        "slurm_controller": {m.head.name} if m.with_role("head") else set(),
        "slurm_compute": {n.name for n in m.with_role("compute")},
        "slurm_node": {n.name for n in m.nodes if is_slurm_node(m, n)},
        # enroot + pyxis (role containers): compute and login nodes, when slurm.containers is on
        "slurm_containers": {n.name for n in m.nodes if containers.is_container_node(m, n)},
    }


def expected_hardware(node: Node) -> dict[str, Any]:
    """What the manifest promises for a slurmd node (compared with its facts by the role)."""
    hw = node.hardware
    gpu = hw.gpu
    return {
        "name": node.name,
        "cpus": hw.cpu.threads,
        "real_memory_mb": hw.real_memory_mb,
        "memory_gb": hw.memory_gb,
        "gpu_count": gpu.count if gpu else 0,
        "gpu_type": gpu.gres_type if gpu else "",
        "gpu_files": slurm.gpu_files(gpu.count) if gpu else "",
    }


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    if not is_slurm_node(m, node):
        return {}
    is_compute = node.has_role("compute")
    gpu = node.hardware.gpu
    gres = (
        [{"name": "gpu", "type": gpu.gres_type, "file": slurm.gpu_files(gpu.count)}]
        if is_compute and gpu else []
    )
    return {
        "slurm_is_controller": node.name == slurm.controller(m).name,
        "slurm_is_compute": is_compute,
        "slurm_node_gres": gres,
        "slurm_node_expected": expected_hardware(node) if is_compute else {},
        "slurm_node_mounts": slurm.shared_mounts(m, node) if is_compute else [],
    } | containers.node_vars(m, node) | adopt.node_vars(m, node)
