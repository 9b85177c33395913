"""Fault suite: signals at several moments of the real CLI (issue 27 items 4 and 6).

Every case runs ``python -m provisioner.cli`` in a subprocess of its own session, bounded,
and asserts the message is one line with no traceback, the exit code is the shell's
128 + signal, and no child of the command survives it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators import mmdebstrap  # noqa: E402
from emulators.ssh import FakeSshServer, StallingProxy, new_host_key  # noqa: E402

from provisioner.cli import interrupted  # noqa: E402

DELAYS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3)  # seconds after the start: imports take ~0.3-1 s


def wait_for(reached: Callable[[], bool], proc: subprocess.Popen[str], what: str, step: float = 0.05) -> None:
    """Until ``reached()`` (60 s at most), while the command still runs."""
    deadline = time.monotonic() + 60
    while not reached():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(step)


def survivors(processes_with: Callable[[str], list[int]], marker: str) -> list[int]:
    """The stand-ins' processes (``sleep <marker>``) still running after the command ended:
    killed here, so a failing test leaves none, and returned for the test to judge."""
    leftovers = processes_with(f"sleep {marker}")
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    return leftovers


@dataclass
class Stopped:
    """How a command stopped by :func:`stop_cli` ended, and the stand-ins' processes it left
    (``sleep <marker>``: killed by then, listed for the test to judge)."""

    rc: int
    out: str
    err: str
    leftovers: list[int]


def stop_cli(argv: list[str], sig: signal.Signals, marker: str, processes_with: Callable[[str], list[int]], *,
             env: dict[str, str] | None = None, reached: Callable[[], bool] | None = None, what: str = "the moment",
             to_group: bool = False, twice: bool = False, settle: float = 0.0, step: float = 0.05,
             timeout: float = 30) -> Stopped:
    """Run ``provision ARGV`` in a session of its own; once ``reached()`` (default: a stand-in
    waits in ``sleep MARKER``) and ``settle`` s later, send ``sig`` to the command alone (as
    kill(1) or a service manager does) or, ``to_group``, to its whole process group (as a
    terminal does), ``twice`` 0.3 s apart; wait ``timeout`` s for it to end (its output goes to
    files: a child left behind holds no pipe open), kill what is left of its group, and sweep
    the stand-ins it left."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", *argv], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            wait_for(reached or (lambda: bool(processes_with(f"sleep {marker}"))), proc, f"never reached {what}",
                     step=step)
            time.sleep(settle)
            send = (lambda: os.killpg(proc.pid, sig)) if to_group else (lambda: proc.send_signal(sig))
            send()
            if twice:
                time.sleep(0.3)
                send()
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            leftovers = survivors(processes_with, marker)
        out.seek(0)
        err.seek(0)
        return Stopped(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                       leftovers)


def interpreter_start(err: str) -> bool:
    """A KeyboardInterrupt traceback from the interpreter's own start-up (its site module, or
    runpy reading the module to run), before any code of ours ran: no program can catch it."""
    lines = err.strip().splitlines()
    return bool(lines) and lines[-1] == "KeyboardInterrupt" and "/provisioner/" not in err and (
        err.startswith("Fatal Python error: init_import_site") or '"<frozen runpy>"' in err)


def test_a_ctrl_c_that_class_creation_wrapped_is_still_one() -> None:
    """A Ctrl-C while pydantic built a model at import time surfaced as 'RuntimeError: Error
    calling __set_name__' with a traceback (Python 3.11 wraps what __set_name__ raises)."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as inner:
            raise RuntimeError("Error calling __set_name__ on 'PydanticDescriptorProxy'") from inner
    except RuntimeError as exc:
        assert interrupted(exc)
    assert not interrupted(RuntimeError("something else"))


def test_a_ctrl_c_a_c_callback_swallowed_is_one_line_when_the_imports_end(write_cluster: Any) -> None:
    """A Ctrl-C inside a C callback reaches sys.unraisablehook; sending it again from there
    printed 'Exception ignored in: <function _unraisable>' with a traceback (seen at 0.6 s of
    validate on a loaded machine). A finalizer's KeyboardInterrupt takes the same path."""
    code = ("import sys\n"
            "from provisioner import cli\n"
            "class Swallowed:\n"
            "    def __del__(self):\n"
            "        raise KeyboardInterrupt\n"
            "Swallowed()\n"
            "sys.exit(cli.main(['validate', sys.argv[1]]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(write_cluster())], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert (r.returncode, r.stderr, r.stdout) == (130, "interrupted (Ctrl-C)\n", "")


@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_at_any_moment_of_validate_is_one_line(write_cluster: Any, delay: float) -> None:
    """Ctrl-C while the command imports its modules printed a KeyboardInterrupt traceback."""
    manifest: Path = write_cluster()
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", "validate", str(manifest)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    if interpreter_start(err):
        return
    assert "Traceback" not in err
    if proc.returncode == 0:  # it finished before the signal came
        return
    # killed before Python installed its handler (-2), or caught: one line, 130
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, err)
    if proc.returncode == 130:
        assert err == "interrupted (Ctrl-C)\n"




