"""Ctrl-C, SIGTERM and SIGHUP during `provision apply` (issue 18 items 7 and 9).

The unit part checks provisioner.interrupts.Signals. The CLI part runs the real `provision
apply` in a subprocess against a stand-in project (PROVISION_HOME) whose site.yml runs
`sleep` with ``connection: local`` on two nodes; the nodes' SSH port is a banner-only
server on 127.0.0.2/127.0.0.3 (apply probes it before Ansible starts). A signal arrives
while the sleeps run: the command must exit 128 + signal with "interrupted", leave no
process of the run behind, have recorded the run as interrupted with where each node
stopped, and have released the lock. Each case takes a few seconds.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators.ssh import new_host_key, serve_handshake  # noqa: E402

from provisioner.interrupts import Interrupted, Signals  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ADDRESSES = ("127.0.0.2", "127.0.0.3")


# --------------------------------------------------------------------------- Signals
def test_a_signal_raises_interrupted_outside_deferred_sections() -> None:
    with Signals() as signals, pytest.raises(Interrupted) as info:
        signal.raise_signal(signal.SIGTERM)
    assert signals.received == signal.SIGTERM
    assert info.value.exit_code == 143 and str(info.value) == "interrupted by SIGTERM"


def test_inside_deferred_a_signal_is_only_recorded() -> None:
    with Signals() as signals:
        with signals.deferred():
            signal.raise_signal(signal.SIGHUP)
            assert signals.stop_requested()
            assert signals.wait(30) is True  # returns at once
        with pytest.raises(Interrupted, match=r"interrupted by SIGHUP: while testing"):
            signals.raise_if_stopped("while testing")


def test_ctrl_c_is_exit_130_and_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    with Signals(), pytest.raises(Interrupted) as info:
        signal.raise_signal(signal.SIGINT)
    assert info.value.exit_code == 130 and str(info.value) == "interrupted (Ctrl-C)"
    assert signal.getsignal(signal.SIGINT) is before


def test_wait_sleeps_when_no_signal_comes() -> None:
    with Signals() as signals:
        start = time.monotonic()
        assert signals.wait(0.3) is False
        assert time.monotonic() - start >= 0.3


def test_a_signal_ignored_at_start_stays_ignored() -> None:
    """nohup sets SIGHUP to SIG_IGN; Signals replaced it and a closed terminal stopped the
    apply anyway (rc 129, issue 27 item 3)."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with Signals() as signals:
            signal.raise_signal(signal.SIGHUP)  # no Interrupted
            assert not signals.stop_requested()
            with pytest.raises(Interrupted):  # the others are still caught
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


