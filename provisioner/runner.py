"""Run playbooks through the ansible-runner Python API (the side-effect edge).

Ansible is tuned for speed and safety here: pipelining, SSH ControlPersist, forks sized to
the node count, facts gathered once per run (kept with its artifacts), host key checking
against the state's known_hosts (first contact recorded with accept-new, a later mismatch fails). Secrets are
kept out of artifacts: no env/ files are written, and environment variables that look like
or are declared as secrets are removed from the environment ansible-runner records.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from provisioner import proctree
from provisioner.content import ansible_paths, project_root
from provisioner.errors import ProvisionError, errno_text_reason, network_reason
from provisioner.settings import DEFAULT_STALL_TIMEOUT, DEFAULT_STRATEGY, STRATEGIES, TASK_CAP_ENV
from provisioner.state import StateDir

SECRET_ENV_RE = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|_PASS$)", re.IGNORECASE)
MAX_FORKS = 50
SSH_CONNECT_TIMEOUT = 20  # seconds: OpenSSH's ConnectTimeout for Ansible, and the reachability probe's
# Our strategy plugin (provisioner/ansible_plugins/strategy/provision.py): a play in which every
# host failed does not end the playbook for the others.
STRATEGY_PLUGINS = Path(__file__).resolve().parent / "ansible_plugins" / "strategy"


def strategy_env(strategy: str) -> dict[str, str]:
    """Ansible settings for the execution strategy: Ansible's own ``linear``, or Mitogen's
    ``mitogen_linear`` (one persistent Python per node instead of one per task), each run
    through our ``provision`` strategy (one node's failure never ends the others' plays)."""
    if strategy == "linear":
        return {"ANSIBLE_STRATEGY_PLUGINS": str(STRATEGY_PLUGINS), "ANSIBLE_STRATEGY": "provision",
                "PROVISION_STRATEGY_BASE": "linear"}
    if strategy != "mitogen":
        raise ProvisionError(f"unknown strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    # Mitogen's connection timeout (Ansible's `timeout`) covers SSH and starting its Python
    # on the node, which takes longer than the SSH handshake alone on a busy or slow node
    # (seen: 30 s too short on a loaded 2-core machine). SSH's own ConnectTimeout stays 20 s.
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        raise ProvisionError("strategy 'mitogen' needs the mitogen package (pip install mitogen)")
    plugins = Path(next(iter(spec.submodule_search_locations))) / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": f"{STRATEGY_PLUGINS}{os.pathsep}{plugins}", "ANSIBLE_STRATEGY": "provision",
            "PROVISION_STRATEGY_BASE": "mitogen_linear", "ANSIBLE_TIMEOUT": "90"}


def ssh_path_option(name: str, path: Path) -> str:
    """``Name="path"`` for ``ssh -o``: ssh splits an option's value at blanks, so a path with
    a space must be in double quotes there (ssh has no escape for a double quote itself)."""
    text = str(path)
    if '"' in text or "\n" in text:
        raise ProvisionError(f"{text}: a path handed to ssh cannot contain a double quote or a line break; "
                             "move the manifest or choose another --state-dir")
    return f'{name}="{text}"'


@dataclass(frozen=True)
class Reach:
    """What a reachability probe of a node's SSH port found."""

    ok: bool
    reason: str = ""  # words, when not ok: "connection refused", "no route to host", ...
    banner: str = ""


SSH_MSG_KEXINIT = 20
PROBE_IDENT = b"SSH-2.0-provision_probe\r\n"