@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("verb", [["status"], ["verify"], ["drain", "n1"], ["remove", "n9", "--yes"],
                                  ["report", "usage"]])
def test_a_signal_ends_every_ssh_of_a_remote_verb(processes_with: Callable[[str], list[int]], write_cluster: Any,
                                                  tmp_path: Path, verb: list[str], sig: signal.Signals) -> None:
    """SIGTERM to verify, status or drain (remove: its drain) exited silently and left its ssh children running;
    drain left one even on Ctrl-C, so a drain could land after 'interrupted' (issue 27 item 6). report usage
    (its sacct) takes the same path.
    The ssh here is a stand-in that waits (it contacts nothing)."""
    marker = f"{40 + int(sig)}.{len(verb[0])}{os.getpid() % 1000:03d}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec sleep {marker}\n")
    (bin_dir / "ssh").chmod(0o755)
    manifest: Path = write_cluster(slurm=True)
    if verb[0] == "remove":  # a node the manifest no longer lists, still recorded
        state = manifest.parent / ".provision"
        state.mkdir()
        (state / "state.json").write_text(json.dumps({"version": 1, "cluster": "faults", "nodes": {
            "n9": {"lifecycle": "configured"}}, "runs": []}))
    if verb[0] == "report":  # sacct on the controller: Slurm's accounting on
        data = yaml.safe_load(manifest.read_text())
        data["slurm"]["accounting"] = True
        manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    argv = [*verb, str(manifest)] if verb[0] == "report" else [*verb[:1], str(manifest), *verb[1:]]
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    r = stop_cli(argv, sig, marker, processes_with, env=env, what="an ssh", step=0.1)
    assert r.leftovers == []
    assert r.rc == 128 + sig, (r.out, r.err)
    assert r.err == ("interrupted (Ctrl-C)\n" if sig == signal.SIGINT else f"interrupted by {sig.name}\n")
    if verb[0] == "remove":  # stopped in the drain: nothing recorded
        assert json.loads((manifest.parent / ".provision" / "state.json").read_text())["nodes"]["n9"] == {
            "lifecycle": "configured"}


