"""The registry of areas: everything the engine (validate, inventory, plan, apply, verify,
image) asks of an area, in one entry per area (:class:`provisioner.areas.entry.Area`, whose
module docstring says what each field is for). The engine iterates :data:`AREAS` and imports no
area by name (tests/test_layers.py); it reaches the entry's types through this module too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from provisioner.areas import entry
from provisioner.areas.backup import checks as backup_checks
from provisioner.areas.backup import decide as backup_decide
from provisioner.areas.backup import rolevars as backup
from provisioner.areas.backup import verify as backup_verify
from provisioner.areas.baremetal import checks as baremetal_checks
from provisioner.areas.baremetal import decide as baremetal_decide
from provisioner.areas.baremetal import deploy as baremetal_deploy
from provisioner.areas.baremetal import preflight as baremetal_preflight
from provisioner.areas.baremetal import rolevars as baremetal
from provisioner.areas.common import checks as common_checks
from provisioner.areas.common import decide as common_decide
from provisioner.areas.common import rolevars as common
from provisioner.areas.common import verify as common_verify
from provisioner.areas.entry import (
    Area,
    HeadBackup,
    Install,
    InstallSteps,
    LiveDrift,
    PackageBuild,
    PrepareHook,
    Records,
    Upgrade,
    UsageReport,
)
from provisioner.areas.fabric import checks as fabric_checks
from provisioner.areas.fabric import rolevars as fabric
from provisioner.areas.fabric import verify as fabric_verify
from provisioner.areas.gpu import checks as gpu_checks
from provisioner.areas.gpu import rolevars as gpu
from provisioner.areas.gpu import verify as gpu_verify
from provisioner.areas.monitoring import checks as monitoring_checks
from provisioner.areas.monitoring import decide as monitoring_decide
from provisioner.areas.monitoring import rolevars as monitoring
from provisioner.areas.monitoring import usage as monitoring_usage
from provisioner.areas.monitoring import usage_render as monitoring_usage_render
from provisioner.areas.monitoring import usage_sources as monitoring_usage_sources
from provisioner.areas.people import checks as people_checks
from provisioner.areas.people import rolevars as people
from provisioner.areas.people import secrets as people_secrets
from provisioner.areas.people import verify as people_verify
from provisioner.areas.slurm import accounts as slurm_accounts
from provisioner.areas.slurm import build as slurm_build
from provisioner.areas.slurm import checks as slurm_checks
from provisioner.areas.slurm import decide as slurm_decide
from provisioner.areas.slurm import prepare as slurm_prepare
from provisioner.areas.slurm import repo as slurm_repo
from provisioner.areas.slurm import rolevars as slurm
from provisioner.areas.slurm import upgrade as slurm_upgrade
from provisioner.areas.slurm import verify as slurm_verify
from provisioner.areas.storage import checks as storage_checks
from provisioner.areas.storage import precheck as storage_precheck
from provisioner.areas.storage import replication_key as storage_replication_key
from provisioner.areas.storage import rolevars as storage
from provisioner.areas.storage import scratch as storage_scratch
from provisioner.areas.storage import verify as storage_verify
from provisioner.manifest.checks import Check
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import NodeChecks
from provisioner.state import StateDir

# The entry's types the engine names (it imports no area module but this one).
BuildJob = entry.BuildJob
DiskRead = entry.DiskRead
InstallOutcome = entry.InstallOutcome
PackageRepo = entry.PackageRepo
Preflight = entry.Preflight
PreflightCheck = entry.PreflightCheck
PreflightInputs = entry.PreflightInputs


USAGE_REPORT = UsageReport(
    window=monitoring_usage_sources.window, gather=monitoring_usage.gather, controller=slurm_decide.controller,
    prometheus_url=monitoring_usage.prometheus_url, groupings=monitoring_usage.GROUPINGS,
    render={"json": monitoring_usage_render.to_json, "csv": monitoring_usage_render.to_csv,
            "table": monitoring_usage_render.to_table, "html": monitoring_usage_render.to_html},
)


SLURMDBD_DRIFT = LiveDrift(
    name="slurmdbd", wanted=slurm_accounts.managed, node=slurm_decide.controller,
    commands=lambda m: slurm_accounts.read_commands(slurm_decide.cluster_name(m)),
    changes=slurm_accounts.live_changes,
)


SLURM_BUILD = PackageBuild(
    jobs=slurm_build.jobs, missing=slurm_build.missing_options, timeout_s=slurm_build.BUILD_TIMEOUT_S,
    repo=PackageRepo(signing_home=slurm_repo.SIGNING_HOME, public_key=slurm_repo.PUBLIC_KEY,
                     key_commands=slurm_repo.key_commands, stanza=slurm_repo.packages_stanza,
                     release=slurm_repo.release_text, sign_command=slurm_repo.sign_command))

SLURM_UPGRADE = Upgrade(recorded=slurm_upgrade.recorded, order=slurm_upgrade.plan_view)


HEAD_BACKUP = HeadBackup(
    wanted=backup_decide.enabled, node=backup_decide.head, parse_to=backup_decide.parse_to,
    destination=backup_decide.destination, describe=backup_decide.describe,
    make_command=backup_decide.make_command, upload_command=backup_decide.upload_command,
    restore_command=backup_decide.restore_command, pack_admin=backup_decide.pack_admin,
    timeout=lambda m: backup_decide.section(m).timeout_s, plan_lines=backup_decide.plan_lines,
)


if TYPE_CHECKING:  # what BAREMETAL_INSTALL loads by name, type-checked here (no import at run time)
    from provisioner.areas.baremetal import install as baremetal_install

    _BAREMETAL_STEPS = InstallSteps(baremetal_install.server_vars, baremetal_install.install)

BAREMETAL_INSTALL = Install(
    targets=baremetal_decide.install_targets, summary=baremetal_deploy.install_summary,
    needs_ramdisk=baremetal_deploy.needs_ramdisk, image_nodes=baremetal_deploy.image_nodes,
    playbook="baremetal.yml", runner="provisioner.areas.baremetal.install", install_only=baremetal_decide.install_only,
    preflight=Preflight(image_file=baremetal_deploy.image_file, method=baremetal_deploy.method,
                        module_names=baremetal_preflight.module_names, checks=baremetal_preflight.checks,
                        failed=baremetal_preflight.failed, refusal=baremetal_preflight.refusal),
)

# This order names the plan's sections (per node: which areas changed) and orders each
# node's verify checks.
AREAS: tuple[Area, ...] = (
    Area("common", common.cluster_vars, common.node_vars, frozenset({"common_hosts"}),
         checks=common_checks.CHECKS, verify=common_verify.checks, image_packages=common_decide.image_packages),
    Area("fabric", fabric.cluster_vars, fabric.node_vars, groups=fabric.groups, checks=fabric_checks.CHECKS,
         verify=fabric_verify.checks, split_from="storage"),
    Area("storage", storage.cluster_vars, storage.node_vars, groups=storage.groups, checks=storage_checks.CHECKS,
         verify=storage_verify.checks, destructive=storage_scratch.format_summary,
         disk_read=DiskRead(storage_precheck.commands, storage_precheck.refusals),
         prepare=storage_replication_key.prepare, secret_values=storage_replication_key.secret_values,
         image_roles=("nfs_client",)),
    Area("people", people.cluster_vars, people.node_vars, people.LIGHT_KEYS, checks=people_checks.CHECKS,
         verify=people_verify.checks, prepare=people_secrets.prepare_directory,
         secret_envs=people_secrets.secret_envs, secret_values=people_secrets.secret_values),
    Area("gpu", gpu.cluster_vars, gpu.node_vars, groups=gpu.groups, checks=gpu_checks.CHECKS,
         verify=gpu_verify.checks),
    Area("slurm", slurm.cluster_vars, slurm.node_vars, slurm.LIGHT_KEYS, groups=slurm.groups,
         checks=slurm_checks.CHECKS, verify=slurm_verify.checks, prepare=slurm_prepare.prepare,
         secret_envs=slurm_prepare.secret_envs, secret_values=slurm_prepare.secret_values,
         image_roles=("munge", "slurm"), live=SLURMDBD_DRIFT, upgrade=SLURM_UPGRADE, package_build=SLURM_BUILD),
    Area("baremetal", baremetal.cluster_vars, baremetal.node_vars, baremetal.LIGHT_KEYS,
         checks=baremetal_checks.CHECKS, install=BAREMETAL_INSTALL),
    Area("monitoring", monitoring.cluster_vars, monitoring.node_vars, monitoring.LIGHT_KEYS, groups=monitoring.groups,
         checks=monitoring_checks.CHECKS, prepare=monitoring_decide.prepare_secrets,
         secret_envs=monitoring_decide.secret_env_names, secret_values=monitoring_decide.secret_values,
         image_packages=monitoring_decide.image_packages, usage=USAGE_REPORT),
    Area("backup", backup.cluster_vars, backup.node_vars, backup.LIGHT_KEYS, groups=backup.groups,
         checks=backup_checks.CHECKS, verify=backup_verify.checks, prepare=backup_decide.prepare_key,
         secret_envs=backup_decide.secret_envs, secret_values=backup_decide.secret_values, backup=HEAD_BACKUP),
)

# validate reports the areas' findings in this order: the GPU stack first (as before the areas
# had their own packages); areas not named here follow in AREAS order.
CHECK_ORDER: tuple[str, ...] = ("gpu", "storage", "fabric", "slurm")


def cluster_vars(m: Manifest) -> dict[str, dict[str, Any]]:
    """Cluster-wide variables per area."""
    return {area.name: area.cluster_vars(m) for area in AREAS}


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    """All node-specific variables, merged (role prefixes keep the keys apart)."""
    merged: dict[str, Any] = {}
    for area in AREAS:
        for key, value in area.node_vars(m, node).items():
            if key in merged:
                raise ValueError(f"variable {key!r} is produced by two areas")
            merged[key] = value
    return merged


def checks() -> list[Check]:
    """Every area's whole-manifest checks, in the order validate reports them."""
    rank = {name: i for i, name in enumerate(CHECK_ORDER)}
    ordered = sorted(AREAS, key=lambda area: rank.get(area.name, len(rank)))  # stable: AREAS order after
    return [check for area in ordered for check in area.checks]


