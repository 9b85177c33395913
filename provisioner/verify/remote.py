"""The SSH edge of `provision verify` (and status, drain, remove): one bounded ``ssh`` per
command, over one shared connection per node while the command runs.

The same access as apply: the manifest's SSH user, port and key, the state directory's
known_hosts (a changed host key is refused). Each command is bounded twice: ``timeout`` on
the node ends it there, and the local process is killed a little later if the node or the
network stalls (ConnectTimeout covers the connection itself).
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from provisioner.errors import ProvisionError
from provisioner.interrupts import Signals
from provisioner.manifest.model import Manifest
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget, ssh_path_option
from provisioner.verify.run import TIMED_OUT, Execute

CONNECT_TIMEOUT = 10  # seconds for the SSH connection
GRACE = 15  # seconds beyond a command's own bound before the local ssh is killed
# A shared connection outlives its last command by this much at most: the command closes
# them when it ends; this bounds one left by a process that was killed outright.
CONTROL_PERSIST = 60
CLOSE_TIMEOUT = 10


def ssh_argv(target: SshTarget, known_hosts: Path, text: str, timeout: int, shared: Path | None = None) -> list[str]:
    """``shared``: the folder of the command's shared connections (one per node, see
    :func:`children_end_with_the_command`); None: a connection of its own."""
    share = (["-o", "ControlMaster=auto", "-o", ssh_path_option("ControlPath", shared / "%C"),
              "-o", f"ControlPersist={CONTROL_PERSIST}"] if shared is not None else ["-o", "ControlMaster=no"])
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
           "-o", ssh_path_option("UserKnownHostsFile", known_hosts), "-o", "HashKnownHosts=no",
           "-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
           *share, "-o", "LogLevel=ERROR", "-p", str(target.port)]
    if target.private_key:
        cmd += ["-i", target.private_key, "-o", "IdentitiesOnly=yes"]
    remote = f"LC_ALL=C timeout -k 5 {timeout} sh -c {shlex.quote(text)}"
    return [*cmd, f"{target.user}@{target.address}", remote]


def ssh_failure(stderr: str) -> str:
    """ssh's own failure in one line with one ``ssh:`` (its messages start with one already)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "exit 255"
    return last if last.startswith("ssh: ") else f"ssh: {last}"


