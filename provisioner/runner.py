"""Run playbooks through the ansible-runner Python API (the side-effect edge).

Ansible is tuned for speed and safety here: pipelining, SSH ControlPersist, forks sized to
the node count, a fact cache at a stable path, host key checking against the state's
known_hosts (first contact recorded with accept-new, a later mismatch fails). Secrets are
kept out of artifacts: no env/ files are written, and environment variables that look like
or are declared as secrets are removed from the environment ansible-runner records.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from provisioner.content import ansible_paths, project_root
from provisioner.errors import ProvisionError
from provisioner.settings import DEFAULT_STALL_TIMEOUT, STRATEGIES
from provisioner.state import StateDir

SECRET_ENV_RE = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|_PASS$)", re.IGNORECASE)
MAX_FORKS = 50


def strategy_env(strategy: str) -> dict[str, str]:
    """Ansible settings for the execution strategy: Ansible's own ``linear``, or Mitogen's
    ``mitogen_linear`` (one persistent Python per node instead of one per task)."""
    if strategy == "linear":
        return {"ANSIBLE_STRATEGY": "linear"}
    if strategy != "mitogen":
        raise ProvisionError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    # Mitogen's connection timeout (Ansible's `timeout`) covers SSH and starting its Python
    # on the node, which takes longer than the SSH handshake alone on a busy or slow node
    # (seen: 30 s too short on a loaded 2-core machine). SSH's own ConnectTimeout stays 20 s.
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        raise ProvisionError("strategy 'mitogen' needs the mitogen package (pip install mitogen)")
    plugins = Path(next(iter(spec.submodule_search_locations))) / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": "mitogen_linear", "ANSIBLE_TIMEOUT": "90"}


@dataclass(frozen=True)
class SshTarget:
    name: str
    address: str
    port: int = 22
    user: str = "root"
    private_key: str | None = None


def _known(known_hosts: Path, t: SshTarget) -> bool:
    host = t.address if t.port == 22 else f"[{t.address}]:{t.port}"
    found = subprocess.run(["ssh-keygen", "-F", host, "-f", str(known_hosts)], capture_output=True, check=False)
    return found.returncode == 0


def first_contact(known_hosts: Path, targets: list[SshTarget], timeout: int = 20) -> dict[str, str]:
    """Record the host key of every target not met before (OpenSSH's accept-new), by a key-
    authenticated login that runs ``true``. Ansible's own strategy does this on its first
    connection; Mitogen insists on known keys, so its runs meet new nodes here first. A key
    that changed is never accepted. Returns {name: reason} for targets not reached."""
    todo = [t for t in targets if not _known(known_hosts, t)]

    def contact(t: SshTarget) -> str | None:
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
               "-o", f"UserKnownHostsFile={known_hosts}", "-o", "HashKnownHosts=no",
               "-o", f"ConnectTimeout={timeout}", "-o", "ControlMaster=no", "-p", str(t.port)]
        if t.private_key:
            cmd += ["-i", t.private_key, "-o", "IdentitiesOnly=yes"]
        try:
            r = subprocess.run([*cmd, f"{t.user}@{t.address}", "true"], capture_output=True, text=True,
                               timeout=timeout * 2, check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"no SSH answer within {timeout * 2} s"
        if r.returncode == 0:
            return None
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else f"ssh exit {r.returncode}"

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(contact, todo))
    return {t.name: reason for t, reason in zip(todo, results, strict=True) if reason is not None}


def forks_for(node_count: int) -> int:
    return max(5, min(node_count, MAX_FORKS))


def ansible_env(
    state: StateDir,
    root: Path,
    node_count: int,
    stall_timeout: int = DEFAULT_STALL_TIMEOUT,
    strategy: str = "linear",
) -> dict[str, str]:
    # Ansible's own strategy reuses one SSH connection per node between tasks (ControlMaster);
    # Mitogen keeps its own connection open for the whole run, and an SSH master left from
    # an earlier run to a machine that was since replaced made its connections time out
    multiplex = ["-o ControlMaster=auto", "-o ControlPersist=120s"] if strategy == "linear" else ["-o ControlMaster=no"]
    ssh_args = " ".join(
        [
            *multiplex,
            f"-o UserKnownHostsFile={state.known_hosts}",
            "-o StrictHostKeyChecking=accept-new",
            "-o HashKnownHosts=no",
            "-o ServerAliveInterval=15",
            "-o ConnectTimeout=20",
        ]
    )
    bindir = str(Path(sys.executable).parent)  # ansible-playbook lives beside our python
    path = os.environ.get("PATH", "")
    return {
        "PATH": path if path.split(":")[0] == bindir else f"{bindir}:{path}",
        **ansible_paths(root),
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": ssh_args,
        # OpenSSH's own %C hash: short socket paths, and `ssh -O exit -o ControlPath=...`
        # from an operator's shell finds the same master
        "ANSIBLE_SSH_CONTROL_PATH": "%(directory)s/%%C",
        # a master that dies during first contact ("Failed to connect to new control
        # master") is retried instead of failing the node
        "ANSIBLE_SSH_RETRIES": "3",
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_GATHERING": "smart",
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(state.facts),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "86400",
        "ANSIBLE_FORKS": str(forks_for(node_count)),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_TIMEOUT": "30",
        "ANSIBLE_TASK_TIMEOUT": str(stall_timeout),
        **strategy_env(strategy),
    }


def secret_env_names(declared: set[str]) -> set[str]:
    return {k for k in os.environ if k in declared or SECRET_ENV_RE.search(k)}


@contextlib.contextmanager
def scrubbed_environ(names: set[str]) -> Iterator[None]:
    """Temporarily remove secret variables from os.environ (ansible-runner records it)."""
    saved = {k: os.environ.pop(k) for k in list(names) if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@dataclass
class HostProgress:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    role: str = ""
    task: str = ""
    task_started: float | None = None  # time.monotonic() when the current task began here
    attempt: int = 0  # retries of the current task (`until`), 0 before the first retry
    errors: list[str] = field(default_factory=list)

    def elapsed(self, now: float) -> float:
        return 0.0 if self.task_started is None else now - self.task_started

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        return "ok"


@dataclass
class RunResult:
    rc: int
    status: str
    hosts: dict[str, HostProgress]
    artifact_dir: Path

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, p in self.hosts.items() if p.status != "ok")


class Tracker:
    """Folds ansible-runner events into per-host progress; the display reads it."""

    def __init__(
        self,
        hosts: list[str],
        on_change: Callable[[Tracker], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hosts = {h: HostProgress(h) for h in hosts}
        self.play = ""
        self.on_change = on_change
        self.clock = clock

    def _host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress(name))

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        host = data.get("host") or data.get("remote_addr")
        if kind == "playbook_on_play_start":
            self.play = str(data.get("play", ""))
        elif host and kind == "runner_on_start":
            p = self._host(host)
            p.role = str(data.get("role", "") or "")
            p.task = str(data.get("task", "") or "")
            p.task_started = self.clock()
            p.attempt = 0
        elif host and kind == "runner_retry":
            self._host(host).attempt = int((data.get("res") or {}).get("attempts", 0) or 0)
        elif host and kind == "runner_on_ok":
            p = self._host(host)
            p.task_started = None
            if (data.get("res") or {}).get("changed"):
                p.changed += 1
            else:
                p.ok += 1
        elif host and kind == "runner_on_skipped":
            self._host(host).skipped += 1
        elif host and kind == "runner_on_failed" and not data.get("ignore_errors"):
            p = self._host(host)
            p.failed += 1
            p.task_started = None
            res = data.get("res") or {}
            task = data.get("task", "?")
            if isinstance(res.get("timedout"), dict):  # Ansible's task timeout: the stall guard
                period = res["timedout"].get("period", "?")
                p.errors.append(f"{task}: stalled: not finished after {period} s, stopped on this node while "
                                "the others go on (the bound: --stall-timeout, or the role's timeout "
                                "variable for a long task)")
            else:
                p.errors.append(f"{task}: {_failure_message(res)}")
        elif host and kind == "runner_on_unreachable":
            p = self._host(host)
            p.unreachable = True
            p.errors.append(f"unreachable: {_failure_message(data.get('res') or {})}")
        else:
            return True
        if self.on_change is not None:
            self.on_change(self)
        return True


def _failure_message(res: dict[str, Any]) -> str:
    if res.get("censored"):
        return "(output hidden: task handles secrets)"
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or ""
    text = str(msg).strip().splitlines()
    return text[-1][:300] if text else "failed"


def run_playbook(
    *,
    state: StateDir,
    run_id: str,
    playbook: Path,
    inventory: Path,
    hosts: list[str],
    extravars: dict[str, Any] | None = None,
    limit: list[str] | None = None,
    check: bool = False,
    tracker: Tracker,
    secret_names: set[str] | None = None,
    stall_timeout: int = DEFAULT_STALL_TIMEOUT,
    strategy: str = "linear",
) -> RunResult:
    root = project_root()
    env = ansible_env(state, root, len(hosts), stall_timeout, strategy)
    cmdline = "--check --diff" if check else ""
    private = state.runs / run_id
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    with scrubbed_environ(secret_env_names(secret_names or set())):
        result = ansible_runner.run(
            private_data_dir=str(private),
            ident="artifacts",
            playbook=str(playbook),
            inventory=str(inventory),
            project_dir=str(root),
            extravars=extravars or {},
            limit=",".join(limit) if limit else None,
            envvars=env,
            cmdline=cmdline or None,
            event_handler=tracker.handle,
            quiet=True,
            suppress_env_files=True,
            rotate_artifacts=0,
            timeout=None,
        )
    stats = result.stats or {}
    for host in stats.get("dark", {}) or {}:
        tracker._host(host).unreachable = True
    for host in stats.get("failures", {}) or {}:
        p = tracker._host(host)
        p.failed = max(p.failed, int(stats["failures"][host]))
    for host, count in (stats.get("changed", {}) or {}).items():
        tracker._host(host).changed = int(count)
    artifact = state.runs / run_id / "artifacts" / "artifacts"
    if result.rc != 0 and not any(p.errors for p in tracker.hosts.values()):
        output = (artifact / "stdout").read_text(errors="replace") if (artifact / "stdout").exists() else ""
        lines = [line for line in output.splitlines() if line.strip()][-5:]
        raise ProvisionError(f"ansible-playbook failed (rc {result.rc}): " + " | ".join(lines))
    return RunResult(int(result.rc), str(result.status), tracker.hosts, artifact)


def scan_for_secrets(folder: Path, secrets: list[str]) -> list[Path]:
    """Files under ``folder`` that contain any of ``secrets`` (a last line of defence)."""
    needles = [s.encode() for s in secrets if len(s) >= 4]
    if not needles or not folder.exists():
        return []
    hits: list[Path] = []
    for path in folder.rglob("*"):
        if path.is_file():
            with contextlib.suppress(OSError):
                blob = path.read_bytes()
                if any(n in blob for n in needles):
                    hits.append(path)
    return hits