def probe_ssh(address: str, port: int = 22, timeout: float = SSH_CONNECT_TIMEOUT,
              banner_timeout: float = 10.0, stopped: Callable[[], bool] = lambda: False) -> Reach:
    """Is there a working SSH server at ``address:port``? It must send an identification
    line (``SSH-2.0-...``) and, once it has ours, the first packet of its key exchange
    (KEXINIT): a firewall, a NAT or another service accepting TCP on the port is not one,
    and neither is an sshd that stalls after its banner (OpenSSH's ConnectTimeout ends at
    the banner; Ansible then waited minutes). ``timeout`` bounds the TCP connection,
    ``banner_timeout`` the rest (cut short once ``stopped()``). Never logs in, so it changes
    nothing anywhere."""
    where = f"{address}:{port}"
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except TimeoutError:
        return Reach(False, f"no answer from {where} within {timeout:g} s")
    except OSError as exc:
        return Reach(False, f"{network_reason(exc) or exc.strerror or exc} ({where})")
    with sock:
        try:
            return _handshake(sock, where, time.monotonic() + banner_timeout, banner_timeout, stopped)
        except OSError as exc:
            return Reach(False, f"{network_reason(exc) or exc.strerror or exc} ({where})")


PROBE_STOP_POLL = 0.2  # seconds: how soon a waiting probe sees that the command was stopped
# seconds of silence (at most half the bound) after which the probe sends its identification
# before the server's: a web server on the port answers only a request (HTTP 400), and one
# that writes and closes without reading would reset the connection and lose its words
IDENT_AFTER = 1.0


def _recv(sock: socket.socket, deadline: float, stopped: Callable[[], bool]) -> bytes | None:
    """One read before ``deadline``: bytes, b"" when the other end closed, None on time out,
    or None within PROBE_STOP_POLL once ``stopped()``: a signal ended the command, which then
    need not wait out a stalled server's bound (probes_end_with_a_signal)."""
    while not stopped():
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(min(left, PROBE_STOP_POLL))
        try:
            return sock.recv(4096)
        except TimeoutError:
            continue
    return None


def _handshake(sock: socket.socket, where: str, deadline: float, bound: float, stopped: Callable[[], bool]) -> Reach:
    data = b""
    banner = ""
    sent = False
    ident_at = time.monotonic() + min(IDENT_AFTER, bound / 2)
    while not banner:  # RFC 4253 4.2: a server may send other lines before its identification line
        lines = data.split(b"\n")
        found = [line for line in lines[:-1] if line.startswith(b"SSH-")]
        if found:
            banner = found[0].decode("ascii", "replace").strip()
            data = data.split(found[0] + b"\n", 1)[1]
            break
        chunk = _recv(sock, deadline if sent else min(deadline, ident_at), stopped) if len(data) < 4096 else b""
        if chunk:
            data += chunk
            continue
        if chunk is None and not sent and not stopped() and time.monotonic() < deadline:
            sock.sendall(PROBE_IDENT)  # both sides may speak first (RFC 4253 4.2); OpenSSH's client does
            sent = True
            continue
        other = next((line.strip() for line in data.split(b"\n") if line.strip()), b"")
        said = f" (it said {other[:60].decode('ascii', 'replace')!r})" if other else ""
        if chunk is None and not other:
            return Reach(False, f"{where} accepts connections but sent no SSH banner within {bound:g} s: a stalled "
                                "SSH server, or not one (a firewall, NAT or another service?)")
        if chunk is None:
            return Reach(False, f"{where} sent no SSH banner within {bound:g} s{said}: not an SSH server")
        return Reach(False, f"{where} closed the connection without an SSH banner{said}: not an SSH server")
    if not sent:
        sock.sendall(PROBE_IDENT)
    while len(data) < 6:  # uint32 packet length, byte padding length, byte message number
        chunk = _recv(sock, deadline, stopped)
        if chunk is None:
            return Reach(False, f"{where} sent its SSH banner ({banner}) and then no key exchange within "
                                f"{bound:g} s: its SSH server is stalled")
        if not chunk:
            return Reach(False, f"{where} closed the connection after its SSH banner ({banner}), before the key "
                                "exchange")
        data += chunk
    if data[5] != SSH_MSG_KEXINIT:
        return Reach(False, f"{where} sent its SSH banner ({banner}) but no key exchange after it: not a working "
                            "SSH server")
    return Reach(True, banner=banner)


