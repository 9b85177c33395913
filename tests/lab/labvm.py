"""The VM lab's machinery: a network namespace with bridges, and Debian 12 guests under qemu.

Every guest runs under software emulation (TCG, no KVM here), with one NIC on qemu's user
network (an SSH port forward on 127.0.0.1 and the host's apt cache at 10.0.2.2) and its lab
NICs on bridges inside a network namespace this module creates. qemu itself stays in the
host's namespace: the lab opens each tap device inside the namespace (in a short-lived
thread that enters it) and hands qemu the file descriptor. The host reaches the management
bridge through one veth pair; nothing else of the lab is visible outside the namespace.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
PIDFILE_DIR = Path("/run/provision-lab")


def run(*args: str, check: bool = True, input: str | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), capture_output=True, text=True, input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} exited {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
    return r


@dataclass
class Timings:
    """Seconds per lab stage, printed at the end."""

    rows: list[tuple[str, float]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        print(f"[lab] {name} ...", flush=True)
        try:
            yield
        finally:
            took = time.monotonic() - start
            self.rows.append((name, took))
            print(f"[lab] {name}: {took:.0f} s", flush=True)

    def report(self) -> str:
        total = sum(t for _, t in self.rows)
        width = max(len(name) for name, _ in [*self.rows, ("total", 0.0)])
        lines = [f"  {name:<{width}} {took:7.0f} s" for name, took in self.rows]
        wall = time.monotonic() - self.started  # stages can overlap (the PXE apply runs beside the checks)
        return "\n".join(["[lab] timings:", *lines, f"  {'sum':<{width}} {total:7.0f} s",
                          f"  {'wall clock':<{width}} {wall:7.0f} s"])


# --------------------------------------------------------------------------- network
@dataclass
class Bridge:
    name: str
    host_address: str | None = None  # CIDR for the host's end of a veth, None: no host access


class Netns:
    """``ip netns`` with bridges; :meth:`open_tap` gives qemu a tap on one of them."""

    def __init__(self, name: str, bridges: Sequence[Bridge]) -> None:
        self.name = name
        self.bridges = list(bridges)

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run("ip", "-n", self.name, *args, check=check)

    def exists(self) -> bool:
        return self.name in run("ip", "netns", "list").stdout.split()

    def host_ends(self) -> list[str]:
        return [f"{self.name[:8]}h{i}" for i, br in enumerate(self.bridges) if br.host_address]

    def create(self) -> None:
        for dev in self.host_ends():  # left by a namespace that is still being torn down
            run("ip", "link", "delete", dev, check=False)
        run("ip", "netns", "add", self.name)
        self.ip("link", "set", "lo", "up")
        for i, br in enumerate(self.bridges):
            self.ip("link", "add", br.name, "type", "bridge", "stp_state", "0", "forward_delay", "0")
            self.ip("link", "set", br.name, "up")
            if br.host_address:
                host_end, ns_end = f"{self.name[:8]}h{i}", f"{self.name[:8]}n{i}"
                run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", self.name)
                run("ip", "addr", "add", br.host_address, "dev", host_end)
                run("ip", "link", "set", host_end, "up")
                self.ip("link", "set", ns_end, "master", br.name, "up")

    def delete(self) -> None:
        # deleting the namespace removes its bridges, taps and the veth pairs (both ends)
        run("ip", "netns", "delete", self.name, check=False)

    def open_tap(self, tap: str, bridge: str) -> int:
        """A tap device ``tap`` in the namespace, enslaved to ``bridge``; returns its fd."""
        box: dict[str, object] = {}

        def inside() -> None:  # setns changes only this thread, which then ends
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                nsfd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
                try:
                    if libc.setns(nsfd, CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns {self.name}: {os.strerror(err)}")
                finally:
                    os.close(nsfd)
                fd = os.open("/dev/net/tun", os.O_RDWR)
                fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
                box["fd"] = fd
            except Exception as exc:  # reported in the caller's thread
                box["error"] = exc

        t = threading.Thread(target=inside, name=f"tap-{tap}")
        t.start()
        t.join()
        if "error" in box:
            raise RuntimeError(f"cannot open tap {tap} in {self.name}: {box['error']}")
        self.ip("link", "set", tap, "master", bridge, "up")
        fd = box["fd"]
        assert isinstance(fd, int)
        return fd


# The lab's own network (tests/lab/lab.yaml): management (the host's end of its bridge is
# the lab's apt proxy, 10.213.9.254:3142), the "roce" fabric (soft-RoCE) and data.
LAB_NETNS = "provlab"
MGMT, FABRIC, DATA = "br-mgmt", "br-ib", "br-data"
HOST_ADDRESS = "10.213.9.254/24"
# The node images and the deploy ramdisk of tests/lab/lab.yaml (built through its apt proxy
# by the image tests or the lab, whichever runs first), kept between runs
LAB_IMAGES = Path(os.environ.get("LAB_CACHE", "/var/cache/provision-lab")) / "lab-images"


def lab_netns() -> Netns:
    return Netns(LAB_NETNS, [Bridge(MGMT, HOST_ADDRESS), Bridge(FABRIC), Bridge(DATA)])


def lab_manifest(folder: Path, public_key: str) -> Path:
    """tests/lab/lab.yaml as it stands (its apt proxy too), with ``public_key`` for root, in
    ``folder``: the image tests build the lab's own images from it (no key is in an image,
    so any key gives the images test_lab.py deploys)."""
    data = yaml.safe_load((Path(__file__).with_name("lab.yaml")).read_text())
    data["cluster"]["ssh"]["public_key"] = public_key
    manifest = folder / "lab.yaml"
    manifest.write_text(yaml.safe_dump(data))
    return manifest


# --------------------------------------------------------------------------- guests
@dataclass
class Nic:
    bridge: str
    mac: str
    address: str | None = None  # CIDR given to the guest on its kernel command line


@dataclass
class Disk:
    serial: str
    size: str = "1G"
    ext4: bool = False  # pre-formatted: a filesystem signature the zfs role must respect


@dataclass
class VmSpec:
    name: str
    memory_mb: int
    nics: list[Nic]
    ssh_port: int | None = None  # None: a machine that netboots (its disks start blank)
    disks: list[Disk] = field(default_factory=list)


class Vm:
    """One qemu process. Guests with an SSH port boot the lab image's kernel directly; the
    others boot from their first NIC's iPXE ROM (BIOS), like a new bare-metal node (with
    blank disks, when the spec has any)."""

    def __init__(self, spec: VmSpec, image: Path, workdir: Path, netns: Netns) -> None:
        self.spec = spec
        self.image = image
        self.dir = workdir / spec.name
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None
        self.console = self.dir / "console.log"
        self.qmp = self.dir / "qmp.sock"
        self.prepared = False

    @property
    def pidfile(self) -> Path:
        return PIDFILE_DIR / f"{self.netns.name}-{self.spec.name}.pid"

    def command(self, tap_fds: Sequence[int]) -> list[str]:
        s = self.spec
        cmd = ["qemu-system-x86_64", "-name", s.name, "-accel", "tcg,thread=multi", "-cpu", "max",
               "-smp", "1", "-m", str(s.memory_mb), "-display", "none", "-monitor", "none",
               "-qmp", f"unix:{self.qmp},server=on,wait=off",
               # appended: a machine's boots one after the other (pxe1: its deploy, then its disk)
               "-chardev", f"file,id=serial0,path={self.console},append=on", "-serial", "chardev:serial0",
               "-pidfile", str(self.pidfile), "-no-reboot"]
        if s.ssh_port is not None:
            addrs = [f"lab.addr=eth{i + 1}:{nic.address}" if nic.address else f"lab.up=eth{i + 1}"
                     for i, nic in enumerate(s.nics)]
            cmd += ["-kernel", str(self.image / "vmlinuz"), "-initrd", str(self.image / "initrd.img"),
                    "-append", " ".join(["root=/dev/vda", "rw", "console=ttyS0", "net.ifnames=0",
                                         "systemd.show_status=0", *addrs])]
            cmd += ["-drive", f"file={self.dir / 'root.qcow2'},if=none,id=root,format=qcow2",
                    "-device", "virtio-blk-pci,drive=root"]
        for i, d in enumerate(s.disks):
            cmd += ["-drive", f"file={self.dir / d.serial}.raw,if=none,id=d{i},format=raw",
                    "-device", f"virtio-blk-pci,drive=d{i},serial={d.serial}"]
        if s.ssh_port is not None:
            cmd += ["-netdev", f"user,id=user0,hostfwd=tcp:127.0.0.1:{s.ssh_port}-:22",
                    "-device", "virtio-net-pci,netdev=user0,romfile="]
        else:
            # network first, always (a deployed node's PXE server sends it on to its disk),
            # like a server whose boot order starts with PXE
            cmd += ["-boot", "n"]
        for i, (nic, fd) in enumerate(zip(s.nics, tap_fds, strict=True)):
            # the diskless machine keeps qemu's own iPXE ROM (found on qemu's firmware path)
            rom = "" if s.ssh_port is None and i == 0 else ",romfile="
            cmd += ["-netdev", f"tap,id=lab{i},fd={fd},vhost=off",
                    "-device", f"virtio-net-pci,netdev=lab{i},mac={nic.mac}{rom}"]
        return cmd

    def prepare(self) -> None:
        """New disks for this VM: once (a restart, e.g. after the guest rebooted, keeps them)."""
        if self.prepared:
            return
        self.prepared = True
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.spec.ssh_port is not None:
            run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image / "root.raw"), "-F", "raw",
                str(self.dir / "root.qcow2"))
        for d in self.spec.disks:
            path = self.dir / f"{d.serial}.raw"
            path.unlink(missing_ok=True)
            run("truncate", "-s", d.size, str(path))
            if d.ext4:
                run("mkfs.ext4", "-q", "-F", "-L", "keepme", str(path))

    def start(self) -> None:
        self.prepare()
        fds = [self.netns.open_tap(f"t{self.spec.name[:8]}{i}", nic.bridge) for i, nic in enumerate(self.spec.nics)]
        PIDFILE_DIR.mkdir(parents=True, exist_ok=True)
        log = (self.dir / "qemu.log").open("ab")
        try:
            self.proc = subprocess.Popen(self.command(fds), pass_fds=fds, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        finally:
            log.close()
            for fd in fds:  # qemu holds them now; the taps vanish when it exits
                os.close(fd)
        time.sleep(0.5)
        if self.proc.poll() is not None:
            raise RuntimeError(f"qemu for {self.spec.name} exited at once: {(self.dir / 'qemu.log').read_text()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _qmp(self, *commands: dict[str, Any]) -> bool:
        """Run QMP commands in order; False when the VM is not running, qemu does not answer
        or refuses one."""
        if not self.running():
            return False
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(10)
                sock.connect(str(self.qmp))
                stream = sock.makefile("rw")
                stream.readline()  # greeting
                for cmd in ({"execute": "qmp_capabilities"}, *commands):
                    stream.write(json.dumps(cmd) + "\n")
                    stream.flush()
                    reply = json.loads(stream.readline())
                    while "event" in reply:  # asynchronous events come in between
                        reply = json.loads(stream.readline())
                    if "return" not in reply:
                        return False
        except (OSError, ValueError):
            return False
        return True

    def screendump(self, path: Path) -> bool:
        """The VGA screen as a PNG (firmware and iPXE print there, not on the serial port).
        False when the VM is not running or qemu does not answer."""
        done = self._qmp({"execute": "screendump", "arguments": {"filename": str(path), "format": "png"}})
        return done and path.exists()

    def set_link(self, nic: int, up: bool) -> bool:
        """The carrier of the spec's NIC number ``nic``, as a pulled or plugged cable: the guest
        sees its link go down or up (qemu's set_link on the NIC's netdev reaches the NIC)."""
        return self._qmp({"execute": "set_link", "arguments": {"name": f"lab{nic}", "up": up}})

    def plug_disk(self, path: Path, serial: str) -> bool:
        """``path`` plugged into the running guest as a read-only virtio disk (ACPI hot-plug):
        the guest finds it at /dev/disk/by-id/virtio-SERIAL. False when qemu refuses."""
        node = f"plug-{serial}"
        return self._qmp(
            {"execute": "blockdev-add", "arguments": {
                "driver": "raw", "node-name": node, "read-only": True,
                "file": {"driver": "file", "filename": str(path), "read-only": True}}},
            {"execute": "device_add", "arguments": {
                "driver": "virtio-blk-pci", "drive": node, "id": node, "serial": serial}})

    def unplug_disk(self, serial: str) -> bool:
        """Asks the guest to give back a disk plug_disk plugged (it ejects it by itself)."""
        return self._qmp({"execute": "device_del", "arguments": {"id": f"plug-{serial}"}})

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()  # qemu quits on SIGTERM (like pulling the plug)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        self.pidfile.unlink(missing_ok=True)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""


def _pids_of(netns_name: str) -> list[int]:
    """qemu processes started for this lab (their command lines name the lab's pidfiles)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if f"{PIDFILE_DIR}/{netns_name}-" in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(proc.name))
            except OSError:
                pass
    return out


def leftovers(netns: Netns, wait: float = 20.0) -> list[str]:
    """What of the lab is still there after its teardown: qemu processes, the namespace, the
    host ends of its veth pairs. The kernel removes a deleted namespace's devices a moment
    later, so this waits up to ``wait`` seconds for them to go."""
    deadline = time.monotonic() + wait
    while True:
        links = {line.split(":")[1].strip().split("@")[0]
                 for line in run("ip", "-o", "link", "show").stdout.splitlines()}
        left = ([f"qemu process {pid}" for pid in _pids_of(netns.name)]
                + ([f"network namespace {netns.name}"] if netns.exists() else [])
                + [f"host link {dev}" for dev in netns.host_ends() if dev in links])
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def kill_stale(netns_name: str) -> list[str]:
    """Stop qemu processes and remove the namespace left by an interrupted earlier lab."""
    killed = []
    for pidfile in PIDFILE_DIR.glob(f"{netns_name}-*.pid") if PIDFILE_DIR.is_dir() else []:
        try:
            pid = int(pidfile.read_text().strip())
            if "qemu" in Path(f"/proc/{pid}/comm").read_text():
                os.kill(pid, signal.SIGKILL)
                killed.append(pidfile.stem)
        except (OSError, ValueError):
            pass
        pidfile.unlink(missing_ok=True)
    deadline = time.monotonic() + 20
    while killed and time.monotonic() < deadline and any(
            "qemu" in _comm(pid) for pid in _pids_of(netns_name)):
        time.sleep(0.2)
    run("ip", "netns", "delete", netns_name, check=False)
    return killed


# --------------------------------------------------------------------------- SSH
@dataclass
class Ssh:
    """``ssh root@127.0.0.1 -p PORT`` into a lab guest (the lab's own checks); with
    ``known_hosts``, into ``host`` accepting only the host keys recorded there; as ``user``
    (a person of the manifest) with that person's ``key``.

    One connection per guest serves all the lab's commands (ControlMaster, its socket in the
    key's folder): a new SSH connection costs a guest under emulation seconds of CPU (key
    exchange, authentication, PAM), and the lab's checks run a hundred commands."""

    key: Path
    port: int
    host: str = "127.0.0.1"
    known_hosts: Path | None = None
    user: str = "root"

    @property
    def control_path(self) -> Path:
        return self.key.parent / f"cm-{self.user}-{self.host}-{self.port}"

    def argv(self, command: str) -> list[str]:
        trust = (["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}"]
                 if self.known_hosts else ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"])
        # The shared connection outlives the lab's longest quiet phase (the first apply: 806 s
        # on a loaded machine), so no guest has to take a new one while it is busy: a new one
        # then timed out in its banner exchange (10 s) and failed pxe1's whole chain
        return ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes", *trust,
                "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=10",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}", "-o", "ControlPersist=3600",
                f"{self.user}@{self.host}", command]

    def close(self) -> None:
        """Ends the shared connection (a guest that is going away would leave it waiting)."""
        if self.control_path.exists():
            subprocess.run(["ssh", "-o", f"ControlPath={self.control_path}", "-O", "exit", f"{self.user}@{self.host}"],
                           capture_output=True, timeout=30, check=False)

    def run(self, command: str, *, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"guest {self.host}:{self.port}: {command!r} exited {r.returncode}:\n"
                                 f"{r.stdout}{r.stderr}")
        return r

    def out(self, command: str, *, timeout: float = 300) -> str:
        return self.run(command, timeout=timeout).stdout

    def wait(self, deadline: float) -> float:
        start = time.monotonic()
        while time.monotonic() < deadline:
            try:
                if self.run("true", check=False, timeout=30).returncode == 0:
                    return time.monotonic() - start
            except subprocess.TimeoutExpired:
                pass
            time.sleep(3)
        raise AssertionError(f"no SSH on 127.0.0.1:{self.port} in time")
