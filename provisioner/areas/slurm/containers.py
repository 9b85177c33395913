"""Containers in Slurm jobs: enroot + pyxis on the compute and login nodes (pure decisions).

The role ``containers`` builds enroot and pyxis from the pinned source tarballs (their
URLs and checksums are facts of the role's defaults, declared once there) and configures
them; this module decides, from the manifest alone, which nodes get them, where enroot keeps
its data and cache, where the sources come from, and what each OS needs so that an
unprivileged user may create the user namespace enroot runs in (the AppArmor decision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from provisioner.areas.slurm.releases import cgroup_plan
from provisioner.areas.storage.scratch import scratch_disks
from provisioner.manifest.fields import OsName
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node, Scratch

# Where enroot keeps each user's unpacked containers and layer cache without local scratch
# (NVIDIA's enroot.conf keeps them in the home directory, which is NFS on a cluster: slow,
# and squashfs/overlay files do not belong there).
DEFAULT_DATA_ROOT = "/var/lib/enroot"

AppArmorAction = Literal["none", "profile"]


@dataclass(frozen=True)
class AppArmorPlan:
    """What the node's OS needs so that enroot (as the job's user) may create a user namespace.

    ``action``: ``profile`` installs enroot's own AppArmor profile, which allows
    ``userns create`` for enroot-nsenter; ``none`` installs nothing. ``why`` is the reason, for
    the role's messages and the docs."""

    action: AppArmorAction
    why: str


def apparmor_plan(os_name: OsName) -> AppArmorPlan:
    """The AppArmor decision per OS.

    * Ubuntu 24.04 restricts unprivileged user namespaces through AppArmor
      (``kernel.apparmor_restrict_unprivileged_userns=1``): enroot needs its profile, which
      grants ``userns`` to enroot-nsenter alone (the restriction stays on for everything else).
    * Ubuntu 22.04 has no such restriction, and enroot's profile (``abi <abi/4.0>``,
      ``userns``) does not load on its AppArmor 3 (NVIDIA/enroot#201): install nothing.
    * Debian 12: no AppArmor restriction of user namespaces (its kernel allows unprivileged
      ones by default): nothing.
    """
    if os_name == "ubuntu-24.04":
        return AppArmorPlan("profile", "Ubuntu 24.04 restricts unprivileged user namespaces "
                                       "(kernel.apparmor_restrict_unprivileged_userns)")
    if os_name == "ubuntu-22.04":
        return AppArmorPlan("none", "Ubuntu 22.04 does not restrict user namespaces, and enroot's "
                                    "AppArmor 4 profile does not load there (NVIDIA/enroot#201)")
    return AppArmorPlan("none", "Debian 12 does not restrict unprivileged user namespaces")


def enabled(m: Manifest) -> bool:
    return m.slurm.enabled and m.slurm.containers.enabled


def is_container_node(m: Manifest, node: Node) -> bool:
    """Nodes that run jobs (compute) or submit them (login) get enroot and pyxis."""
    return enabled(m) and (node.name in m.role_names("compute") or node.name in m.role_names("login"))


def scratch_path(node: Node) -> str | None:
    """The node's local scratch mount point, or None when it has no ``use: scratch`` disk."""
    if not scratch_disks(node):
        return None
    return (node.scratch or Scratch()).path


def data_root(node: Node) -> str:
    """Where enroot keeps users' containers and its layer cache on ``node``: on local scratch
    where the manifest has it, else under /var/lib."""
    scratch = scratch_path(node)
    return f"{scratch}/enroot" if scratch is not None else DEFAULT_DATA_ROOT


def cluster_vars(m: Manifest) -> dict[str, Any]:
    if not enabled(m):
        return {}
    return {"containers_source_mirror": m.slurm.containers.source_mirror or ""}


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    if not is_container_node(m, node):
        return {}
    plan = apparmor_plan(node.os)
    root = data_root(node)
    return {
        "containers_data_path": f"{root}/data",
        "containers_cache_path": f"{root}/cache",
        "containers_apparmor": plan.action,
    }


def problems(m: Manifest) -> list[tuple[tuple[str, ...], str]]:
    """Warnings about the containers section: (manifest path, message)."""
    if not enabled(m) or cgroup_plan(m).constrain_devices:
        return []
    return [(("slurm", "containers", "enabled"),
             "a container sees every GPU of its node: pyxis and enroot leave the fencing to Slurm's "
             "device cgroup (ConstrainDevices), which this cluster does not have (see slurm)")]
