"""provisioner.verify.remote: the ssh command line and its bounds (a stand-in ssh on PATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from provisioner.runner import SshTarget
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