# seconds for the rest of the key exchange and the server's first answer in authentication,
# after probe_ssh's part (Ansible's own connection timeout, ANSIBLE_TIMEOUT below)
LOGIN_PROBE_TIMEOUT = 30.0
_KEYS_DONE = "SSH2_MSG_NEWKEYS received"
_AUTH_STARTED = "SSH2_MSG_SERVICE_ACCEPT received"
_AUTH_ANSWERED = ("Authentications that can continue", "Permission denied", "Authenticated to ")


def probe_login(address: str, port: int, user: str, timeout: float = LOGIN_PROBE_TIMEOUT) -> Reach:
    """Does the SSH server at ``address:port`` get through the key exchange and answer the
    start of authentication? OpenSSH's own client (the one Ansible runs) connects offering
    no credentials (method ``none``): a working server answers with the methods it takes.
    It never logs in, sends no key or password, and records no host key. A server that
    stalls in the key exchange or at authentication is unreachable after ``timeout``
    seconds (Ansible waited 45 s per attempt there, 4 attempts: 185 s)."""
    where = f"{address}:{port}"
    argv = ["ssh", "-v", "-o", "BatchMode=yes", "-o", "PreferredAuthentications=none",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "-o", f"ConnectTimeout={max(1, round(timeout))}", "-p", str(port), f"{user}@{address}", "true"]
    with _PROBES_LOCK:
        if _PROBES_STOPPED.is_set():
            return Reach(False, f"{where}: not probed: the command was interrupted")
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True, errors="replace")
        _PROBES.add(proc)
    try:
        try:
            _, said = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, said = proc.communicate()
            return Reach(False, login_stall(where, said, timeout))
    finally:
        with _PROBES_LOCK:
            _PROBES.discard(proc)
    return login_verdict(where, proc.returncode, said)


_PROBES: set[subprocess.Popen[str]] = set()  # probe_login's ssh clients running now
_PROBES_LOCK = threading.Lock()
_PROBES_STOPPED = threading.Event()


@contextlib.contextmanager
def probes_end_with_a_signal() -> Iterator[None]:
    """While open, an exception (a signal's Interrupted) kills every running probe_login ssh
    at once and starts no new one, so the command ends without waiting out their bounds."""
    _PROBES_STOPPED.clear()
    try:
        yield
    except BaseException:
        with _PROBES_LOCK:
            _PROBES_STOPPED.set()
            live = list(_PROBES)
        for proc in live:
            with contextlib.suppress(OSError):
                proc.kill()
        raise


def login_stall(where: str, said: str, timeout: float) -> str:
    """Where in the handshake ssh was when ``timeout`` ran out (``said``: its -v output)."""
    if _AUTH_STARTED in said:
        step = "in authentication (no answer to the first attempt)"
    elif _KEYS_DONE in said:
        step = "after the key exchange, before authentication"
    else:
        step = "in the key exchange"
    return f"{where}: its SSH server stalled {step}: no answer within {timeout:g} s"


def login_verdict(where: str, rc: int, said: str) -> Reach:
    """ssh's exit code and -v output of :func:`probe_login`: ok once authentication answered."""
    if rc == 0 or any(marker in said for marker in _AUTH_ANSWERED):
        return Reach(True)
    lines = [line.strip() for line in said.splitlines() if line.strip() and not line.startswith("debug")]
    last = lines[-1] if lines else f"ssh exit {rc}"
    return Reach(False, f"{where}: the SSH handshake ended before authentication: {last.removeprefix('ssh: ')}")


