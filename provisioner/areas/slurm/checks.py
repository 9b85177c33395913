"""Whole-manifest checks of the Slurm area: errors for Slurm releases the controller cannot
work with (mixed OS clusters), warnings about what the nodes' Slurm cannot do (e.g. no
cgroup v2 fencing). Run by ``provisioner.validate`` on a structurally clean manifest."""

from __future__ import annotations

from provisioner.areas.slurm import accounts, adopt, build, containers
from provisioner.areas.slurm.releases import problems, version_conflicts
from provisioner.areas.storage.scratch import local_path_problem
from provisioner.errors import Diagnostic
from provisioner.manifest.checks import Check, node_path
from provisioner.manifest.model import Manifest
from provisioner.manifest.source import Source


def check_slurm_problems(m: Manifest, src: Source) -> list[Diagnostic]:
    return [src.diag(("slurm",), message.removeprefix("slurm: "), "warning") for message in problems(m)]


def check_slurm_versions(m: Manifest, src: Source) -> list[Diagnostic]:
    """A node whose OS ships a Slurm the controller cannot work with: an error on its ``os``."""
    return [src.diag(node_path(node, "os"), message) for node, message in version_conflicts(m)]


def check_slurm_build(m: Manifest, src: Source) -> list[Diagnostic]:
    """slurm.source, version and mirror that do not fit: errors at the setting."""
    return [src.diag(path, message) for path, message in build.problems(m)]


def check_slurm_accounts(m: Manifest, src: Source) -> list[Diagnostic]:
    """Accounts, QOS and users' accounts that do not fit: errors at the value."""
    return [src.diag(path, message) for path, message in accounts.problems(m)]


def check_job_tmp(m: Manifest, src: Source) -> list[Diagnostic]:
    """slurm.job_tmp holds every job's /tmp: on each slurmd node it must lie on a file system
    the manifest makes there (its scratch), not be a folder on the root disk (issue 28 item 3).
    One error at the setting: the first node's problem, and how many more nodes have one."""
    path = m.slurm.job_tmp
    if not m.slurm.enabled or path is None:
        return []
    problems = [p for node in m.with_role("compute")
                if (p := local_path_problem(m, node, path, "slurm.job_tmp", folder="slurm")) is not None]
    if not problems:
        return []
    rest = len(problems) - 1
    more = f" (and {rest} more compute node{'s' if rest > 1 else ''})" if rest else ""
    return [src.diag(("slurm", "job_tmp"), problems[0] + more)]


def check_slurm_containers(m: Manifest, src: Source) -> list[Diagnostic]:
    """enroot + pyxis where they cannot do what the section promises: warnings."""
    return [src.diag(path, message, "warning") for path, message in containers.problems(m)]


def check_registry_logins(m: Manifest, src: Source) -> list[Diagnostic]:
    """Registry logins enroot cannot hold together, a group the nodes do not have: errors."""
    return [src.diag(path, message) for path, message in containers.registry_errors(m)]


def check_ssh_only_with_job(m: Manifest, src: Source) -> list[Diagnostic]:
    """pam_slurm_adopt asked for where Slurm cannot adopt SSH sessions into jobs."""
    return [src.diag(path, message, severity) for path, message, severity in adopt.problems(m)]


CHECKS: tuple[Check, ...] = (check_slurm_problems, check_slurm_versions, check_slurm_build, check_slurm_accounts,
                             check_job_tmp, check_slurm_containers, check_registry_logins, check_ssh_only_with_job)