# --------------------------------------------------------------------------- the real CLI
class BannerServer:
    """Answers every connection as an SSH server does up to authentication (apply's probe
    goes that far), then closes."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        first = socket.create_server((addresses[0], 0))
        self.port = first.getsockname()[1]
        self.socks = [first, *(socket.create_server((a, self.port)) for a in addresses[1:])]
        self.stop = threading.Event()
        self.key = new_host_key()
        self.threads = [threading.Thread(target=self.serve, args=(s,), daemon=True) for s in self.socks]
        for t in self.threads:
            t.start()

    def serve(self, sock: socket.socket) -> None:
        sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_handshake, args=(conn, self.key), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        for s in self.socks:
            s.close()


def stand_in_project(root: Path, marker: str) -> Path:
    (root / "playbooks").mkdir(parents=True)
    (root / "roles").mkdir()
    # each node a path of this Python of its own: Mitogen serves local-connection hosts that
    # share an interpreter from one context, one task at a time; with one each they run side
    # by side, as two real nodes do
    for node in ("n1", "n2"):
        (root / f"python-{node}").symlink_to(sys.executable)
    interpreter = {"ansible_python_interpreter": f"{root}/python-{{{{ inventory_hostname }}}}"}
    plays = [
        {"name": "common - base system", "hosts": "all:&{{ provision_targets | default('all') }}",
         "connection": "local", "gather_facts": False, "vars": interpreter,
         "tasks": [{"name": "Wait", "ansible.builtin.command": f"sleep {marker}"}]},
        {"name": "common - cluster-wide files", "hosts": "all", "connection": "local", "gather_facts": False,
         "vars": interpreter,
         "tasks": [{"name": "Render", "ansible.builtin.debug": {"msg": "never reached"}}]},
    ]
    (root / "playbooks" / "site.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    return root


def manifest(port: int) -> dict[str, Any]:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA ops@test"
    return {
        "version": 1,
        "cluster": {"name": "sig", "admin_users": [{"name": "ops", "ssh_keys": [key]}], "ssh": {"port": port}},
        "networks": {"management": {"cidr": "127.0.0.0/8"}},
        "nodes": [
            {"name": f"n{i}", "roles": ["head"] if i == 1 else ["compute"], "os": "debian-12",
             "interfaces": {"management": {"ip": address}},
             "hardware": {"cpu": {"cores_per_socket": 2}, "memory_gb": 4}}
            for i, address in enumerate(ADDRESSES, start=1)
        ],
        "docker": {"enabled": False},
        "slurm": {"enabled": False},
        "software": {"nvidia_driver": {"branch": "535", "source": "debian"},
                     "cuda": {"versions": ["11.8"], "source": "debian"}},
    }




@pytest.fixture
def banner() -> Iterator[BannerServer]:
    try:
        server = BannerServer(ADDRESSES)
    except OSError as exc:
        pytest.skip(f"cannot listen on {ADDRESSES}: {exc}")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize(("sig", "strategy"), [(signal.SIGINT, "mitogen"), (signal.SIGTERM, "mitogen"),
                                               (signal.SIGHUP, "mitogen"), (signal.SIGTERM, "linear")])
def test_a_signal_stops_the_whole_run_records_it_and_frees_the_lock(processes_with: Callable[[str], list[int]],
    tmp_path: Path, banner: BannerServer, sig: signal.Signals, strategy: str
) -> None:
    marker = f"{9000 + int(sig) * 20 + (strategy == 'linear') * 10 + os.getpid() % 10}"
    project = stand_in_project(tmp_path / "project", marker)
    path = tmp_path / "cluster dir" / "cluster.yaml"  # a space in the path, too (item 10)
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(manifest(banner.port), sort_keys=False))
    env = dict(os.environ, PROVISION_HOME=str(project))
    exe = Path(sys.executable).parent / "provision"
    proc = subprocess.Popen([str(exe), "apply", str(path), "--yes", "--strategy", strategy], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(processes_with(f"sleep {marker}")) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the sleep tasks never started"
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, (out, err)
    assert "interrupted" in err
    assert processes_with(f"sleep {marker}") == []
    assert processes_with(str(path.parent / ".provision")) == []  # no ansible-playbook of the run either
    state = json.loads((path.parent / ".provision" / "state.json").read_text())
    last = state["runs"][-1]
    assert last["result"] == "interrupted" and last["finished"]
    assert last["note"] == f"interrupted by {sig.name}"
    assert last["results"] == {"n1": "interrupted", "n2": "interrupted"}
    assert last["stopped_at"] == dict.fromkeys(["n1", "n2"], "common - base system: Wait (running)")
    assert {n["last_result"] for n in state["nodes"].values()} == {"interrupted"}
    assert all(n["applied_at"] is None for n in state["nodes"].values())
    with (path.parent / ".provision" / "lock").open("r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_nohup_apply_goes_on_after_sighup(processes_with: Callable[[str], list[int]], tmp_path: Path,
                                          banner: BannerServer) -> None:
    """Started as by nohup (SIGHUP ignored): a SIGHUP changes nothing, a SIGTERM still stops it."""
    marker = f"{9400 + os.getpid() % 10}"  # beside the signal cases' 9020-9319
    project = stand_in_project(tmp_path / "project", marker)
    path = tmp_path / "cluster" / "cluster.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(manifest(banner.port), sort_keys=False))
    env = dict(os.environ, PROVISION_HOME=str(project))
    exe = Path(sys.executable).parent / "provision"
    proc = subprocess.Popen([str(exe), "apply", str(path), "--yes"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 90
        while len(processes_with(f"sleep {marker}")) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the sleep tasks never started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)
        assert proc.poll() is None and len(processes_with(f"sleep {marker}")) == 2
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, (out, err)
    assert processes_with(f"sleep {marker}") == []