class Children:
    """The ssh processes running now, so that a signal can end them all (the commands pass
    :meth:`on_signal` to ``interrupts.Signals``): a SIGTERM left them running, and a drain could
    land after 'interrupted' was printed. Once stopped, no new one starts.

    The signal handler runs in the main thread between any two of its steps: while the main
    thread holds the lock or starts an ssh (:meth:`_critical`), the handler only marks the
    stop, and the main thread ends the children and raises once out of it. Taking the lock in
    the handler there waited for itself forever (a drain hung after SIGTERM), and raising
    inside ``Popen`` would lose a started ssh."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self.stopped = False
        self.shared: Path | None = None  # the command's shared connections (a private folder)
        self.signals: Signals | None = None  # the command's signal handling, while it runs
        self._in_critical = False  # the main thread holds the lock or starts an ssh
        self._held = False  # a signal came meanwhile: the main thread stops and raises after

    @contextlib.contextmanager
    def _critical(self) -> Iterator[None]:
        """The lock, with signals held off in the main thread until it is released."""
        main = threading.current_thread() is threading.main_thread()
        outer = self._in_critical
        if main:
            self._in_critical = True
        try:
            with self._lock:
                yield
        finally:
            if main:
                self._in_critical = outer
        if main and not outer and self._held:
            self._held = False
            self.stop()
            if self.signals is not None:
                self.signals.raise_if_stopped()

    def on_signal(self) -> bool:
        """For ``Signals``: end every ssh now, or mark it when the main thread cannot be
        broken off (True: hold the raise; :meth:`_critical` raises)."""
        self.stopped = True
        if self._in_critical:
            self._held = True
            return True
        self.stop()
        return False

    def start(self, argv: list[str]) -> subprocess.Popen[str] | None:
        with self._critical():
            if self.stopped:
                return None
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                    text=True, errors="replace")
            self._live.add(proc)
            return proc

    def reopen(self) -> None:
        with self._critical():
            self.stopped = False
            self._held = False

    def finished(self, proc: subprocess.Popen[str]) -> None:
        with self._critical():
            self._live.discard(proc)

    def stop(self, wait: float = 5.0) -> None:
        """TERM every live ssh, KILL what is left after ``wait`` seconds, and reap them."""
        with self._critical():
            self.stopped = True
            live = list(self._live)
        for proc in live:
            with contextlib.suppress(OSError):
                proc.terminate()
        deadline = time.monotonic() + wait
        for proc in live:  # only waits with a timeout: the main thread may be inside this process's communicate()
            try:
                proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2)


CHILDREN = Children()  # this process's ssh clients (one command runs per process)


@contextlib.contextmanager
def children_end_with_the_command() -> Iterator[None]:
    """While open, SIGINT, SIGTERM and SIGHUP end every ssh of this process at once, then
    raise Interrupted (one line and 128 + the signal, through commands.common.guarded); on
    any way out, no ssh is left running.

    The command's commands to one node share one SSH connection (ssh's ControlMaster, its
    socket in a private folder made here): a new connection costs a key exchange and a
    login each time, seconds on a busy or slow node (verify runs about 20 commands a node).
    The shared connections are closed on the way out. Opened inside another (an apply's
    disk read inside a roll that drains), it is that one: the outer one ends and closes."""
    if CHILDREN.shared is not None:
        yield
        return
    CHILDREN.reopen()
    try:
        CHILDREN.shared = Path(tempfile.mkdtemp(prefix="provision-ssh-"))
    except OSError as exc:  # a full or read-only temporary folder: say what it was for
        raise ProvisionError(f"cannot make the folder of the SSH connections: {exc.strerror or exc}; "
                             "set TMPDIR to a writable folder with room") from None
    try:
        with Signals(on_signal=CHILDREN.on_signal) as signals:
            CHILDREN.signals = signals
            yield
    finally:
        CHILDREN.signals = None
        CHILDREN.stop()
        close_shared(CHILDREN.shared)
        CHILDREN.shared = None
        CHILDREN.reopen()  # the next command in this process (tests call several) starts afresh


def close_shared(folder: Path) -> None:
    """End the shared connections whose sockets are in ``folder``, then remove it."""
    for socket in folder.iterdir():
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["ssh", "-o", ssh_path_option("ControlPath", socket), "-O", "exit", "shared"],
                           capture_output=True, timeout=CLOSE_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    shutil.rmtree(folder, ignore_errors=True)


def node_targets(m: Manifest, names: Iterable[str]) -> dict[str, SshTarget]:
    """How to reach each of ``names`` over SSH: its management address and the manifest's SSH
    settings (port, user, key)."""
    ssh = m.cluster.ssh
    return {n: SshTarget(n, str(m.node(n).ip), ssh.port, ssh.user, ssh.private_key) for n in names}


def ssh_executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = GRACE) -> Execute:
    def execute(host: str, text: str, timeout: int) -> Output:
        argv = ssh_argv(targets[host], known_hosts, text, timeout, CHILDREN.shared)
        proc = CHILDREN.start(argv)
        if proc is None:
            return Output(rc=-1, error="not run: the command was interrupted")
        try:
            stdout, stderr = proc.communicate(timeout=timeout + grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return Output(rc=-1, error=f"{TIMED_OUT} {timeout + grace:g} s (no answer from {host})")
        finally:
            CHILDREN.finished(proc)
        r = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        if r.returncode == 255:  # ssh's own failure: the node was not reached
            return Output(rc=255, stderr=r.stderr, error=ssh_failure(r.stderr))
        if r.returncode == 124:  # timeout(1) on the node ended the command
            return Output(rc=124, stdout=r.stdout, stderr=r.stderr, error=f"{TIMED_OUT} {timeout} s on {host}")
        return Output(rc=r.returncode, stdout=r.stdout, stderr=r.stderr)
    return execute
