"""The bare-metal install lifecycle: from powered-off servers to reachable nodes.

For every node to install, in parallel and each under its own deadline:

1. the PXE server must have the node armed (``playbooks/baremetal.yml`` with
   ``pxe_server_arm_nodes``), so its next PXE boot starts the installer;
2. the BMC sets the next boot (only) to PXE in the node's boot mode, read back to
   confirm, then power cycles the node and sees it come on;
3. the installer reports "installed" to the PXE server (which from then on boots the
   node from its disk: no reinstall loop), carrying the new system's SSH host keys;
4. SSH answers with one of the reported host keys (not the installer's own SSH server),
   and those keys go into the caller's known_hosts.

One node's failure is that node's :class:`InstallResult` (stage and reason); it never
stops the others. Which nodes to install is :func:`plan_installs`: nodes the manifest
marks ``install: pxe`` while their state is ``new``, and nodes named with ``--reinstall``;
nothing else is ever installed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from provisioner.areas.baremetal.decide import (
    PXE_HTTP_PORT,
    InstallResult,
    install_server,
    not_installable,
    plan_installs,
)
from provisioner.areas.baremetal.deploy import image_file
from provisioner.bmc import Bmc, BmcError, make_bmc, wait_for_power
from provisioner.image.build import deploy_extra_vars
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.state import atomic_write

BmcFactory = Callable[[Node], Bmc]
EventSink = Callable[[str, str], None]
SSH_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512")
# Host key scans offer one key type per handshake; a server without that type fails the
# handshake on purpose. paramiko would log each as an error: give the scans their own
# quiet log channel.
SCAN_LOG_CHANNEL = "provisioner.baremetal.sshscan"
logging.getLogger(SCAN_LOG_CHANNEL).setLevel(logging.CRITICAL)
logging.getLogger(SCAN_LOG_CHANNEL).propagate = False

__all__ = ["InstallResult", "Stopped", "plan_installs"]  # decided in decide.py, used with the lifecycle here


# --------------------------------------------------------------------------- reports
@dataclass(frozen=True)
class InstallReport:
    """A node's state on the PXE server: armed, installed, failed (an image deploy said at
    which step) or local (not armed)."""

    state: str
    host_keys: tuple[str, ...] = ()
    since: str | None = None
    failure: str = ""  # "<step>: <message>" of a failed deploy


class ReportError(Exception):
    """The PXE server's status could not be read."""


ReportProbe = Callable[[str], InstallReport]


def parse_report(payload: object) -> InstallReport:
    if not isinstance(payload, dict) or not isinstance(payload.get("state"), str):
        raise ReportError("the PXE server answered without a state")
    keys = payload.get("host_keys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ReportError("the PXE server answered malformed host keys")
    since = payload.get("since")
    failure = f"{payload.get('step')}: {payload.get('message')}" if payload["state"] == "failed" else ""
    return InstallReport(payload["state"], tuple(keys), since if isinstance(since, str) else None, failure)


def http_report_probe(base_url: str, *, timeout: float = 10.0) -> ReportProbe:
    """Read ``GET <base_url>/api/status/<node>`` from the PXE server's pxe-state."""
    base = base_url.rstrip("/")

    def probe(node: str) -> InstallReport:
        url = f"{base}/api/status/{node}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                payload = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise ReportError(f"{url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ReportError(f"cannot read {url}: {reason}") from None
        return parse_report(payload)

    return probe


def default_report_url(m: Manifest, port: int = PXE_HTTP_PORT) -> str:
    """The head node's PXE web server, where pxe-state answers status requests."""
    return install_server(m, port).base_url


# --------------------------------------------------------------------------- ssh
def scan_host_keys(host: str, port: int, *, timeout: float = 10.0,
                   key_types: Sequence[str] = SSH_KEY_TYPES) -> list[str]:
    """The SSH server's host keys (``type base64``), one handshake per key type.

    Raises OSError when nothing accepts a connection; key types the server does not
    offer are left out.
    """
    keys: list[str] = []
    reached = False
    last_error: Exception | None = None
    for key_type in key_types:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            last_error = exc
            continue
        reached = True
        transport = paramiko.Transport(sock)
        transport.set_log_channel(SCAN_LOG_CHANNEL)
        try:
            transport.banner_timeout = timeout
            transport.handshake_timeout = timeout
            transport.get_security_options().key_types = (key_type,)
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
            line = f"{key.get_name()} {key.get_base64()}"
            if line not in keys:
                keys.append(line)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            last_error = exc
        finally:
            transport.close()
    if not reached:
        raise OSError(f"no SSH server at {host}:{port}: {last_error}")
    if not keys and last_error is not None:
        raise OSError(f"SSH at {host}:{port} did not complete a handshake: {last_error}")
    return keys


def known_hosts_names(host_names: Sequence[str], port: int) -> list[str]:
    return [name if port == 22 else f"[{name}]:{port}" for name in host_names]


def _hashed_matches(pattern: str, names: Sequence[str]) -> bool:
    # |1|base64(salt)|base64(HMAC-SHA1(salt, name))
    parts = pattern.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2])
        want = base64.b64decode(parts[3])
    except ValueError:
        return False
    return any(hmac.compare_digest(hmac.new(salt, n.encode(), hashlib.sha1).digest(), want) for n in names)


