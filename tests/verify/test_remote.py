"""provisioner.verify.remote: the ssh command line and its bounds (a stand-in ssh on PATH)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.runner import SshTarget
from provisioner.verify import remote
from provisioner.verify.remote import ssh_argv, ssh_executor
from provisioner.verify.run import TIMED_OUT

TARGET = SshTarget("n1", "127.0.0.1", 2222, "ops", "/keys/id ed25519")


def test_argv_is_bounded_and_checks_host_keys(tmp_path: Path) -> None:
    argv = ssh_argv(TARGET, tmp_path / "known hosts", "chronyc -n tracking", 40)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ConnectTimeout=10" in argv
    assert f'UserKnownHostsFile="{tmp_path / "known hosts"}"' in argv
    assert argv[argv.index("-i") + 1] == "/keys/id ed25519" and argv[argv.index("-p") + 1] == "2222"
    assert argv[-2] == "ops@127.0.0.1"
    assert argv[-1] == "LC_ALL=C timeout -k 5 40 sh -c 'chronyc -n tracking'"


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``ssh`` that behaves as $FAKE_SSH says: ok, down, timeout (on the node), hang."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ssh"
    script.write_text("""#!/bin/sh
case "$FAKE_SSH" in
  ok) echo "out"; echo "err" >&2; exit 3 ;;
  down) echo "ssh: connect to host 127.0.0.1 port 2222: Connection refused" >&2; exit 255 ;;
  timeout) exit 124 ;;
  hang) exec sleep 30 ;;
esac
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_outcomes(fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    execute = ssh_executor({"n1": TARGET}, tmp_path / "kh", grace=0.5)
    monkeypatch.setenv("FAKE_SSH", "ok")
    out = execute("n1", "true", 1)
    assert (out.rc, out.stdout, out.stderr, out.error) == (3, "out\n", "err\n", "")
    monkeypatch.setenv("FAKE_SSH", "down")
    assert execute("n1", "true", 1).error == "ssh: connect to host 127.0.0.1 port 2222: Connection refused"  # once
    monkeypatch.setenv("FAKE_SSH", "timeout")
    assert execute("n1", "true", 7).error == f"{TIMED_OUT} 7 s on n1"
    monkeypatch.setenv("FAKE_SSH", "hang")
    start = time.monotonic()
    out = execute("n1", "true", 1)
    assert out.error == f"{TIMED_OUT} 1.5 s (no answer from n1)" and time.monotonic() - start < 10


def test_commands_of_one_command_share_a_connection_per_node(tmp_path: Path) -> None:
    """A new SSH connection costs a key exchange and a login (seconds on a busy node): within
    a command, one connection per node serves every command to it; outside one, none is shared."""
    alone = ssh_argv(TARGET, tmp_path / "kh", "true", 5)
    assert "ControlMaster=no" in alone and not any(a.startswith("ControlPath") for a in alone)
    shared = ssh_argv(TARGET, tmp_path / "kh", "true", 5, tmp_path / "shared")
    assert "ControlMaster=auto" in shared and f"ControlPersist={remote.CONTROL_PERSIST}" in shared
    assert f'ControlPath="{tmp_path / "shared"}/%C"' in shared


def test_the_shared_connections_are_closed_and_their_folder_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh.log"
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with remote.children_end_with_the_command():
        folder = remote.CHILDREN.shared
        assert folder is not None and folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
        execute = ssh_executor({"n1": TARGET}, tmp_path / "kh")
        assert execute("n1", "true", 5).rc == 0
        assert f'ControlPath="{folder}/%C"' in log.read_text()
        (folder / "0123abcd").touch()  # the socket ssh would have made for n1
    assert remote.CHILDREN.shared is None and not folder.exists()
    assert f'-o ControlPath="{folder / "0123abcd"}" -O exit shared' in log.read_text()


def test_one_opened_inside_another_is_that_one() -> None:
    """An apply's disk read opens one inside a roll's (which drains over SSH): closing the
    inner one left the outer one without its folder, and the roll ended in an internal error."""
    with remote.children_end_with_the_command():
        folder = remote.CHILDREN.shared
        with remote.children_end_with_the_command():
            assert remote.CHILDREN.shared == folder
        assert remote.CHILDREN.shared == folder and folder is not None and folder.is_dir()
    assert remote.CHILDREN.shared is None and not folder.exists()


SIGNAL_WHILE_STARTING = """
import os, signal, subprocess, sys
from provisioner.interrupts import Interrupted
from provisioner.verify import remote
real = subprocess.Popen
started = []
def popen(*args, **kwargs):
    proc = real(*args, **kwargs)
    started.append(proc)
    os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, in start(), the lock held
    return proc
remote.subprocess.Popen = popen
try:
    with remote.children_end_with_the_command():
        remote.CHILDREN.start(["sleep", "30"])
    sys.exit("no Interrupted")
except Interrupted as exc:
    assert exc.signum == signal.SIGTERM, exc
remote.subprocess.Popen = real
assert started and started[0].poll() is not None, "the ssh started as the signal came is still running"
print("ok")
"""


def test_a_signal_while_an_ssh_starts_ends_it_and_raises_once_out() -> None:
    """A SIGTERM whose handler ran while the main thread held the children's lock (starting an
    ssh) waited for that lock forever: ``provision drain`` hung (CI, under load). Now the handler
    only marks it there; the ssh just started is ended and Interrupted raised once out."""
    done = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_STARTING], capture_output=True, text=True,
                          timeout=60, check=False, cwd=Path(__file__).resolve().parents[2])
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
