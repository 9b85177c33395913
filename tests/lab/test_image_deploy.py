"""The deploy ramdisk and its agent for real, under qemu (TCG), refusing a bad image: the
ramdisk boots, fetches pxe1's deploy plan (rendered by provisioner.areas.baremetal.deploy
from tests/lab/lab.yaml) with a wrong image checksum, fails at the download step, reports
the step, and leaves the disk untouched (not one block written).

The good path (power-on through the BMC by `provision apply`, the ramdisk and the image
from the head VM's PXE server, the reboot into the deployed disk, SSH with the reported key,
configuration, a Slurm job) is test_lab.py's. Here qemu's user network stands in for the
lab's management network (10.213.9.0/24, the host at .254 serving the plan and the image
on 127.0.0.1). Lab lane: root, a few minutes (image and ramdisk builds are cached under
LAB_CACHE).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from lab.labvm import LAB_IMAGES, Netns, lab_manifest
from provisioner.areas.baremetal import deploy
from provisioner.areas.baremetal.decide import InstallServer
from provisioner.validate import load_text

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
CACHE = LAB_IMAGES  # the lab manifest's images: test_image_build.py's, found in the cache
HOST = "10.213.9.254"  # the host as qemu's user network shows it to the guest
NODE_IP = "10.213.9.20"
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
def built(tmp_path_factory: pytest.TempPathFactory, lab_network: Netns) -> Iterator[dict[str, Any]]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("deploy")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    # the lab's manifest as it stands (its apt proxy on the lab's bridge): the same image
    # and ramdisk as test_image_build.py's and test_lab.py's, built once
    manifest = lab_manifest(work, (work / "id_ed25519.pub").read_text().strip())
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


def qemu(disk: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """The deploy ramdisk (booted directly, as iPXE would) on a blank virtio disk."""
    rd = CACHE / "deploy-ramdisk"
    return subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "1", "-m", "2048",
         "-nographic", "-no-reboot", "-serial", f"file:{log}", "-monitor", "none",
         "-drive", f"file={disk},if=none,id=d0,format=raw", "-device", "virtio-blk-pci,drive=d0,serial=labroot",
         "-netdev", f"user,id=n0,net=10.213.9.0/24,host={HOST},dhcpstart={NODE_IP}",
         "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:d9:00:20",
         "-kernel", str(rd / "vmlinuz"), "-initrd", str(rd / "initrd.img"),
         "-append", f"console=ttyS0 provision.plan=http://{HOST}:{port}/nodes/pxe1/deploy.json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
    vm = qemu(disk, head.server_address[1], log)
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