def probe_reach(address: str, port: int, user: str, timeout: float = SSH_CONNECT_TIMEOUT,
                banner_timeout: float = 10.0, login_timeout: float = LOGIN_PROBE_TIMEOUT) -> Reach:
    """The whole handshake, step by step, each bounded: TCP (``timeout``), the banner and the
    first key exchange packet (``banner_timeout``, :func:`probe_ssh`), the rest of the key
    exchange and the start of authentication (``login_timeout``, :func:`probe_login`)."""
    reach = probe_ssh(address, port, timeout, banner_timeout, _PROBES_STOPPED.is_set)
    if not reach.ok:
        return reach
    login = probe_login(address, port, user, login_timeout)
    return Reach(login.ok, login.reason, reach.banner)


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
               "-o", ssh_path_option("UserKnownHostsFile", known_hosts), "-o", "HashKnownHosts=no",
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
    stall_timeout: int | None = None,
    strategy: str = DEFAULT_STRATEGY,
) -> dict[str, str]:
    """Ansible's environment for a run. ``stall_timeout``: None bounds the tasks without a
    ``timeout:`` of their own by DEFAULT_STALL_TIMEOUT (the roles bound the rest); a number
    bounds every task by it (the ``provision`` strategy caps the tasks' own bounds)."""
    # Ansible's own strategy reuses one SSH connection per node between tasks (ControlMaster);
    # Mitogen keeps its own connection open for the whole run, and an SSH master left from
    # an earlier run to a machine that was since replaced made its connections time out
    multiplex = ["-o ControlMaster=auto", "-o ControlPersist=120s"] if strategy == "linear" else ["-o ControlMaster=no"]
    # Ansible splits ANSIBLE_SSH_ARGS like a shell (shlex) and ssh splits an option's value at
    # blanks: a path is quoted for both (a manifest folder with a space broke every apply)
    ssh_args = " ".join(
        [
            *multiplex,
            "-o " + shlex.quote(ssh_path_option("UserKnownHostsFile", state.known_hosts)),
            "-o StrictHostKeyChecking=accept-new",
            "-o HashKnownHosts=no",
            "-o ServerAliveInterval=15",
            f"-o ConnectTimeout={SSH_CONNECT_TIMEOUT}",
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
        # the facts a run gathers are its own: ansible-runner keeps them with the run's
        # artifacts (fact_cache/), and a later run gathers again (a node's kernel, its
        # packages and addresses change between runs; a role reading them stale would
        # install headers for a kernel the node no longer runs)
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_FORKS": str(forks_for(node_count)),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "True",
        "ANSIBLE_TIMEOUT": "30",
        "ANSIBLE_TASK_TIMEOUT": str(stall_timeout or DEFAULT_STALL_TIMEOUT),
        **({TASK_CAP_ENV: str(stall_timeout)} if stall_timeout else {}),
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
    play: str = ""  # the play of the host's last task
    task_started: float | None = None  # time.monotonic() when the current task began here
    attempt: int = 0  # retries of the current task (`until`), 0 before the first retry
    errors: list[str] = field(default_factory=list)
    events: int = 0  # task results seen for this host: 0 means nothing ran on it
    first_seen: float | None = None
    last_seen: float | None = None
    diffs: list[tuple[str, str]] = field(default_factory=list)  # (task, unified diff) in --check --diff

    def elapsed(self, now: float) -> float:
        return 0.0 if self.task_started is None else now - self.task_started

    @property
    def busy(self) -> float:
        """Seconds from this host's first task to its last result."""
        if self.first_seen is None or self.last_seen is None:
            return 0.0
        return self.last_seen - self.first_seen

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
    finished: bool = True  # the playbook reached its end (its recap); False when stopped
    interrupted: int | None = None  # the signal that stopped the run
    leftovers: list[int] = field(default_factory=list)  # processes that would not stop (pids)

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, p in self.hosts.items() if p.status != "ok")

    def result_of(self, host: str) -> str:
        """What actually ran on ``host``: ok, failed, unreachable, not run (no task started
        there), interrupted (a task had started there when the run stopped before its end)."""
        p = self.hosts.get(host)
        if p is not None and p.status != "ok":
            return p.status
        if p is None or (p.events == 0 and not p.task):
            return "not run"
        if not self.finished:
            return "interrupted"
        return "ok"

    @property
    def log(self) -> Path:
        """ansible-playbook's own output of this run."""
        return self.artifact_dir / "stdout"


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
        self.finished = False  # playbook_on_stats seen: ansible-playbook reached its recap
        self.pid: int | None = None  # ansible-playbook's process id (from the events)

    def _host(self, name: str) -> HostProgress:
        return self.hosts.setdefault(name, HostProgress(name))

    def _result(self, name: str) -> HostProgress:
        p = self._host(name)
        p.events += 1
        p.last_seen = self.clock()
        if p.first_seen is None:
            p.first_seen = p.last_seen
        return p

    def unreachable(self, name: str, reason: str) -> None:
        """Record a host found unreachable before Ansible ran (the reachability probe)."""
        p = self._host(name)
        p.unreachable = True
        p.errors.append(f"unreachable: {reason}")
        if self.on_change is not None:
            self.on_change(self)

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        host = data.get("host") or data.get("remote_addr")
        if self.pid is None and isinstance(event.get("pid"), int):
            self.pid = event["pid"]
        if kind == "playbook_on_play_start":
            self.play = str(data.get("play", ""))
        elif kind == "playbook_on_stats":
            self.finished = True
        elif host and kind == "runner_on_start":
            p = self._host(host)
            p.role = str(data.get("role", "") or "")
            p.task = str(data.get("task", "") or "")
            p.play = str(data.get("play", "") or self.play)
            p.task_started = self.clock()
            p.attempt = 0
            if p.first_seen is None:
                p.first_seen = p.task_started
        elif host and kind == "runner_retry":
            self._host(host).attempt = int((data.get("res") or {}).get("attempts", 0) or 0)
        elif host and kind == "runner_item_on_ok":
            res = data.get("res") or {}
            if res.get("changed") and res.get("diff"):
                self._host(host).diffs.append((str(data.get("task", "")), render_diff(res["diff"])))
            return True
        elif host and kind == "runner_on_ok":
            p = self._result(host)
            p.task_started = None
            res = data.get("res") or {}
            if res.get("changed"):
                p.changed += 1
                if res.get("diff") and not res.get("results"):
                    p.diffs.append((str(data.get("task", "")), render_diff(res["diff"])))
            else:
                p.ok += 1
        elif host and kind == "runner_on_skipped":
            self._result(host).skipped += 1
        elif host and kind == "runner_on_failed" and not data.get("ignore_errors"):
            p = self._result(host)
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
        elif host and kind == "runner_on_failed":  # ignore_errors: it ran, and the host goes on
            self._result(host).ok += 1
        elif host and kind == "runner_on_unreachable":
            p = self._result(host)
            p.task_started = None
            p.unreachable = True
            reason = unreachable_reason(data.get("res") or {})
            if p.first_seen is not None and p.last_seen is not None and p.busy >= 1:
                reason += f" (after {p.busy:.0f} s)"
            p.errors.append(f"unreachable: {reason}")
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


_UNREACHABLE_PREFIXES = ("Task failed: ", "Failed to connect to the host via ssh: ")


def unreachable_reason(res: dict[str, Any]) -> str:
    """One short reason for an unreachable host: Ansible's message without its prefixes,
    repeated sentences once (ssh retries repeat them: ``[Errno 32] Broken pipe. [Errno 32]
    Broken pipe``), errno numbers in words."""
    text = str(res.get("msg") or "").strip()
    for prefix in _UNREACHABLE_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):].strip()
    parts: list[str] = []
    for part in re.split(r"(?<=[.!])\s+|\r?\n", text):
        part = part.strip().rstrip(".")
        if part and part not in parts:
            parts.append(part)
    words = [errno_text_reason(part) or part for part in parts]
    reason = "; ".join(dict.fromkeys(words))
    return reason[:300] if reason else "the host could not be reached over SSH"


