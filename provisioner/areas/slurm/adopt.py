"""SSH to a compute node only while one's job runs there: pam_slurm_adopt (pure decisions).

The role ``slurm`` installs the OS's ``libpam-slurm-adopt`` on the nodes chosen here, puts
``pam_access`` (the admins, from this module) and then ``pam_slurm_adopt`` at the end of
sshd's account stack, and takes ``pam_systemd`` out of sshd's session stack; slurm.conf gets
``PrologFlags=Contain`` (the job's extern step, which an adopted SSH session joins). How and
why: docs/roles/slurm.md ("SSH only where you have a job"); the source is SchedMD's
pam_slurm_adopt page (https://slurm.schedmd.com/pam_slurm_adopt.html).
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm.decide import controller
from provisioner.areas.slurm.hostlist import hostlist
from provisioner.areas.slurm.releases import cgroups_usable
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

# root needs no rule of ours (pam_slurm_adopt lets root through by itself, ignore_root), but it
# heads the access list so that the rule reads the same on every node whatever the module does
ROOT = "root"


def wanted(m: Manifest) -> bool:
    """What the manifest asks: ``slurm.ssh_only_with_job``, or, unset, on as soon as the
    manifest declares the people who use the cluster (``users:``). A cluster whose people
    are not in the manifest keeps its SSH as it was until the operator says so."""
    if not m.slurm.enabled:
        return False
    asked = m.slurm.ssh_only_with_job
    return bool(m.users) if asked is None else asked


def enabled(m: Manifest) -> bool:
    """pam_slurm_adopt is set up: wanted, and the cluster's Slurm tracks jobs in cgroups
    (SchedMD: it must be used with task/cgroup and proctrack/cgroup; Ubuntu 22.04's Slurm 21.08
    on cgroup v2 has neither, see :func:`problems`)."""
    return wanted(m) and cgroups_usable(m)


def is_adopt_node(m: Manifest, node: Node) -> bool:
    """A compute node that gets pam_slurm_adopt: never the controller (the head) or a login
    node, even when they run jobs too, since people log in there to submit them."""
    return (enabled(m) and node.has_role("compute") and node.name != controller(m).name
            and not node.has_role("login"))


def adopt_nodes(m: Manifest) -> list[Node]:
    return [n for n in m.with_role("compute") if is_adopt_node(m, n)]


def admins(m: Manifest) -> list[str]:
    """Who always gets in (pam_access before pam_slurm_adopt): root, the account apply and
    verify log in as (``cluster.ssh.user``), and the manifest's admin users; each once."""
    names = [ROOT, m.cluster.ssh.user, *(a.name for a in m.cluster.admin_users)]
    return list(dict.fromkeys(names))


def cluster_vars(m: Manifest) -> dict[str, Any]:
    """Nothing while off (clusters recorded before the switch existed keep their fingerprints)."""
    if not enabled(m):
        return {}
    # PrologFlags=Contain: every job gets its extern step, which adopted SSH sessions join
    return {"slurm_ssh_admins": admins(m), "slurm_prolog_contain": True}


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    return {"slurm_ssh_only_with_job": True} if is_adopt_node(m, node) else {}


def problems(m: Manifest) -> list[tuple[tuple[str, ...], str, str]]:
    """(manifest path, message, severity): asked for where Slurm cannot adopt (an error when
    the manifest says so itself, a warning when it follows from ``users:``), or where no
    compute node would get it."""
    if not wanted(m):
        return []
    explicit = m.slurm.ssh_only_with_job is not None
    path = ("slurm", "ssh_only_with_job") if explicit else ("users",)
    if not cgroups_usable(m):
        old = sorted(n.name for n in m.with_role("compute") if n.os == "ubuntu-22.04")
        return [(path, "SSH to compute nodes cannot be limited to users with a job there: pam_slurm_adopt needs "
                       "Slurm's cgroup plugins, which Ubuntu 22.04's Slurm 21.08 lacks on cgroup v2 "
                       f"({hostlist(old)}); use slurm.source: build, or ubuntu-24.04 or debian-12, or set "
                       "slurm.ssh_only_with_job: false",
                 "error" if explicit else "warning")]
    if explicit and m.with_role("compute") and not adopt_nodes(m):
        return [(path, "no compute node gets pam_slurm_adopt: every one is also the head or a login node, where "
                       "people log in to submit jobs", "warning")]
    return []
