"""No remote step can hang: every package, repository, download and pip step of every role
has a task timeout, retries where a retry is safe, and its variables are documented.

ansible-core's `timeout:` task keyword bounds one attempt; a timed-out task fails on that
host (the play goes on for the others) and is not retried, so the steps' own network
bounds (apt's Acquire::*::Timeout from the common role, get_url's `timeout`, pip's
`--timeout`) are what make `until`/`retries` useful.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/tasks/main.yml"))

NETWORK_MODULES = {
    "ansible.builtin.apt", "ansible.builtin.apt_repository", "ansible.builtin.deb822_repository",
    "ansible.builtin.get_url", "ansible.builtin.uri", "ansible.builtin.pip",
}
# modules that talk to a server themselves and take a socket timeout of their own
OWN_TIMEOUT = {"ansible.builtin.get_url", "ansible.builtin.uri"}
COMMANDS = {"ansible.builtin.command", "ansible.builtin.shell"}
# commands that reach the network, build kernel modules or compile (they can block)
BLOCKING = re.compile(r"\b(pip|nvcc|make|dkms|zpool|docker|nvidia-ctk|scontrol|sacctmgr|nvidia-smi|exportfs|"
                      r"all_reduce_perf|modprobe|update-initramfs|udevadm|netplan|networkctl|wipefs|lsblk)\b|"
                      r"initramfs_command|__zfs_zpool|__nccl_smoke_bin|smoke-|__nfs_server_exportfs|__ofed_ipoib_apply")


def tasks_in(items: list[dict[str, Any]] | None) -> Iterator[dict[str, Any]]:
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks_in(task.get(key))


def role_tasks(role: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for folder in ("tasks", "handlers"):
        for path in sorted((ROOT / "roles" / role / folder).glob("*.yml")):
            for task in tasks_in(yaml.safe_load(path.read_text())):
                yield f"{role}/{folder}/{path.name}: {task.get('name')}", task


def module_of(task: dict[str, Any]) -> str | None:
    return next((k for k in task if k.startswith(("ansible.builtin.", "community.", "ansible.posix."))), None)


def variables(text: Any) -> set[str]:
    return set(re.findall(r"\b([a-z][a-z0-9_]*)\b", str(text))) - {"item", "int"}


def spec_options(role: str) -> set[str]:
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return {name for entry in spec["argument_specs"].values() for name in entry.get("options", {})}


def defaults(role: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    return data


@pytest.mark.parametrize("role", ROLES)
def test_network_steps_are_bounded_and_retried(role: str) -> None:
    problems = []
    for where, task in role_tasks(role):
        module = module_of(task)
        if module not in NETWORK_MODULES:
            continue
        if "timeout" not in task:
            problems.append(f"{where}: no task timeout")
        register = task.get("register")
        if not register or task.get("until") != f"{register} is succeeded" or "retries" not in task \
                or "delay" not in task:
            problems.append(f"{where}: no register + until: <var> is succeeded + retries + delay")
        if module in OWN_TIMEOUT and "timeout" not in (task[module] or {}):
            problems.append(f"{where}: no {module} timeout parameter")
    assert problems == []


@pytest.mark.parametrize("role", ROLES)
def test_blocking_commands_are_bounded(role: str) -> None:
    problems = []
    for where, task in role_tasks(role):
        module = module_of(task)
        if module not in COMMANDS:
            continue
        args = task[module]
        text = args if isinstance(args, str) else (args.get("argv") or args.get("cmd"))
        text = f"{text} {task.get('loop', '')}"  # a loop may carry the commands (ofed's handler)
        if not ({"creates", "removes"} & set(args if isinstance(args, dict) else {})) and "changed_when" not in task:
            problems.append(f"{where}: neither creates/removes nor changed_when")
        if BLOCKING.search(str(text)) and "timeout" not in task:
            problems.append(f"{where}: {str(text)[:60]} can block but has no timeout")
    assert problems == []


@pytest.mark.parametrize("role", ROLES)
def test_bound_variables_are_defaulted_and_specified(role: str) -> None:
    used: set[str] = set()
    for _, task in role_tasks(role):
        for key in ("timeout", "retries", "delay"):
            if key in task:
                used |= variables(task[key])
        module = module_of(task)
        if module in OWN_TIMEOUT:
            used |= variables(task[module].get("timeout", ""))
    mine = {v for v in used if v.startswith(f"{role}_") or (role == "munge" and v.startswith("munge_"))}
    assert used == mine, f"{role}: bounds from other roles' variables: {sorted(used - mine)}"
    reaches_out = any(module_of(task) in NETWORK_MODULES | COMMANDS for _, task in role_tasks(role))
    assert mine or not reaches_out, f"{role} has no bounded step"  # slurm_metrics: files and a timer only
    assert mine <= set(defaults(role)), sorted(mine - set(defaults(role)))
    assert mine <= spec_options(role), sorted(mine - spec_options(role))
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    for entry in spec["argument_specs"].values():
        for name in mine & set(entry.get("options", {})):
            option = entry["options"][name]
            assert option["type"] == "int" and option["default"] == defaults(role)[name], name
            assert isinstance(defaults(role)[name], int) and defaults(role)[name] > 0, name


def test_common_writes_apt_timeouts() -> None:
    template = (ROOT / "roles" / "common" / "templates" / "apt-timeouts.conf.j2").read_text()
    for key in ("Acquire::http::Timeout", "Acquire::https::Timeout", "Acquire::ftp::Timeout"):
        assert f'{key} "{{{{ common_apt_timeout }}}}";' in template
    assert 'Acquire::Retries "{{ common_apt_retries }}";' in template
    assert defaults("common")["common_apt_timeout"] == 30
    assert defaults("common")["common_apt_retries"] == 3
    mirrors = (ROOT / "roles" / "common" / "tasks" / "mirrors.yml").read_text()
    assert "dest: /etc/apt/apt.conf.d/80provision-timeouts" in mirrors


def test_apt_waits_for_the_dpkg_lock_boundedly() -> None:
    # a freshly deployed node runs unattended-upgrades right after boot: apt (the config every
    # apt run reads) and the common role's apt tasks, the first on every node, wait for its lock
    template = (ROOT / "roles" / "common" / "templates" / "apt-timeouts.conf.j2").read_text()
    assert 'DPkg::Lock::Timeout "{{ common_apt_lock_timeout }}";' in template
    apt_tasks = [t for _, t in role_tasks("common") if "ansible.builtin.apt" in t]
    assert apt_tasks and all(t["ansible.builtin.apt"].get("lock_timeout") == "{{ common_apt_lock_timeout }}"
                             for t in apt_tasks)
    assert 0 < defaults("common")["common_apt_lock_timeout"] < defaults("common")["common_package_timeout"]
