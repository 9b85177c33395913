#!/usr/bin/env python3
"""Reproduce apt's stuck download queue against a fake mirror on loopback.

apt 2.3.7 to 3.0.2 (Debian 12: 2.6.1, Ubuntu 22.04: 2.4.x, Ubuntu 24.04: 2.8.x) can stop
for good in `apt-get update` (and python-apt's update, which Ansible's apt module runs):
one host's queue holds an item whose retry is delayed (a transient failure, e.g. a 503
from a proxy, retried after 1, 2, 4 s: Acquire::Retries::Delay) and a new item with no
delay is put in front of it (an index of another suite on the same host). The queue only
starts items when an item ends or when its FIRST item's delay is over; the first item has
no delay and nothing is in flight, so nothing ever starts: the methods wait on stdin with
no timeout, the parent loops in select() for ever, and the proxy's idle keep-alive close
leaves the method's socket in CLOSE_WAIT. Fixed upstream by "Fix stuck acquire queues on
partial server errors" (apt 3.0.3 and 3.1.10, LP: #2003851). tests/testbed/README.md
has the whole analysis.

This script serves two suites on one fake host through a fake proxy on 127.0.0.1: the
first request for s1/InRelease (the first --fail ones) gets a 503, everything else a plain repository (no
InRelease, an unsigned Release, `[trusted=yes]`). It runs apt in a private root with the
apt.conf snippets given (--conf) and reports whether apt finished within --bound seconds;
if not, the state of apt's processes and of its socket to the proxy. stdlib only: it runs
with the host's apt or in a test bed container (tests/testbed/README.md).

    apt_stuck_queue.py [--conf FILE]... [--bound S] [--client apt-get|python-apt] [--fail N]
exit 0: apt finished, 1: apt finished with an error, 3: stuck (killed after --bound).
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import http.server
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

PACKAGES = b"""Package: stuck-queue-probe
Version: 1.0
Architecture: all
Maintainer: test bed <root@localhost>
Filename: pool/main/s/stuck-queue-probe/stuck-queue-probe_1.0_all.deb
Size: 1000
SHA256: 0000000000000000000000000000000000000000000000000000000000000000
Description: probe package of tests/testbed/apt_stuck_queue.py

