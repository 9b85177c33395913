"""The SSH edge of `provision verify`: one bounded ``ssh`` per command.

The same access as apply: the manifest's SSH user, port and key, the state directory's
known_hosts (a changed host key is refused). Each command is bounded twice: ``timeout`` on
the node ends it there, and the local process is killed a little later if the node or the
network stalls (ConnectTimeout covers the connection itself).
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from provisioner.runner import SshTarget, ssh_path_option
from provisioner.verify.catalog import Output
from provisioner.verify.run import TIMED_OUT, Execute

CONNECT_TIMEOUT = 10  # seconds for the SSH connection
GRACE = 15  # seconds beyond a command's own bound before the local ssh is killed


def ssh_argv(target: SshTarget, known_hosts: Path, text: str, timeout: int) -> list[str]:
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
           "-o", ssh_path_option("UserKnownHostsFile", known_hosts), "-o", "HashKnownHosts=no",
           "-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
           "-o", "ControlMaster=no", "-o", "LogLevel=ERROR", "-p", str(target.port)]
    if target.private_key:
        cmd += ["-i", target.private_key, "-o", "IdentitiesOnly=yes"]
    remote = f"LC_ALL=C timeout -k 5 {timeout} sh -c {shlex.quote(text)}"
    return [*cmd, f"{target.user}@{target.address}", remote]


def ssh_failure(stderr: str) -> str:
    """ssh's own failure in one line with one ``ssh:`` (its messages start with one already)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else "exit 255"
    return last if last.startswith("ssh: ") else f"ssh: {last}"


def ssh_executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = GRACE) -> Execute:
    def execute(host: str, text: str, timeout: int) -> Output:
        argv = ssh_argv(targets[host], known_hosts, text, timeout)
        try:
            r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout + grace,
                               check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Output(rc=-1, error=f"{TIMED_OUT} {timeout + grace:g} s (no answer from {host})")
        if r.returncode == 255:  # ssh's own failure: the node was not reached
            return Output(rc=255, stderr=r.stderr, error=ssh_failure(r.stderr))
        if r.returncode == 124:  # timeout(1) on the node ended the command
            return Output(rc=124, stdout=r.stdout, stderr=r.stderr, error=f"{TIMED_OUT} {timeout} s on {host}")
        return Output(rc=r.returncode, stdout=r.stdout, stderr=r.stderr)
    return execute
