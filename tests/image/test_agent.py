"""provisioner.image.agent: the deploy agent's refusals and its steps, in order, with the
commands faked (the real run is the VM lab's)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from provisioner.image import agent

SHA = hashlib.sha256(b"image").hexdigest()
D1, D2 = "/dev/disk/by-id/virtio-os1", "/dev/disk/by-id/virtio-os2"


def plan(**update: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "node": "pxe1", "mac": "52:54:00:d9:00:20", "disks": [D1], "raid1": False, "boot_mode": "uefi",
        "image": {"url": "http://10.0.0.10/images/debian-12.tar.gz", "sha256": SHA},
        "hostname": "pxe1", "fqdn": "pxe1.lab.test",
        "files": [{"path": "/etc/hostname", "mode": "0644", "content": "pxe1\n"}],
        "users": [{"name": "root", "keys": ["ssh-ed25519 AAAA root"], "sudo": True, "shell": "/bin/bash", "uid": None},
                  {"name": "ops", "keys": ["ssh-ed25519 AAAA ops"], "sudo": True, "shell": "/bin/bash", "uid": 1500}],
        "report_url": "http://10.0.0.10/api/installed/pxe1", "erase_allowed": True,
    }
    return base | update


class Machine:
    """Fake commands: records them, answers wipefs/lsblk/blkid/mdadm, makes host keys."""

    def __init__(self, target: Path, data_on: Sequence[str] = ()) -> None:
        self.target = target
        self.cmds: list[list[str]] = []
        self.data_on = set(data_on)

    def __call__(self, cmd: Sequence[str]) -> str:
        cmd = list(cmd)
        self.cmds.append(cmd)
        if cmd[:2] == ["wipefs", "--no-act"]:
            return "# offset,uuid,label,type\n0x438,abc,,ext4\n" if cmd[-1] in self.data_on else ""
        if cmd[0] == "lsblk":
            return cmd[-1] + "\n"
        if cmd[0] == "blkid":
            return "UUID-" + cmd[-1].rsplit("/", 1)[-1] + "\n"
        if cmd[:2] == ["mdadm", "--detail"]:
            return "ARRAY /dev/md0 metadata=1.2 UUID=x\n"
        if cmd[0] == "tar":
            for d in ("etc/ssh", "etc/mdadm"):
                (self.target / d).mkdir(parents=True, exist_ok=True)
        if cmd[-2:] == ["ssh-keygen", "-A"]:
            (self.target / "etc/ssh/ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAHOST root@pxe1\n")
        return ""

    def names(self) -> list[str]:
        return [" ".join(c) for c in self.cmds]


def run_deploy(tmp_path: Path, p: dict[str, Any], machine: Machine | None = None,
               devices: dict[str, str | None] | None = None, fetch_ok: bool = True,
               body: bytes = b"\x1f\x8b\x08\x00gzip'd tarball") -> tuple[Machine, list[str]]:
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    m = machine or Machine(target)
    devs = devices if devices is not None else {D1: "/dev/vda", D2: "/dev/vdb"}

    def fetch(url: str, sha: str, dest: Path) -> None:
        m.cmds.append(["FETCH", url])
        if not fetch_ok:
            raise agent.StepFailed("download", "image checksum mismatch: expected x, got y; no disk was touched")
        dest.write_bytes(body)

    keys = agent.deploy(p, run=m, target=target, image=tmp_path / "img", nics=lambda: ["52:54:00:D9:00:20"],
                        fetch=fetch, resolve=devs.get)
    return m, keys


def test_a_single_disk_deploy_runs_every_step_in_order(tmp_path: Path) -> None:
    m, keys = run_deploy(tmp_path, plan())
    assert keys == ["ssh-ed25519 AAAAHOST root@pxe1"]
    names = m.names()
    order = ["wipefs --no-act --parsable /dev/vda", "FETCH http://10.0.0.10/images/debian-12.tar.gz",
             "sgdisk --zap-all /dev/vda", "mkfs.vfat -F 32 -n ESP /dev/vda2", "mkfs.ext4 -q -F -L root /dev/vda3",
             "mount /dev/vda3 " + str(tmp_path / "target"), "tar -x -z -p", "grub-install --target=i386-pc /dev/vda",
             "grub-install --target=x86_64-efi", "update-grub", "ssh-keygen -A"]
    at = [next(i for i, n in enumerate(names) if o in n) for o in order]
    assert at == sorted(at), names
    assert not any("mdadm --create" in n or "update-initramfs" in n for n in names)  # no array to assemble
    target = tmp_path / "target"
    assert (target / "etc/hostname").read_text() == "pxe1\n"
    assert (target / "etc/fstab").read_text().startswith("UUID=UUID-vda3\t/\text4")
    assert "UUID=UUID-vda2\t/boot/efi\tvfat" in (target / "etc/fstab").read_text()
    users = next(c for c in m.cmds if c[:2] == ["chroot", str(target)] and c[2:4] == ["sh", "-c"])[-1]
    assert "useradd --create-home --shell /bin/bash --uid 1500 ops" in users
    assert "/etc/sudoers.d/90-provision-ops" in users
    subprocess.run(["sh", "-n", "-c", users], check=True)


def test_an_image_with_the_signed_boot_chain_gets_shim_on_the_esp(tmp_path: Path) -> None:
    """Unsigned GRUB on the ESP: Secure Boot could never be turned on (issue 26 item 9). An image
    carrying shim-signed and grub-efi-amd64-signed gets grub-install --uefi-secure-boot (shim as
    EFI/BOOT/BOOTX64.EFI, the signed GRUB beside it); one without them, GRUB as before."""
    target = tmp_path / "target"
    (target / agent.SIGNED_GRUB_DIR).mkdir(parents=True)
    (target / agent.SHIM_DIR).mkdir(parents=True)
    (target / agent.SHIM_DIR / "shimx64.efi.signed").write_bytes(b"MZ")
    m, _ = run_deploy(tmp_path, plan())
    efi = [n for n in m.names() if "--target=x86_64-efi" in n]
    assert efi == [f"chroot {target} grub-install --target=x86_64-efi --efi-directory=/boot/efi --removable "
                   "--no-nvram --uefi-secure-boot"]
    assert not agent.signed_boot_chain(tmp_path / "bare")
    assert "--uefi-secure-boot" not in agent.efi_grub_install(False)


def test_two_disks_make_a_raid1_root_and_both_boot(tmp_path: Path) -> None:
    m, _ = run_deploy(tmp_path, plan(disks=[D1, D2], raid1=True))
    names = m.names()
    assert "mdadm --create /dev/md0 --run --level=1 --raid-devices=2 --metadata=1.2 --homehost=any /dev/vda3 " \
           "/dev/vdb3" in names
    assert "mkfs.ext4 -q -F -L root /dev/md0" in names
    assert "chroot {} grub-install --target=i386-pc /dev/vdb".format(tmp_path / "target") in names
    assert "mount /dev/vdb2 /run/esp2" in names  # the second ESP gets the UEFI loader too
    assert (tmp_path / "target/etc/mdadm/mdadm.conf").read_text().startswith("ARRAY /dev/md0")
    assert any(n.endswith("update-initramfs -u -k all") for n in names)  # the initramfs assembles md0
    assert any("sgdisk -n1:0:+1M" in n and "-t3:fd00" in n for n in names)


def test_a_wrong_checksum_fails_before_any_disk_is_touched(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    m = Machine(target)
    with pytest.raises(agent.StepFailed) as info:
        run_deploy(tmp_path, plan(), machine=m, fetch_ok=False)
    assert info.value.step == "download"
    assert all(c[0] in ("wipefs", "lsblk", "FETCH") and (c[0] != "wipefs" or "--no-act" in c) for c in m.cmds)


@pytest.mark.parametrize(("url", "body", "flag"), [
    ("http://h/images/ubuntu-24.04.tar.xz", b"\xfd7zXZ\x00\x00\x04", "-J"),
    ("http://h/images/ubuntu-24.04.tar.zst", b"\x28\xb5\x2f\xfd\x00", "--zstd"),
    ("http://h/images/debian-12.tar.gz", b"\x1f\x8b\x08\x00", "-z"),
])
def test_the_image_is_unpacked_with_the_flag_of_its_compression(tmp_path: Path, url: str, body: bytes,
                                                                  flag: str) -> None:
    m, _ = run_deploy(tmp_path, plan(image={"url": url, "sha256": SHA}), body=body)
    tar = next(c for c in m.cmds if c[0] == "tar")
    assert tar[:3] == ["tar", "-x", flag]


def test_an_image_compressed_otherwise_than_its_name_says_fails_before_any_disk_is_touched(tmp_path: Path) -> None:
    # an xz root tarball published as .tar.gz used to fail in tar -z, after partitioning
    target = tmp_path / "target"
    target.mkdir()
    m = Machine(target)
    with pytest.raises(agent.StepFailed, match=r"holds \.tar\.xz data, not what its name \(\.tar\.gz\) says; "
                                               "no disk was touched") as info:
        run_deploy(tmp_path, plan(), machine=m, body=b"\xfd7zXZ\x00\x00\x04")
    assert info.value.step == "download"
    assert all(c[0] in ("wipefs", "lsblk", "FETCH") and (c[0] != "wipefs" or "--no-act" in c) for c in m.cmds)
    with pytest.raises(agent.StepFailed, match="holds no gzip, xz or zstd data"):
        run_deploy(tmp_path, plan(), body=b"<html>404</html>")


def test_a_plan_without_a_checksum_is_refused_before_any_disk_is_touched(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    m = Machine(target)
    with pytest.raises(agent.StepFailed, match=r"names no checksum .*run `provision image build`") as info:
        run_deploy(tmp_path, plan(image={"url": "http://h/images/debian-12.tar.gz", "sha256": ""}), machine=m)
    assert info.value.step == "download"
    assert not any(c[0] == "FETCH" or (c[0] == "wipefs" and "--all" in c) for c in m.cmds)


def test_the_real_download_checks_the_sum_and_deletes_a_wrong_image(tmp_path: Path) -> None:
    src = tmp_path / "image.tar.gz"
    src.write_bytes(b"image")
    agent.download(src.as_uri(), SHA, tmp_path / "ok")
    assert (tmp_path / "ok").read_bytes() == b"image"
    with pytest.raises(agent.StepFailed, match=f"image checksum mismatch: expected {'0' * 64}, got {SHA}"):
        agent.download(src.as_uri(), "0" * 64, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_a_missing_disk_is_refused_and_no_other_disk_is_taken(tmp_path: Path) -> None:
    with pytest.raises(agent.StepFailed, match=r"virtio-os2 is not present .*not touching any other disk") as info:
        run_deploy(tmp_path, plan(disks=[D1, D2], raid1=True), devices={D1: "/dev/vda", D2: None})
    assert info.value.step == "disks"


def test_a_disk_with_data_is_refused_unless_erasing_is_allowed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(agent.StepFailed, match=r"carries data \(/dev/disk/by-id/virtio-os1: ext4\) and the node is "
                                                r"neither new nor named with --reinstall"):
        run_deploy(tmp_path, plan(erase_allowed=False), machine=Machine(target, data_on=["/dev/vda"]))
    m, _ = run_deploy(tmp_path, plan(erase_allowed=True), machine=Machine(target, data_on=["/dev/vda"]))
    assert "wipefs --all --force /dev/vda" in m.names()
    _, keys = run_deploy(tmp_path, plan(erase_allowed=False))  # an empty disk needs no permission
    assert keys


def test_the_same_device_twice_is_refused() -> None:
    why = agent.disk_refusal(plan(disks=[D1, D2]), {D1: "/dev/vda", D2: "/dev/vda"}, {})
    assert why == f"install disks {D1}, {D2} are the same device /dev/vda"


def test_the_plan_must_be_this_machines() -> None:
    agent.check_identity(plan(), ["52:54:00:D9:00:20", "aa:bb:cc:dd:ee:ff"])
    with pytest.raises(agent.StepFailed, match=r"the plan is for pxe1 .*this machine has aa:bb"):
        agent.check_identity(plan(), ["aa:bb:cc:dd:ee:ff"])


def test_a_failing_command_is_reported_with_its_step(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()

    class Broken(Machine):
        def __call__(self, cmd: Sequence[str]) -> str:
            if cmd[:2] == ["chroot", str(target)] and "grub-install" in cmd:
                raise RuntimeError("grub-install failed (exit 1): no such device")
            return super().__call__(cmd)

    with pytest.raises(agent.StepFailed) as info:
        run_deploy(tmp_path, plan(), machine=Broken(target))
    assert (info.value.step, info.value.message) == ("bootloader", "grub-install failed (exit 1): no such device")


def test_each_finished_step_is_said_with_its_seconds(tmp_path: Path) -> None:
    """The console shows every step as it ends, with its time on the agent's clock; a failed
    step is not said done (its failure is reported instead)."""
    lines: list[str] = []
    ticks = iter(range(0, 1000, 5))
    target = tmp_path / "target"
    target.mkdir()
    m = Machine(target)

    def fetch(url: str, sha: str, dest: Path) -> None:
        dest.write_bytes(b"\x1f\x8b\x08\x00gzip'd tarball")

    agent.deploy(plan(), run=m, target=target, image=tmp_path / "img", nics=lambda: ["52:54:00:D9:00:20"],
                 fetch=fetch, resolve={D1: "/dev/vda", D2: "/dev/vdb"}.get,
                 steps=agent.Steps(lines.append, clock=lambda: float(next(ticks))))
    assert lines == [f"provision-deploy: {name} done in 5 s" for name in agent.STEPS]  # STEPS is deploy's order
    assert agent.STEPS[:3] == ("identify", "disks", "download") and agent.STEPS[-1] == "hostkeys"

    class Broken(Machine):
        def __call__(self, cmd: Sequence[str]) -> str:
            if "grub-install" in cmd:
                raise RuntimeError("grub-install failed (exit 1)")
            return super().__call__(cmd)

    lines.clear()
    with pytest.raises(agent.StepFailed):
        agent.deploy(plan(), run=Broken(target), target=target, image=tmp_path / "img",
                     nics=lambda: ["52:54:00:D9:00:20"], fetch=fetch, resolve={D1: "/dev/vda", D2: "/dev/vdb"}.get,
                     steps=agent.Steps(lines.append, clock=lambda: float(next(ticks))))
    assert lines[-1] == "provision-deploy: identity done in 5 s"


def test_small_pure_pieces() -> None:
    assert agent.plan_url("BOOT_IMAGE=x quiet provision.plan=http://h/nodes/a/deploy.json") == \
        "http://h/nodes/a/deploy.json"
    with pytest.raises(agent.StepFailed, match=r"no provision\.plan"):
        agent.plan_url("quiet")
    assert agent.partition_name("/dev/nvme0n1", 2) == "/dev/nvme0n1p2"
    assert agent.partition_name("/dev/sda", 3) == "/dev/sda3"
    assert agent.failed_url("http://h:8080/api/installed/pxe1", "pxe1") == "http://h:8080/api/failed/pxe1"
    assert agent.wipefs_types("# offset,uuid,label,type\n0x200,,,gpt\n0x1fe,,,PMBR\n") == ["gpt", "PMBR"]
    assert agent.tar_flag("x.tar.xz") == "-J"
    with pytest.raises(agent.StepFailed, match=r"not a \.tar\.gz"):
        agent.tar_flag("x.qcow2")


# --------------------------------------------------------------------------- the agent's run, over HTTP
class Head(ThreadingHTTPServer):
    """The head node's part on loopback: the plan, the image, and what the agent reports."""

    def __init__(self, image: bytes) -> None:
        super().__init__(("127.0.0.1", 0), HeadHandler)
        self.image = image
        self.plan: dict[str, Any] = {}
        self.reports: list[tuple[str, str]] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class HeadHandler(BaseHTTPRequestHandler):
    server: Head

    def do_GET(self) -> None:
        body = {"/nodes/pxe1/deploy.json": json.dumps(self.server.plan).encode(),
                "/images/debian-12.tar.gz": self.server.image}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.server.reports.append((self.path, self.rfile.read(int(self.headers["Content-Length"])).decode()))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def head() -> Iterator[Head]:
    server = Head(b"\x1f\x8b\x08\x00gzip'd tarball")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def agent_run(tmp_path: Path, head: Head, sha256: str) -> tuple[int, Machine]:
    """agent.main as the ramdisk runs it: the plan's URL from the command line, the real
    download over HTTP, the disk commands faked."""
    head.plan = plan(image={"url": f"{head.base}/images/debian-12.tar.gz", "sha256": sha256},
                     report_url=f"{head.base}/api/installed/pxe1")
    target = tmp_path / "target"
    target.mkdir()
    machine = Machine(target)

    def deploy_with(p: dict[str, Any]) -> list[str]:
        return agent.deploy(p, run=machine, target=target, image=tmp_path / "img",
                            nics=lambda: ["52:54:00:d9:00:20"], resolve={D1: "/dev/vda"}.get)

    rc = agent.main(f"console=ttyS0 provision.plan={head.base}/nodes/pxe1/deploy.json", deploy_with)
    return rc, machine


WRITES = ("sgdisk", "parted", "mkfs", "mdadm --create", "tar", "dd", "wipefs --all", "grub")


def test_a_wrong_checksum_is_reported_to_the_head_and_no_disk_is_written(tmp_path: Path, head: Head) -> None:
    rc, machine = agent_run(tmp_path, head, "0" * 64)
    assert rc == 1
    (path, body), = head.reports
    assert path == "/api/failed/pxe1"
    assert body.startswith(f"download: image checksum mismatch: expected {'0' * 64}, got "
                           f"{hashlib.sha256(head.image).hexdigest()}")
    assert body.rstrip().endswith("no disk was touched")
    assert not [c for c in machine.names() if c.startswith(WRITES)], machine.names()
    assert not (tmp_path / "img").exists()  # the wrong image is not kept


def test_a_deploy_reports_the_new_host_keys_to_the_head(tmp_path: Path, head: Head) -> None:
    rc, machine = agent_run(tmp_path, head, hashlib.sha256(head.image).hexdigest())
    assert rc == 0
    assert head.reports == [("/api/installed/pxe1", "ssh-ed25519 AAAAHOST root@pxe1\n")]
    assert any(c.startswith("tar") for c in machine.names())