def image_packages(m: Manifest) -> tuple[str, ...]:
    """What a node OS image built for ``m`` carries beyond its recipe: every area's packages
    that all of the manifest's nodes get, sorted, each once."""
    return tuple(sorted({p for area in AREAS if area.image_packages is not None for p in area.image_packages(m)}))


def image_roles() -> frozenset[str]:
    """Every area's :attr:`Area.image_roles`."""
    return frozenset(role for area in AREAS for role in area.image_roles)


def prepare_hooks() -> list[PrepareHook]:
    """The areas' steps before an apply, in AREAS order."""
    return [area.prepare for area in AREAS if area.prepare is not None]


def groups(m: Manifest) -> dict[str, set[str]]:
    """Every area's inventory groups -> member names, in AREAS order."""
    merged: dict[str, set[str]] = {}
    for area in AREAS:
        for name, members in (area.groups(m) if area.groups is not None else {}).items():
            if name in merged:
                raise ValueError(f"inventory group {name!r} is made by two areas")
            merged[name] = members
    return merged


def verify_checks(m: Manifest) -> list[NodeChecks]:
    """Every area's node checks for ``m``, in AREAS order."""
    return [area.verify(m) for area in AREAS if area.verify is not None]


def secret_envs(m: Manifest) -> set[str]:
    """Environment variables holding the areas' secrets (kept out of what a run records)."""
    return {name for area in AREAS if area.secret_envs is not None for name in area.secret_envs(m)}


