"""Containers in Slurm jobs: enroot + pyxis on the compute and login nodes (pure decisions).

The role ``containers`` builds enroot and pyxis from the pinned source tarballs (their
URLs and checksums are facts of the role's defaults, declared once there) and configures
them; this module decides, from the manifest alone, which nodes get them, where enroot keeps
its data and cache, where the sources come from, and what each OS needs so that an
unprivileged user may create the user namespace enroot runs in (the AppArmor decision).

The cluster-wide registry logins (``slurm.containers.registry_logins``) become one netrc file,
enroot's ``.credentials``: :func:`prepare_credentials` (the only side effect here, an apply's
prepare step) reads each password from its variable or file into the state directory's
secrets, and the role copies that file to the nodes in tasks that log nothing; the inventory
holds its path on the control machine, never a password.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from provisioner.areas.slurm.releases import cgroup_plan
from provisioner.areas.storage.scratch import scratch_disks
from provisioner.errors import ProvisionError
from provisioner.manifest.fields import OsName
from provisioner.manifest.load import Loaded
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node, Scratch
from provisioner.manifest.slurm import NETRC_TOKEN_RE, RegistryLogin
from provisioner.secretfile import private_file_text
from provisioner.state import StateDir

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


# The registry logins, prepared on the control machine (state directory's secrets/, 0600);
# the role copies the file to enroot's site configuration directory on the nodes.
CREDENTIALS_NAME = "enroot-credentials"
CREDENTIALS_SOURCE = "{{ provision_state_dir }}/secrets/" + CREDENTIALS_NAME


def cluster_vars(m: Manifest) -> dict[str, Any]:
    if not enabled(m):
        return {}
    c = m.slurm.containers
    return {
        "containers_source_mirror": c.source_mirror or "",
        # a path on the control machine (never the passwords); "": no site logins
        "containers_registry_credentials": CREDENTIALS_SOURCE if c.registry_logins else "",
        "containers_registry_group": c.registry_group or "",
    }


# Rendered by the role's light entry point (tasks_from: registry) on every apply: a changed
# login or group does not re-run the build on settled nodes.
LIGHT_KEYS = frozenset({"containers_registry_credentials", "containers_registry_group"})


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
    found: list[tuple[tuple[str, ...], str]] = []
    if m.slurm.containers.registry_logins and not enabled(m):
        found.append((("slurm", "containers", "registry_logins"),
                      "no node runs enroot (slurm.containers.enabled is false): these logins are not used"))
    if enabled(m) and not cgroup_plan(m).constrain_devices:
        found.append((("slurm", "containers", "enabled"),
                      "a container sees every GPU of its node: pyxis and enroot leave the fencing to Slurm's "
                      "device cgroup (ConstrainDevices), which this cluster does not have (see slurm)"))
    return found


# ------------------------------------------------------------------------ registry logins
def machine(host: str) -> str:
    """The netrc ``machine`` enroot looks a registry up by: its host without the port (enroot's
    ``${registry%:*}``; curl matches netrc entries by host name alone)."""
    return host.rsplit(":", 1)[0] if ":" in host else host


def registry_errors(m: Manifest) -> list[tuple[tuple[str | int, ...], str]]:
    """Errors of the registry logins: (manifest path, message). One netrc file holds them all,
    and enroot uses the first entry of a host, so two logins for one host cannot both work."""
    c = m.slurm.containers
    found: list[tuple[tuple[str | int, ...], str]] = []
    seen: dict[str, int] = {}
    for i, login in enumerate(c.registry_logins):
        name = machine(login.host)
        if name in seen:
            found.append((("slurm", "containers", "registry_logins", i, "host"),
                          f"{login.host}: registry_logins[{seen[name]}] already logs in to {name}; enroot "
                          "keeps one login per host (ports do not count)"))
        seen.setdefault(name, i)
    if c.registry_group is not None and c.registry_group not in {g.name for g in m.groups}:
        found.append((("slurm", "containers", "registry_group"),
                      f"unknown group {c.registry_group!r}: declare it in groups:"))
    return found


def password_problem(value: str) -> str | None:
    """Why ``value`` cannot go into enroot's credentials file, in words that never show it.
    enroot hands a password starting with ``$`` to the shell (its ``$(command)`` feature), so
    one must not start so; netrc tokens hold no blanks."""
    if not value:
        return "is empty"
    if value.startswith("$"):
        return "starts with $, which enroot would run through the shell"
    if not NETRC_TOKEN_RE.match(value):
        return "holds a blank or starts with a quote, which enroot's credentials file cannot hold"
    return None


def read_password(login: RegistryLogin, index: int, environ: Mapping[str, str] | None = None) -> str:
    """The password of ``registry_logins[index]`` from its variable or file (a regular file
    others cannot read; one trailing newline dropped). Messages name the field and where the
    value was looked for, never the value."""
    where = f"slurm.containers.registry_logins[{index}] ({login.host})"
    if login.password_env is not None:
        value = (os.environ if environ is None else environ).get(login.password_env, "")
        if not value:
            raise ProvisionError(f"{where}: environment variable {login.password_env} is empty or unset")
    else:
        assert login.password_file is not None  # the model guarantees one of the two
        value = private_file_text(Path(login.password_file), where, f"the registry password for {login.host}")
    if (problem := password_problem(value)) is not None:
        raise ProvisionError(f"{where}: the password {problem}")
    return value


def credentials_text(logins: Sequence[RegistryLogin], passwords: Sequence[str]) -> str:
    """enroot's ``.credentials`` (netrc): one line per login, in the manifest's order."""
    return "".join(f"machine {machine(login.host)} login {login.login} password {password}\n"
                   for login, password in zip(logins, passwords, strict=True))


def credentials_passwords(text: str) -> list[str]:
    """The passwords of a credentials file :func:`credentials_text` wrote."""
    return [words[5] for line in text.splitlines() if len(words := line.split()) == 6 and words[4] == "password"]


def secret_envs(m: Manifest) -> set[str]:
    """Environment variables holding registry passwords (kept out of what a run records)."""
    return {login.password_env for login in m.slurm.containers.registry_logins if login.password_env is not None}


def prepare_credentials(loaded: Loaded, state: StateDir) -> None:
    """An apply's prepare step: every registry password read (all before anything is written)
    into ``secrets/enroot-credentials`` (0600, written atomically), where the role finds it;
    removed when the manifest has no logins or no containers."""
    m = loaded.manifest
    path = state.secrets / CREDENTIALS_NAME
    logins = m.slurm.containers.registry_logins
    if not enabled(m) or not logins:
        path.unlink(missing_ok=True)
        return
    text = credentials_text(logins, [read_password(login, i) for i, login in enumerate(logins)])
    state.secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{CREDENTIALS_NAME}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def secret_values(state: StateDir) -> list[str]:
    """The prepared registry passwords, for the artifact scan of ``provision apply``."""
    path = state.secrets / CREDENTIALS_NAME
    try:
        return credentials_passwords(path.read_text(encoding="utf-8")) if path.is_file() else []
    except (OSError, UnicodeDecodeError):
        return []