def _lines(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.splitlines(keepends=True)
    if isinstance(value, dict):
        return [f"{k}: {json.dumps(v, default=str)}\n" for k, v in sorted(value.items())]
    return [] if value is None else [f"{value}\n"]


def render_diff(diff: Any) -> str:
    """Ansible's ``diff`` result (one entry or a list; before/after texts or a prepared
    diff) as unified diff text."""
    out: list[str] = []
    for entry in diff if isinstance(diff, list) else [diff]:
        if not isinstance(entry, dict):
            continue
        if entry.get("prepared"):
            out.append(str(entry["prepared"]).rstrip("\n") + "\n")
            continue
        if "before" not in entry and "after" not in entry:
            continue
        before, after = _lines(entry.get("before")), _lines(entry.get("after"))
        for lines in (before, after):
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
        out.extend(difflib.unified_diff(before, after, fromfile=str(entry.get("before_header") or "before"),
                                        tofile=str(entry.get("after_header") or "after")))
    return "".join(out)


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
    stall_timeout: int | None = None,
    strategy: str = DEFAULT_STRATEGY,
    stop: Callable[[], int | None] | None = None,
    verbosity: int = 0,
) -> RunResult:
    """Run ``playbook`` through ansible-runner. ``stop()`` is polled while it runs: once it
    returns a signal number, ansible-playbook and every process under it (its workers, their
    ssh clients) are stopped, and this returns only when they are gone (``interrupted``)."""
    root = project_root()
    env = ansible_env(state, root, len(hosts), stall_timeout, strategy)
    cmdline = "--check --diff" if check else ""
    private = state.runs / run_id
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    stopped: list[int] = []

    def cancel() -> bool:
        signum = stop() if stop is not None else None
        if signum is not None and not stopped:
            stopped.append(signum)
        return bool(stopped)

    leftovers: list[int] = []
    earlier = set(proctree.descendants())  # not this run's: never stopped here
    with scrubbed_environ(secret_env_names(secret_names or set())), proctree.subreaper():
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
            cancel_callback=cancel,
            quiet=verbosity == 0,
            verbosity=verbosity or None,
            suppress_env_files=True,
            rotate_artifacts=0,
            timeout=None,
        )
        if stopped:
            # ansible-runner killed ansible-playbook's process group; its workers run in
            # sessions of their own and are ours now (subreaper): stop them and wait
            leftovers = proctree.stop_tree(keep=lambda pid: pid in earlier)
        else:
            # a task the stall guard ended (Ansible's task timeout) leaves its ssh client to the
            # stalled node running, adopted by us: nothing of the run outlives it but OpenSSH's
            # connection masters, which close themselves (ControlPersist)
            leftovers = proctree.stop_tree(keep=lambda pid: pid in earlier or proctree.ssh_master(pid))
    stats = result.stats or {}
    for host in stats.get("dark", {}) or {}:
        tracker._host(host).unreachable = True
    for host in stats.get("failures", {}) or {}:
        p = tracker._host(host)
        p.failed = max(p.failed, int(stats["failures"][host]))
    for host, count in (stats.get("changed", {}) or {}).items():
        tracker._host(host).changed = int(count)
    artifact = state.runs / run_id / "artifacts" / "artifacts"
    interrupted = stopped[0] if stopped else None
    if result.rc != 0 and interrupted is None and not any(p.errors for p in tracker.hosts.values()):
        output = (artifact / "stdout").read_text(errors="replace") if (artifact / "stdout").exists() else ""
        lines = [line for line in output.splitlines() if line.strip()][-5:]
        raise ProvisionError(f"ansible-playbook failed (rc {result.rc}): " + " | ".join(lines)
                             + f" (full log: {artifact / 'stdout'})")
    return RunResult(int(result.rc), str(result.status), tracker.hosts, artifact,
                     finished=tracker.finished and interrupted is None, interrupted=interrupted, leftovers=leftovers)


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