def updated_known_hosts(text: str, names: Sequence[str], keys: Sequence[str]) -> str:
    """``text`` (a known_hosts file) without any entry for ``names`` (plain or hashed),
    plus one line carrying ``keys`` for them. A reinstalled node has new keys, so its old
    entries must go rather than clash."""
    wanted = set(names)
    kept: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if fields and not line.lstrip().startswith("#"):
            marker = fields[0].startswith("@")
            hosts_field = fields[1] if marker and len(fields) > 1 else fields[0]
            patterns = hosts_field.split(",")
            if any(p in wanted for p in patterns) or any(_hashed_matches(p, names) for p in patterns):
                continue
        kept.append(line)
    hosts = ",".join(names)
    kept.extend(f"{hosts} {key}" for key in keys)
    return "\n".join(kept) + "\n"


_KNOWN_HOSTS_LOCK = threading.Lock()


def record_host_keys(path: Path, names: Sequence[str], keys: Sequence[str]) -> None:
    """Replace the entries for ``names`` in the known_hosts file at ``path`` (atomic)."""
    with _KNOWN_HOSTS_LOCK:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            old = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            old, mode = "", 0o644
        atomic_write(path, updated_known_hosts(old, names, keys), mode)


# --------------------------------------------------------------------------- lifecycle
@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``total`` bounds one node from start to SSH; the others bound steps."""

    total: float = 5400.0
    power_on: float = 180.0
    ssh: float = 1800.0
    poll: float = 10.0
    ssh_handshake: float = 10.0


class Stopped(Exception):
    """Raised by the caller's ``sleep`` when the run is being stopped (a signal): each node
    ends at its next wait with a ``stopped`` result."""


class _Failed(Exception):
    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(reason)
        self.stage = stage
        self.reason = reason


@dataclass
class _Run:
    node: Node
    deadline: float
    warnings: list[str] = field(default_factory=list)


def _arm_hint(node: str) -> str:
    return f"run playbooks/baremetal.yml with pxe_server_arm_nodes=[{node}] first"


def install_nodes(
    m: Manifest,
    nodes: Sequence[str],
    *,
    known_hosts: Path,
    report_probe: ReportProbe | None = None,
    bmc_factory: BmcFactory = make_bmc,
    ssh_endpoint: Callable[[Node], tuple[str, int]] | None = None,
    timeouts: Timeouts = Timeouts(),
    max_parallel: int = 16,
    on_event: EventSink | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[InstallResult]:
    """Install ``nodes`` (names from :func:`plan_installs`) in parallel; one result per
    node, in the given order. See the module docstring for the steps."""
    probe = report_probe or http_report_probe(default_report_url(m))
    endpoint = ssh_endpoint or (lambda n: (str(n.ip), m.cluster.ssh.port))
    say: EventSink = on_event or (lambda _node, _msg: None)
    by_name = {n.name: n for n in m.nodes}
    missing = [n for n in nodes if n not in by_name]
    if missing:
        raise KeyError(f"unknown node(s): {', '.join(missing)}")

    def wait_until(run: _Run, limit: float) -> float:
        return min(run.deadline, clock() + limit)

    def check_armed(run: _Run) -> None:
        name = run.node.name
        try:
            report = probe(name)
        except ReportError as exc:
            raise _Failed("pxe", f"{name}: cannot ask the PXE server about it: {exc}") from None
        if report.state != "armed":
            raise _Failed("pxe", f"{name}: the PXE server has it {report.state}, not armed; {_arm_hint(name)}")

    def boot_installer(run: _Run) -> None:
        node = run.node
        mode = node.bmc.boot_mode if node.bmc is not None else "uefi"
        say(node.name, f"BMC: next boot PXE ({mode}), power cycle")
        bmc = bmc_factory(node)
        try:
            confirmation = bmc.set_boot_once("pxe", mode)
            run.warnings.extend(confirmation.warnings)
            bmc.power_cycle()
            limit = max(0.0, wait_until(run, timeouts.power_on) - clock())
            wait_for_power(bmc, "on", timeout=limit, interval=min(timeouts.poll, 2.0), clock=clock, sleep=sleep)
        finally:
            bmc.close()

    def wait_for_report(run: _Run) -> InstallReport:
        name = run.node.name
        say(name, "installing; waiting for the install report")
        last_error = ""
        while True:
            try:
                report = probe(name)
                last_error = ""
                if report.state == "installed":
                    return report
                if report.state == "failed":
                    raise _Failed("install", f"{name}: the image deploy failed at {report.failure}; the node "
                                  "stays new (it boots its disk until it is armed again)")
                if report.state != "armed":
                    raise _Failed("install", f"{name}: the PXE server disarmed it during the install "
                                  f"(state {report.state})")
            except ReportError as exc:
                last_error = str(exc)
            if clock() >= run.deadline:
                detail = f"; last error: {last_error}" if last_error else "; the PXE server still has it armed"
                raise _Failed("install", f"{name}: no install report within the {timeouts.total:.0f} s limit{detail}")
            sleep(timeouts.poll)

    def wait_for_ssh(run: _Run, report: InstallReport) -> tuple[str, ...]:
        node = run.node
        host, port = endpoint(node)
        say(node.name, f"installed; waiting for SSH on {host}:{port}")
        expected = set(report.host_keys)
        limit = wait_until(run, timeouts.ssh)
        problem = "nothing answered"
        while True:
            try:
                presented = scan_host_keys(host, port, timeout=timeouts.ssh_handshake)
            except OSError as exc:
                presented, problem = [], str(exc)
            if presented:
                if not expected:
                    run.warnings.append(f"{node.name}: the install report carried no host keys; "
                                        "trusted the keys SSH presented on first use")
                    return tuple(presented)
                matching = tuple(k for k in presented if k in expected)
                if matching:
                    return matching
                # the installer's own SSH server, or a reboot in between
                problem = "SSH presents host keys the install report did not list"
            if clock() >= limit:
                raise _Failed("ssh", f"{node.name}: installed, but SSH on {host}:{port} did not come up with "
                              f"the reported host keys in time: {problem}")
            sleep(timeouts.poll)

    def one(name: str) -> InstallResult:
        node = by_name[name]
        start = clock()
        run = _Run(node, start + timeouts.total)
        try:
            problem = not_installable(m, node)
            if problem is not None:
                raise _Failed("config", problem)
            if node.bmc is None:
                raise _Failed("config", f"{name} has no bmc section in the manifest")
            check_armed(run)
            try:
                boot_installer(run)
            except BmcError as exc:
                raise _Failed("bmc", str(exc)) from None
            report = wait_for_report(run)
            keys = wait_for_ssh(run, report)
            host, port = endpoint(node)
            names = known_hosts_names(list(dict.fromkeys([name, f"{name}.{m.cluster.domain}", str(node.ip), host])),
                                      port)
            record_host_keys(known_hosts, names, keys)
            say(name, "installed and reachable")
            return InstallResult(name, True, "done", f"{name} installed; SSH host keys recorded", keys,
                                 tuple(run.warnings), clock() - start)
        except _Failed as exc:
            say(name, f"failed: {exc.reason}")
            return InstallResult(name, False, exc.stage, exc.reason, (), tuple(run.warnings), clock() - start)
        except Stopped:
            say(name, "stopped: the run was interrupted")
            return InstallResult(name, False, "stopped", f"{name}: the run was interrupted before its install "
                                 "finished", (), tuple(run.warnings), clock() - start)
        except Exception as exc:  # one node's bug must not take the others down
            reason = f"{name}: unexpected {type(exc).__name__}: {exc}"
            say(name, f"failed: {reason}")
            return InstallResult(name, False, "error", reason, (), tuple(run.warnings), clock() - start)

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(nodes)))) as pool:
        return list(pool.map(one, nodes))


def server_vars(m: Manifest, nodes: Sequence[str], images: Path) -> dict[str, object]:
    """Extra variables for ``playbooks/baremetal.yml``: arm ``nodes`` for installation and publish
    the images of their OSes from the image cache ``images``."""
    files: dict[str, str] = {m.node(n).os: image_file(m, m.node(n).os) for n in nodes}
    return {"pxe_server_arm_nodes": list(nodes), **deploy_extra_vars(images, files)}


def install(m: Manifest, nodes: Sequence[str], *, known_hosts: Path, total: float | None,
            wait: Callable[[float], bool]) -> list[InstallResult]:
    """The area's install step (``provisioner.areas.registry``, ``Install.runner``): install
    ``nodes`` with the default bounds (``total``: seconds for one node, when given); ``wait``
    sleeps and says whether the run is being stopped, which ends each node at its next wait."""
    timeouts = Timeouts() if total is None else Timeouts(total=total)

    def sleep(seconds: float) -> None:
        if wait(seconds):
            raise Stopped()

    return install_nodes(m, nodes, known_hosts=known_hosts, timeouts=timeouts, sleep=sleep)