def secret_values(state: StateDir) -> list[str]:
    """The areas' secrets prepared in the state directory, for the artifact scan."""
    return [value for area in AREAS if area.secret_values is not None for value in area.secret_values(state)]


def destructive(m: Manifest, node: Node) -> str:
    """What the areas' plays may destroy on ``node``, in plan's words ("": nothing)."""
    return "; ".join(text for area in AREAS if area.destructive is not None
                     if (text := area.destructive(m, node)))


def disk_reads() -> list[DiskRead]:
    """What the areas read on a node whose disks their plays may take, before an apply."""
    return [area.disk_read for area in AREAS if area.disk_read is not None]


def install() -> Install | None:
    """The area that installs nodes' operating systems, if any."""
    found = [area.install for area in AREAS if area.install is not None]
    if len(found) > 1:
        raise ValueError("more than one area installs nodes")
    return found[0] if found else None


def usage_report() -> UsageReport:
    """The area that reports GPU usage (``provision report usage``)."""
    found = [area.usage for area in AREAS if area.usage is not None]
    if len(found) != 1:
        raise ValueError("exactly one area reports GPU usage")
    return found[0]


def head_backup() -> HeadBackup:
    """The area that backs up and restores the head node (``provision backup``, ``restore``)."""
    found = [area.backup for area in AREAS if area.backup is not None]
    if len(found) != 1:
        raise ValueError("exactly one area backs up the head node")
    return found[0]


def live_drifts(m: Manifest) -> list[LiveDrift]:
    """The areas' services whose drift ``provision plan`` reads for ``m``, in AREAS order."""
    return [area.live for area in AREAS if area.live is not None and area.live.wanted(m)]


def recorded(m: Manifest, node: Node) -> dict[str, str]:
    """What the areas record of ``node`` at a good apply (the state's ``recorded``)."""
    merged: dict[str, str] = {}
    for area in AREAS:
        if area.upgrade is not None:
            merged |= area.upgrade.recorded(m, node)
    return merged


def upgrades(m: Manifest, records: Records) -> list[tuple[str, list[str], str]]:
    """Per area with an in-place upgrade to do or to refuse: (area, steps, refusal)."""
    out = []
    for area in AREAS:
        if area.upgrade is not None:
            steps, refusal = area.upgrade.order(m, records)
            if steps or refusal:
                out.append((area.name, steps, refusal))
    return out


def package_build() -> PackageBuild:
    """The area that builds packages ahead of an apply (``provision slurm build``)."""
    found = [area.package_build for area in AREAS if area.package_build is not None]
    if len(found) != 1:
        raise ValueError("exactly one area builds packages")
    return found[0]
