"""The deploy ramdisk and its agent for real, under qemu (TCG): the ramdisk boots, fetches
pxe1's deploy plan (rendered by provisioner.areas.baremetal.deploy from tests/lab/lab.yaml),
writes the debian-12 image built by `provision image build` to an empty virtio disk, reports
its SSH host keys and reboots; the disk then boots on its own (SeaBIOS -> GRUB) and answers
SSH with the key it reported, as the admin with the manifest's key. A plan with a wrong
image checksum fails at the download step, reported with the step, and leaves the disk
untouched (not one block written).

The PXE and BMC steps are test_lab.py's; here qemu's user network stands in for the lab's
management network (10.213.9.0/24, the host at .254 serving the plan, the image and the
install-state API on 127.0.0.1). Lab lane: root, ~10 min (image and ramdisk builds are
cached under LAB_CACHE).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.baremetal import deploy
from provisioner.areas.baremetal.decide import InstallServer
from provisioner.validate import load_text

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
MIRROR = "http://127.0.0.1:3142/deb.debian.org/debian"
CACHE = Path(os.environ.get("LAB_CACHE", "/var/cache/provision-lab")) / "images"
HOST = "10.213.9.254"  # the host as qemu's user network shows it to the guest
NODE_IP = "10.213.9.20"
SSH_PORT = 22720
DISK_SIZE = 4 << 30


class Head(ThreadingHTTPServer):
    """The head node's part: /nodes/pxe1/deploy.json, /images/*, /api/installed|failed/pxe1."""

    def __init__(self, files: dict[str, Path | bytes]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files = files
        self.reports: list[tuple[str, str]] = []
        self.event = threading.Event()


class Handler(BaseHTTPRequestHandler):
    server: Head

    def do_GET(self) -> None:
        item = self.server.files.get(self.path)
        if item is None:
            self.send_error(404)
            return
        data = item if isinstance(item, bytes) else None
        size = len(data) if data is not None else item.stat().st_size  # type: ignore[union-attr]
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if data is not None:
            self.wfile.write(data)
        else:
            with item.open("rb") as f:  # type: ignore[union-attr]
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
        self.server.reports.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.event.set()

    def log_message(self, *args: Any) -> None:
        pass


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "building images needs root"
    for tool in ("mmdebstrap", "qemu-system-x86_64", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (tests/testbed/setup.sh, tests/lab/build-image.sh)"
    return None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("deploy")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    data = yaml.safe_load((ROOT / "tests" / "lab" / "lab.yaml").read_text())
    data["cluster"]["mirrors"] = {"apt": MIRROR}
    data["cluster"]["ssh"]["public_key"] = (work / "id_ed25519.pub").read_text().strip()
    pxe1 = next(n for n in data["nodes"] if n["name"] == "pxe1")
    pxe1["install_method"] = "image"  # test_lab.py's pxe1 boots the installer
    manifest = work / "lab.yaml"
    manifest.write_text(yaml.safe_dump(data))
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "provisioner.cli", "image", "build", str(manifest),
                        "--cache-dir", str(CACHE)], capture_output=True, text=True, timeout=3000, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    print(f"\n[deploy] images: {time.monotonic() - start:.0f} s\n{r.stdout}", flush=True)
    yield {"work": work, "key": key, "manifest": load_text(manifest.read_text(), str(manifest)).manifest}


def serve(m: Any, sha256: str) -> Head:
    """The head's files for pxe1: its deploy plan (with the server's port in its URLs) and the image."""
    head = Head({})
    port = head.server_address[1]
    server = InstallServer(HOST, port)
    images = {"debian-12": deploy.ImageRef(f"{server.base_url}/images/debian-12.tar.gz", sha256)}
    plan = deploy.deploy_plan(m, m.node("pxe1"), images, server, erase_allowed=True).to_json()
    assert list(plan["disks"]) == ["/dev/disk/by-id/virtio-labroot"]
    head.files.update({"/nodes/pxe1/deploy.json": json.dumps(plan).encode(),
                       "/images/debian-12.tar.gz": CACHE / "debian-12.tar.gz"})
    threading.Thread(target=head.serve_forever, daemon=True).start()
    return head


def qemu(work: Path, disk: Path, port: int, *, ramdisk: bool, log: Path) -> subprocess.Popen[bytes]:
    net = (f"user,id=n0,net=10.213.9.0/24,host={HOST},dhcpstart={NODE_IP},"
           f"hostfwd=tcp:127.0.0.1:{SSH_PORT}-{NODE_IP}:22")
    cmd = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", "2048",
           "-nographic", "-no-reboot", "-serial", f"file:{log}", "-monitor", "none",
           "-drive", f"file={disk},if=none,id=d0,format=raw", "-device", "virtio-blk-pci,drive=d0,serial=labroot",
           "-netdev", net, "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:d9:00:20"]
    if ramdisk:
        rd = CACHE / "deploy-ramdisk"
        cmd += ["-kernel", str(rd / "vmlinuz"), "-initrd", str(rd / "initrd.img"), "-append",
                f"console=ttyS0 provision.plan=http://{HOST}:{port}/nodes/pxe1/deploy.json"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(vm: subprocess.Popen[bytes]) -> None:
    if vm.poll() is None:
        vm.terminate()
        try:
            vm.wait(20)
        except subprocess.TimeoutExpired:
            vm.kill()
            vm.wait(10)


def allocated(disk: Path) -> int:
    return disk.stat().st_blocks


def test_a_wrong_checksum_fails_at_download_and_leaves_the_disk_untouched(built: dict[str, Any]) -> None:
    work: Path = built["work"]
    disk = work / "bad.raw"
    with disk.open("wb") as f:
        f.truncate(DISK_SIZE)
    head = serve(built["manifest"], "0" * 64)
    log = work / "bad-console.log"
    vm = qemu(work, disk, head.server_address[1], ramdisk=True, log=log)
    try:
        assert head.event.wait(900), f"no report from the ramdisk:\n{log.read_text(errors='replace')[-3000:]}"
    finally:
        stop(vm)
        head.shutdown()
    (path, body), = head.reports
    assert path == "/api/failed/pxe1", head.reports
    assert body.startswith("download: image checksum mismatch: expected " + "0" * 64), body
    assert body.rstrip().endswith("no disk was touched")
    assert allocated(disk) == 0  # not one block written


def test_the_ramdisk_deploys_the_image_and_the_disk_boots_with_the_reported_key(built: dict[str, Any]) -> None:
    work: Path = built["work"]
    disk = work / "disk.raw"
    with disk.open("wb") as f:
        f.truncate(DISK_SIZE)
    sha = (CACHE / "debian-12.tar.gz.sha256").read_text().split()[0]
    head = serve(built["manifest"], sha)
    log = work / "deploy-console.log"
    start = time.monotonic()
    vm = qemu(work, disk, head.server_address[1], ramdisk=True, log=log)
    try:
        assert head.event.wait(1500), f"no report from the ramdisk:\n{log.read_text(errors='replace')[-3000:]}"
        (path, body), = head.reports
        assert path == "/api/installed/pxe1", f"{head.reports}\n{log.read_text(errors='replace')[-3000:]}"
        vm.wait(120)  # the agent reboots; -no-reboot makes qemu exit
    finally:
        stop(vm)
        head.shutdown()
    deployed = time.monotonic() - start
    keys = [line for line in body.splitlines() if line.strip()]
    assert keys and all(k.startswith(("ssh-ed25519 ", "ssh-rsa ", "ecdsa-sha2-")) for k in keys)
    known = work / "known_hosts"
    known.write_text("".join(f"[127.0.0.1]:{SSH_PORT} {' '.join(k.split()[:2])}\n" for k in keys))
    boot_log = work / "boot-console.log"
    vm = qemu(work, disk, 0, ramdisk=False, log=boot_log)
    try:
        deadline = time.monotonic() + 600
        out = None
        while time.monotonic() < deadline and vm.poll() is None:
            if _port_open(SSH_PORT):
                r = subprocess.run(
                    ["ssh", "-p", str(SSH_PORT), "-i", str(built["key"]), "-o", "BatchMode=yes",
                     "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10",
                     "root@127.0.0.1", "hostname; cat /etc/machine-id; findmnt -no SOURCE /; "
                     "systemctl is-active provision-firstboot ssh systemd-networkd; ip -4 -o addr show"],
                    capture_output=True, text=True, timeout=60)
                if r.returncode == 0:
                    out = r.stdout
                    break
            time.sleep(5)
        booted = time.monotonic() - start
        assert out is not None, f"no SSH with the reported host key:\n{boot_log.read_text(errors='replace')[-3000:]}"
    finally:
        stop(vm)
    lines = out.splitlines()
    assert lines[0] == "pxe1"
    assert len(lines[1]) == 32  # a machine id of its own, made at first boot
    assert lines[2] == "/dev/vda3"
    assert lines[3:6] == ["active", "active", "active"], out
    assert f"inet {NODE_IP}/24" in out  # the manifest's static address (systemd-networkd)
    print(f"\n[deploy] ramdisk power-on -> deployed and rebooted: {deployed:.0f} s; "
          f"-> SSH from its own disk: {booted:.0f} s", flush=True)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            return bool(s.recv(4).startswith(b"SSH-"))
    except OSError:
        return False