class LoopbackServer:
    """A TCP server on 127.0.0.1 that keeps every connection open; ``greet`` says what it
    does with one first (nothing: an sshd stalled before its banner), then ``seen`` is set."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def greet(self, conn: socket.socket) -> None:
        """Nothing: the connection is accepted (the kernel does) and never answered."""

    def serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.conns.append(conn)
                self.greet(conn)
                self.seen.set()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM])  # SIGINT and SIGHUP take the same path (tests/test_interrupts.py)
def test_a_signal_while_apply_probes_its_nodes_records_the_run_and_frees_the_lock(
        write_cluster: Any, sig: signal.Signals) -> None:
    """A signal while apply waits for a stalled node's SSH banner (bounded, 10 s): one line,
    128 + the signal, the run recorded as interrupted, the lock free; at once, not after the
    banner's bound (the probe's thread was waited for: 10 s of silence after a Ctrl-C)."""
    listener = LoopbackServer()
    manifest: Path = write_cluster(port=listener.port)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", "apply", str(manifest), "--yes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        assert listener.seen.wait(60), "apply never probed the node"
        proc.send_signal(sig)
        start = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    finally:
        listener.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("interrupted (Ctrl-C)" if sig == signal.SIGINT else f"interrupted by {sig.name}")
    assert took < 5, took  # not the banner's bound (10 s)
    state = manifest.parent / ".provision"
    last = json.loads((state / "state.json").read_text())["runs"][-1]
    assert last["result"] == "interrupted" and last["finished"]
    with (state / "lock").open("r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def test_a_signal_while_apply_waits_for_a_key_exchange_ends_the_probe_at_once(
        write_cluster: Any, processes_with: Callable[[str], list[int]]) -> None:
    """apply's probe now waits up to 30 s for a key exchange (issue 27 item 9); a SIGTERM
    meanwhile ends its ssh client at once instead of waiting that out: one line, 143, no
    ssh left, the run recorded as interrupted."""
    sshd = FakeSshServer(new_host_key()).start()
    proxy = StallingProxy(sshd.port, "kex")
    manifest: Path = write_cluster(port=proxy.port)
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", "apply", str(manifest), "--yes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while proxy.accepted < 2:  # the raw probe's connection, then the ssh client's
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # the key exchange is under way
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        out, err = proc.communicate(timeout=40)
        took = time.monotonic() - start
    finally:
        proxy.close()
        sshd.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert err.startswith("interrupted by SIGTERM") and err.count("\n") == 1, err
    assert took < 5, took  # not the probe's 30 s
    assert processes_with(f"-p {proxy.port} ") == []
    last = json.loads((manifest.parent / ".provision" / "state.json").read_text())["runs"][-1]
    assert last["result"] == "interrupted"


def ssh_stand_in(bin_dir: Path, marker: str, wait_at: str) -> None:
    """An ``ssh`` that contacts nothing: it answers the roll's scontrol and squeue as a
    controller whose node n1 is idle, and waits (``sleep MARKER``) at ``wait_at``: the first
    look at the node (drain), apply's login probe of the node (apply; the other moments' nodes
    refuse TCP before it), or the drain that leaves the batch drained after a failed apply."""
    show = f"exec sleep {marker}" if wait_at == "drain" else "echo 'NodeName=n1 State=IDLE'; exit 0"
    (bin_dir / "ssh").write_text("#!/bin/sh\n"
                                 'case "$*" in\n'
                                 f'  *"PreferredAuthentications=none"*) exec sleep {marker};;\n'
                                 f'  *"scontrol show node"*) {show};;\n'
                                 f'  *"apply failed"*) exec sleep {marker};;\n'
                                 "  *) exit 0;;\n"
                                 "esac\n")
    (bin_dir / "ssh").chmod(0o755)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("moment", ["drain", "apply", "leave drained"])
def test_a_signal_at_each_step_of_a_roll_ends_it_in_one_line(
        processes_with: Callable[[str], list[int]], write_cluster: Any, tmp_path: Path, moment: str,
        sig: signal.Signals) -> None:
    """apply --rolling on one compute node, stopped while it drains the node (its ssh to the
    controller), while the batch's apply probes the node's SSH login, or while it leaves the
    batch drained after that apply failed: 128 + the signal, one line naming the node the
    roll left drained, no ssh left (a drain must not land after 'interrupted'), the lock free,
    and a run the roll's apply started recorded as ended."""
    marker = f"{50 + int(sig)}.{len(moment)}{os.getpid() % 1000:03d}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh_stand_in(bin_dir, marker, moment)
    sshd = FakeSshServer(new_host_key()).start() if moment == "apply" else None  # banner and key exchange
    manifest: Path = write_cluster(slurm=True, **({"port": sshd.port} if sshd else {}))
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    try:
        r = stop_cli(["apply", str(manifest), "--rolling", "--yes"], sig, marker, processes_with, env=env,
                     what=f"the {moment}")
    finally:
        if sshd:
            sshd.stop()
    err = r.err
    assert r.leftovers == []
    assert r.rc == 128 + sig, (r.out, r.err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("interrupted (Ctrl-C): " if sig == signal.SIGINT else f"interrupted by {sig.name}: "), err
    assert "rolling stopped" in err and "n1" in err, err
    state = manifest.parent / ".provision"
    if (state / "lock").exists():
        with (state / "lock").open("r+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    runs = json.loads((state / "state.json").read_text())["runs"] if (state / "state.json").exists() else []
    assert [r["result"] for r in runs] == {"drain": [], "apply": ["interrupted"], "leave drained": ["failed"]}[moment]
    assert all(r["finished"] for r in runs)


class StallingImageServer(LoopbackServer):
    """An HTTP server on 127.0.0.1 that starts sending a named image and stalls half-way."""

    def greet(self, conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 4000000\r\n\r\n" + b"\0" * 200_000)


def image_stand_ins(bin_dir: Path, marker: str, moment: str) -> None:
    """``mmdebstrap`` and ``chroot`` that contact nothing. At ``build`` mmdebstrap writes part
    of its tarball, then waits in a child of its own (as its apt does); at ``proof`` it writes
    a small root file system with a kernel and the proof's chroot waits in a child."""
    wait = f"sleep {marker} &\nwait\n"
    tarball = ('out=""\nfor a in "$@"; do case "$a" in *.tar.gz|*.tar.zst) out="$a";; esac; done\n'
               'tree=$(mktemp -d)\nmkdir -p "$tree/boot" "$tree/etc" && : > "$tree/boot/vmlinuz-6.1.0-13-amd64"\n'
               'tar -caf "$out" -C "$tree" . && rm -r "$tree"\n')
    scripts = {"mmdebstrap": tarball + (wait if moment == "build" else "exit 0\n"), "chroot": wait}
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)


def builds_here() -> bool:
    """An image build runs only as root with Debian's archive keyring (the stand-ins do the rest)."""
    return os.geteuid() == 0 and Path("/usr/share/keyrings/debian-archive-keyring.gpg").is_file()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("moment", ["build", "proof", "fetch"])
def test_a_signal_during_an_image_build_keeps_no_half_written_image(
        processes_with: Callable[[str], list[int]], write_cluster: Any, tmp_path: Path, moment: str,
        sig: signal.Signals) -> None:
    """image build stopped while mmdebstrap writes the image, while the image's proof runs
    apt in a chroot, or while a named image downloads: 128 + the signal, one line, no
    process of the build left (mmdebstrap's own children included), and nothing half-written
    in the cache: no partial tarball or proof tree, no image published that was not whole,
    no proof record for a proof that did not end."""
    if moment != "fetch" and not builds_here():
        pytest.skip("an image build needs root and /usr/share/keyrings/debian-archive-keyring.gpg")
    marker = f"{60 + int(sig)}.{len(moment)}{os.getpid() % 1000:03d}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    image_stand_ins(bin_dir, marker, moment)
    manifest: Path = write_cluster()
    server = StallingImageServer() if moment == "fetch" else None
    if server:
        data = yaml.safe_load(manifest.read_text())
        data["cluster"]["images"] = {"debian-12": {"url": f"http://127.0.0.1:{server.port}/debian-12.tar.gz",
                                                   "sha256": "0" * 64}}
        manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    try:
        r = stop_cli(["image", "build", str(manifest)], sig, marker, processes_with, env=env,
                     reached=server.seen.is_set if server else None, what=f"the {moment}",
                     settle=0.2)  # the download is under way
    finally:
        if server:
            server.close()
    err = r.err
    assert r.leftovers == []
    assert r.rc == 128 + sig, (r.out, r.err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("interrupted (Ctrl-C)" if sig == signal.SIGINT else f"interrupted by {sig.name}"), err
    cache = manifest.parent / ".provision" / "images"
    names = sorted(p.name for p in cache.iterdir())
    published = [n for n in names if n.startswith("debian-12") and n.endswith((".tar.gz", ".tar.zst"))]
    assert [n for n in names if n.startswith(".")] == []  # no partial tarball, proof tree or link being made
    assert [n for n in names if n.endswith(".proof.json")] == []
    assert len(published) == (2 if moment == "proof" else 0), names  # the image and its link: whole, not proven


@pytest.mark.parametrize(("moment", "sig"), [("setup", signal.SIGINT), ("build", signal.SIGINT),
                                           ("build", signal.SIGTERM), ("build", signal.SIGHUP),
                                           ("twice", signal.SIGINT)],
                         ids=lambda v: v.name if isinstance(v, signal.Signals) else v)
def test_a_terminals_signal_during_mmdebstrap_leaves_nothing_mounted(
        processes_with: Callable[[str], list[int]], write_cluster: Any, tmp_path: Path, moment: str,
        sig: signal.Signals) -> None:
    """image build's mmdebstrap (a stand-in that mounts a tmpfs in its chroot under $TMPDIR, as
    mmdebstrap --mode=root mounts proc, sys and dev) stopped by a signal to the command's whole
    process group, as a terminal sends it: while it sets up, while its apt runs with the mount
    in place, or twice (the second during its cleanup). Its own cleanup runs to the end: 128 +
    the signal, one line, no process left, nothing mounted, nothing left in TMPDIR. Before,
    the command's stop ended mmdebstrap's cleanup too and the mount stayed."""
    if not builds_here():
        pytest.skip("an image build needs root and /usr/share/keyrings/debian-archive-keyring.gpg")
    marker = f"{70 + int(sig)}.{len(moment)}{os.getpid() % 1000:03d}"
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    mmdebstrap.write(bin_dir, f"{marker}1" if moment == "setup" else "0.01", f"{marker}2")
    manifest: Path = write_cluster()
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp))
    waits_in = f"sleep {marker}{1 if moment == 'setup' else 2}"
    try:  # the terminal's way: to every process of the foreground group; twice: the second while
        # mmdebstrap cleans up
        r = stop_cli(["image", "build", str(manifest)], sig, marker, processes_with, env=env,
                     reached=lambda: bool(processes_with(waits_in)), what=f"the {moment}", to_group=True,
                     twice=moment == "twice", timeout=90)
        mounted = mmdebstrap.mounts(tmp_path)
    finally:
        mmdebstrap.unmount_all(tmp_path)
    err = r.err
    assert r.leftovers == [] and mounted == []
    assert sorted(p.name for p in tmp.iterdir()) == []
    assert r.rc == 128 + sig, (r.out, r.err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("interrupted (Ctrl-C)" if sig == signal.SIGINT else f"interrupted by {sig.name}"), err
    cache = manifest.parent / ".provision" / "images"
    assert [p.name for p in cache.iterdir() if p.name.startswith(".") or p.name.endswith((".tar.gz", ".tar.zst"))] == []


def recorded_node(manifest: Path, name: str, lifecycle: str = "configured") -> Path:
    """The state of a cluster that still records ``name``, a node its manifest no longer lists."""
    state = manifest.parent / ".provision"
    state.mkdir()
    (state / "state.json").write_text(json.dumps({"version": 1, "cluster": "faults", "nodes": {
        name: {"lifecycle": lifecycle}}, "runs": []}))
    return state


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_remove_applies_records_the_run_and_not_the_removal(
        processes_with: Callable[[str], list[int]], write_cluster: Any, tmp_path: Path, sig: signal.Signals) -> None:
    """remove past its drain, while its apply re-renders the remaining nodes' files (here: its
    login probe of n1): 128 + the signal, one line, no ssh left, the apply's run recorded as
    interrupted, the node not recorded removed (a remove run again finishes it), the lock free."""
    marker = f"{70 + int(sig)}.7{os.getpid() % 1000:03d}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh_stand_in(bin_dir, marker, "apply")  # the drain's scontrol and squeue answer at once: no jobs
    sshd = FakeSshServer(new_host_key()).start()
    manifest: Path = write_cluster(slurm=True, port=sshd.port)
    state = recorded_node(manifest, "n9")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    try:
        r = stop_cli(["remove", str(manifest), "n9", "--yes"], sig, marker, processes_with, env=env,
                     what="the apply")
    finally:
        sshd.stop()
    err = r.err
    assert r.leftovers == []
    assert "n9: drained, no jobs" in r.out, r.out
    assert r.rc == 128 + sig, (r.out, r.err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("interrupted (Ctrl-C)" if sig == signal.SIGINT else f"interrupted by {sig.name}"), err
    recorded = json.loads((state / "state.json").read_text())
    assert (recorded["nodes"]["n9"]["lifecycle"], recorded["nodes"]["n9"]["removed_at"]) == ("configured", None)
    assert [(r["command"], r["result"], bool(r["finished"])) for r in recorded["runs"]] == [
        ("apply", "interrupted", True)]
    assert [p.name for p in state.iterdir() if p.name.startswith(".")] == []  # no temporary file
    with (state / "lock").open("r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes (to show that nothing changed)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def backup_stand_ins(bin_dir: Path, marker: str, moment: str) -> Path:
    """``systemctl`` that records its calls in the returned file, and where ``moment`` asks, waits
    (``sleep MARKER``): ``restore-decrypt``: openssl decrypting (before the restore's first
    step), ``restore-start``: systemctl starting the unit again (after every part was put back)."""
    calls = bin_dir / "systemctl.calls"
    wait = 'start) exec sleep {m};;' if moment == "restore-start" else ""
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase "$1" in {wait.format(m=marker)} esac\n')
    real = shutil.which("openssl")
    if moment == "restore-decrypt":
        (bin_dir / "openssl").write_text(f'#!/bin/sh\ncase "$*" in *" -d "*) exec sleep {marker};; esac\n'
                                         f'exec {real} "$@"\n')
    for name in ("systemctl", "openssl"):
        if (bin_dir / name).exists():
            (bin_dir / name).chmod(0o755)
    return calls


def tool_at(moment: str, marker: str, tool: Path, head: tuple[dict[str, Any], Path],
            tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """The head tool's command line that waits at ``moment`` (``sleep MARKER``), its
    environment (the stand-ins first on PATH) and the stand-in systemctl's record of calls.
    For a restore, a backup is made first and the head's munge key changed since."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    config, root = head
    calls = backup_stand_ins(bin_dir, marker, moment)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    path = tmp_path / "config.json"
    if moment == "make-ssh":  # an SSH destination (ssh and scp stand-ins acting here); scp waits half-way
        (bin_dir / "ssh").write_text('#!/bin/sh\nfor a; do last="$a"; done\nexec sh -c "$last"\n')
        (bin_dir / "scp").write_text('#!/bin/sh\nfor a; do src="$last"; last="$a"; done\n'
                                     f'cp -r "$src" "${{last#*:}}" && exec sleep {marker}\n')
        for name in ("ssh", "scp"):
            (bin_dir / name).chmod(0o755)
        config["destination"] = {"kind": "ssh", "user": "backup", "host": "127.0.0.1", "port": 22,
                                 "path": str(tmp_path / "dest")}
        path.write_text(json.dumps(config))
        return [sys.executable, str(tool), "make", str(path)], env, calls
    if moment == "make":  # the database part's dump waits
        (bin_dir / "mysqldump").write_text(f"#!/bin/sh\nexec sleep {marker}\n")
        (bin_dir / "mysqldump").chmod(0o755)
        config["parts"].append({"name": "slurmdbd", "kind": "database", "database": "slurm_acct_db",
                                "file": "slurmdbd.sql.gz", "encrypt": False})
        path.write_text(json.dumps(config))
        return [sys.executable, str(tool), "make", str(path)], env, calls
    path.write_text(json.dumps(config))
    made = subprocess.run([sys.executable, str(tool), "make", str(path)], capture_output=True, text=True, timeout=60,
                          check=True)
    (root / "munge" / "munge.key").write_bytes(b"new key")  # what a restore would overwrite
    return [sys.executable, str(tool), "restore", str(path), made.stdout.strip(), "--yes"], env, calls


TOOL_SAID = {"make": "no backup was made; its staging files were removed",
             "make-ssh": "no backup was made; its staging files were removed",
             "restore-decrypt": "nothing changed",
             "restore-start": "after stop slurmctld, munge restored, slurmctld restored of the plan; run the restore "
                              "again with --yes"}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, None],
                         ids=lambda s: s.name if s else "reader-gone")
@pytest.mark.parametrize("moment", ["make", "make-ssh", "restore-decrypt", "restore-start"])
def test_a_signal_stops_the_heads_backup_tool_in_one_line_and_leaves_nothing_half_made(
        processes_with: Callable[[str], list[int]], backup_tool: Path, backup_head: tuple[dict[str, Any], Path],
        tmp_path: Path, moment: str, sig: signal.Signals | None) -> None:
    """The head's tool (provision-backup) stopped while it dumps the database (make), while it
    copies the backup to an SSH destination (make-ssh: the partial copy there is removed), while it
    decrypts the backup's parts (restore, before its first step) or while it starts the units
    again (restore, after the parts were put back): 128 + the signal, one line that says what
    was done, no child left, no partial copy at the destination, no staging file left (the
    munge key decrypted, the backup in clear: Python died without its clean-up before), and a
    restore stopped before its first step changed nothing. ``reader-gone``: the reader of its
    output goes (ssh does not signal a remote command when `provision restore` is stopped and
    its ssh ends; the restore went on): as SIGHUP."""
    marker = f"{80 + int(sig or 0)}.{len(moment)}{os.getpid() % 1000:03d}"
    _, root = backup_head
    argv, env, calls = tool_at(moment, marker, backup_tool, backup_head, tmp_path)
    before, backups = tree(root), listing(tmp_path / "dest")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        wait_for(lambda: bool(processes_with(f"sleep {marker}")), proc, f"never reached the {moment}")
        if sig is None:
            assert proc.stdout is not None
            proc.stdout.close()
        else:
            proc.send_signal(sig)
        proc.wait(timeout=30)
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    leftovers = survivors(processes_with, marker)
    assert leftovers == []
    stopped_by = sig or signal.SIGHUP
    assert proc.returncode == 128 + stopped_by, err
    assert err == f"provision-backup: stopped by {stopped_by.name}: {TOOL_SAID[moment]}\n"
    assert listing(tmp_path / "staging") == []
    assert listing(tmp_path / "dest") == backups  # none partial, none added
    if moment == "restore-decrypt":
        assert tree(root) == before and not calls.exists()
    if moment == "restore-start":
        assert (root / "munge" / "munge.key").read_bytes() == b"k" * 128
        assert calls.read_text() == "stop slurmctld\nstart slurmctld\n"


BACKUP_KEY_ENV = "FAULTS_BACKUP_KEY"


def with_backup(manifest: Path, **key: str) -> None:
    """A backup section (a folder on the head; the passphrase from ``key``, else from
    FAULTS_BACKUP_KEY) in the cluster's manifest."""
    data = yaml.safe_load(manifest.read_text())
    data["backup"] = {"destination": {"path": "/srv/backup"}, **(key or {"key_env": BACKUP_KEY_ENV})}
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl here")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("moment", ["upload", "make", "restore"])
def test_a_signal_ends_the_ssh_of_backup_and_restore(processes_with: Callable[[str], list[int]], write_cluster: Any,
                                                     tmp_path: Path, moment: str, sig: signal.Signals) -> None:
    """provision backup stopped while it sends the admin host's encrypted part or while the
    head makes the backup, provision restore while the head restores: its ssh ends, 128 + the
    signal, one line, and nothing of it left in the temporary folder (the encrypted part, the
    shared connections' folder), and the line says what becomes of the head's work: the tool
    there stops too (its output's reader went: test_a_signal_stops_the_heads_backup_tool_...).
    The ssh is a stand-in (contacts nothing)."""
    marker = f"{90 + int(sig)}.{len(moment)}{os.getpid() % 1000:03d}"
    bin_dir, scratch = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    scratch.mkdir()
    upload = f"exec sleep {marker}" if moment == "upload" else "cat > /dev/null; exit 0"
    (bin_dir / "ssh").write_text("#!/bin/sh\n"
                                 'case "$*" in\n'
                                 f'  *"cat > "*) {upload};;\n'
                                 f'  *"provision-backup {moment}"*) exec sleep {marker};;\n'
                                 "  *) exit 0;;\n"
                                 "esac\n")
    (bin_dir / "ssh").chmod(0o755)
    manifest: Path = write_cluster(slurm=True)
    with_backup(manifest)
    verb = ["restore", str(manifest), "--from", "provision-backup-faults-20261127T023005Z", "--yes"] \
        if moment == "restore" else ["backup", str(manifest)]
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(scratch),
               **{BACKUP_KEY_ENV: "correct horse battery staple"})
    r = stop_cli(verb, sig, marker, processes_with, env=env, what=f"the {moment}", step=0.1)
    err = r.err
    assert r.leftovers == []
    assert r.rc == 128 + sig, (r.out, r.err)
    what = {"upload": "no backup was made",
            "make": "the backup tool there stops at its next step and removes its staging files",
            "restore": "the restore there stops at its next step, perhaps half done: run provision restore again "
                       "(without --yes it shows the plan)"}[moment]
    assert err == ("interrupted (Ctrl-C)" if sig == signal.SIGINT else f"interrupted by {sig.name}") + f": n1: {what}\n"
    assert listing(scratch) == []