"""
SUITES = ("s1", "s2")
FLAKY = "/debian/dists/s1/InRelease"  # answered 503 the first --fail times
IDLE_CLOSE = 2.0  # seconds: the fake proxy closes idle keep-alive connections (as apt-cacher-ng does)
SYSCALLS = {7: "poll", 23: "select", 270: "pselect6", 271: "ppoll"}  # x86_64
TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def release(suite: str) -> bytes:
    date = email.utils.formatdate(time.time() - 60, usegmt=True)
    digest = hashlib.sha256(PACKAGES).hexdigest()
    return (
        f"Origin: testbed\nLabel: testbed\nSuite: {suite}\nCodename: {suite}\nDate: {date}\n"
        f"Architectures: amd64\nComponents: main\nSHA256:\n"
        f" {digest} {len(PACKAGES)} main/binary-amd64/Packages\n"
    ).encode()


class Mirror(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fail: int) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.log: list[str] = []
        self.fail = fail


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: apt pipelines its requests on one connection
    timeout = IDLE_CLOSE
    server: Mirror

    def do_GET(self) -> None:
        path = urlsplit(self.path).path  # a proxy gets absolute URIs
        status, body = 404, b"not here\n"
        with self.server.lock:
            if path == FLAKY and self.server.fail > 0:
                self.server.fail -= 1
                status, body = 503, b"upstream busy\n"
        for suite in SUITES:
            if path == f"/debian/dists/{suite}/Release":
                status, body = 200, release(suite)
            elif path == f"/debian/dists/{suite}/main/binary-amd64/Packages":
                status, body = 200, PACKAGES
        with self.server.lock:
            self.server.log.append(f"{path} {status}")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def make_root(root: Path, port: int, confs: list[Path]) -> dict[str, str]:
    """A private apt root (lists, cache, config); returns apt's environment."""
    for d in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/apt/trusted.gpg.d",
              "etc/apt/sources.list.d", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial",
              "var/lib/dpkg", "var/log/apt"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/status").write_text("")
    (root / "etc/apt/sources.list").write_text(
        "".join(f"deb [trusted=yes] http://mirror.test/debian {s} main\n" for s in SUITES))
    for i, conf in enumerate(confs):
        shutil.copyfile(conf, root / f"etc/apt/apt.conf.d/{50 + i:02d}{conf.name}")
    # the fake proxy, after the snippets: it replaces a proxy (or auto-detect) they set
    (root / "etc/apt/apt.conf.d/99fake-proxy").write_text(
        f'Acquire::http::Proxy "http://127.0.0.1:{port}/";\n'
        'Acquire::http::Proxy-Auto-Detect "";\nAcquire::Languages "none";\n'
        'APT::Sandbox::User "root";\n')  # a private root under a 0700 temp dir
    main = root / "apt.conf"
    main.write_text(f'Dir "{root}/";\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("APT_")}
    return {**env, "APT_CONFIG": str(main), "LC_ALL": "C"}


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def process_state(pid: int) -> str:
    """'comm: wchan, syscall (timeout)' from /proc; the timeout argument of select-like calls."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError as exc:
        return f"{pid}: unreadable ({exc})"
    call = fields[0]
    if call.isdigit() and int(call) in SYSCALLS:
        name = SYSCALLS[int(call)]
        arg = {"poll": 3, "ppoll": 3, "select": 5, "pselect6": 5}[name]
        timeout = "no timeout" if int(fields[arg], 16) == 0 else "with a timeout"
        call = f"{name} ({timeout})"
    return f"{pid} {comm} [{cmd}]: wchan {wchan}, in {call}"


def sockets_to(port: int) -> list[str]:
    states = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, remote, state = row.split()[1:4]
            if int(remote.split(":")[1], 16) == port:  # the client side of a connection to the proxy
                states.append(f"{local} -> :{port} {TCP_STATES.get(state, state)}")
    return states


def run(confs: list[Path], bound: float, client: str, fail: int) -> int:
    mirror = Mirror(fail)
    port = mirror.server_address[1]
    threading.Thread(target=mirror.serve_forever, daemon=True).start()
    root = Path(tempfile.mkdtemp(prefix="apt-stuck-queue."))
    try:
        env = make_root(root, port, confs)
        if client == "apt-get":
            cmd = ["apt-get", "-q", "update"]
        else:  # what Ansible's apt module does: python-apt's acquire loop in the calling process
            cmd = ["/usr/bin/python3", "-c", "import apt; apt.Cache().update(raise_on_error=True)"]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=bound)
            print(f"{client} finished in {time.monotonic() - start:.1f} s, rc {proc.returncode}")
            rc = 0 if proc.returncode == 0 else 1
        except subprocess.TimeoutExpired:
            print(f"{client} STUCK: not finished after {bound:g} s; its processes:")
            for pid in [proc.pid, *children(proc.pid)]:
                print("  " + process_state(pid))
            print("  sockets to the proxy: " + ("; ".join(sockets_to(port)) or "none"))
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            rc = 3
        print("requests: " + ", ".join(mirror.log))
        print("output:\n  " + "\n  ".join(out.decode(errors="replace").splitlines()))
        return rc
    finally:
        mirror.shutdown()
        mirror.server_close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conf", type=Path, action="append", default=[], help="apt.conf snippet to use")
    ap.add_argument("--bound", type=float, default=10.0, help="seconds apt may take (default 10)")
    ap.add_argument("--client", choices=("apt-get", "python-apt"), default="apt-get")
    ap.add_argument("--fail", type=int, default=1, help="503s for s1/InRelease before it is served (default 1)")
    args = ap.parse_args()
    return run(args.conf, args.bound, args.client, args.fail)


if __name__ == "__main__":
    sys.exit(main())
