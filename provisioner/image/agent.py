#!/usr/bin/env python3
"""provision deploy agent: runs in the deploy ramdisk and writes a node OS image to disk.

Standard library only (it is copied into the ramdisk as /usr/local/sbin/provision-deploy
and imported by the unit tests). The kernel command line gives it ``provision.plan=<URL>``
(the node's deploy plan, rendered by provisioner.areas.baremetal.deploy). Steps, each
reported by name when it fails (``POST <report>/../failed/<node>``, body ``step: message``):

  identify   the plan's MAC must be one of this machine's NICs
  disks      every plan disk present under its by-id name, no disk twice, none carrying
             data unless the plan allows erasing it (a new node or --reinstall)
  download   the image into RAM, SHA-256 checked, its compression what its name says; a
             mismatch fails here: no disk touched
  partition  GPT on each disk: BIOS boot, ESP, root (a RAID1 member on two disks)
  filesystem ext4 root (on /dev/md0 for two disks), FAT ESP
  extract    the image onto the root
  identity   hostname, network configuration, fstab, users and their SSH keys
  bootloader GRUB for BIOS (every disk) and UEFI (removable path, every ESP)
  hostkeys   new SSH host keys
  report     the public host keys to the install-state service; then reboot
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

TARGET = Path("/target")
# on the ramdisk's root (RAM, half of it at most), not /run (a fifth of it)
IMAGE = Path("/var/tmp/provision-image")
CHUNK = 1 << 20
HTTP_TIMEOUT = 60.0
DOWNLOAD_TIMEOUT = 1800.0
COMMAND_TIMEOUT = 900.0
TAR_FLAGS = {".tar.gz": "-z", ".tar.xz": "-J", ".tar.zst": "--zstd"}
# what each compression's data starts with (gzip, xz, zstd frame)
MAGIC = {".tar.gz": b"\x1f\x8b", ".tar.xz": b"\xfd7zXZ\x00", ".tar.zst": b"\x28\xb5\x2f\xfd"}

Run = Callable[[Sequence[str]], str]


class StepFailed(RuntimeError):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


# --------------------------------------------------------------------------- pure decisions
def plan_url(cmdline: str) -> str:
    for word in shlex.split(cmdline):
        if word.startswith("provision.plan="):
            return word.split("=", 1)[1]
    raise StepFailed("identify", "no provision.plan=<URL> on the kernel command line")


def check_identity(plan: dict[str, Any], macs: Sequence[str]) -> None:
    """The plan is this machine's: its MAC is one of our NICs'."""
    want = str(plan.get("mac", "")).lower()
    if want not in {m.lower() for m in macs}:
        raise StepFailed("identify", f"the plan is for {plan.get('node')} (MAC {want}); this machine has "
                                     f"{', '.join(sorted(macs)) or 'no NIC'}")


def disk_refusal(plan: dict[str, Any], found: dict[str, str | None], signatures: dict[str, list[str]]) -> str | None:
    """Why the agent must not touch the plan's disks, or None.

    ``found``: plan disk (by-id path) -> the kernel device it resolves to (None: absent);
    ``signatures``: kernel device -> what ``wipefs`` finds on it (partition tables, file
    systems, RAID members)."""
    disks = list(plan["disks"])
    if not disks:
        return "the plan names no install disk"
    missing = [d for d in disks if not found.get(d)]
    if missing:
        return (f"install disk {', '.join(missing)} is not present (no such /dev/disk/by-id name): "
                "not touching any other disk")
    devices = [found[d] for d in disks]
    if len(set(devices)) != len(devices):
        return f"install disks {', '.join(disks)} are the same device {devices[0]}"
    carrying = {d: signatures.get(str(found[d]), []) for d in disks}
    carrying = {d: s for d, s in carrying.items() if s}
    if carrying and not plan.get("erase_allowed"):
        what = "; ".join(f"{d}: {', '.join(s)}" for d, s in carrying.items())
        return f"install disk carries data ({what}) and the node is neither new nor named with --reinstall"
    return None


# Where Debian's and Ubuntu's shim-signed and grub-efi-amd64-signed put the signed loaders
SIGNED_GRUB_DIR = "usr/lib/grub/x86_64-efi-signed"
SHIM_DIR = "usr/lib/shim"


def signed_boot_chain(target: Path) -> bool:
    """Whether the image carries the signed boot chain (Microsoft-signed shim, the
    distribution-signed GRUB): then the ESP gets shim, and Secure Boot can be turned on."""
    return (target / SIGNED_GRUB_DIR).is_dir() and any((target / SHIM_DIR).glob("shimx64.efi.signed*"))


def efi_grub_install(signed: bool) -> list[str]:
    """The UEFI loader on the ESP's removable path (EFI/BOOT/BOOTX64.EFI: no NVRAM entry, which
    the ramdisk cannot write for the firmware). Signed: Debian's and Ubuntu's grub-install put
    shim there and the signed GRUB beside it (``--uefi-secure-boot``); without the signed
    packages GRUB itself, which a Secure Boot firmware refuses."""
    argv = ["grub-install", "--target=x86_64-efi", "--efi-directory=/boot/efi", "--removable", "--no-nvram"]
    return [*argv, "--uefi-secure-boot"] if signed else argv


def partition_name(device: str, number: int) -> str:
    return f"{device}p{number}" if device[-1].isdigit() else f"{device}{number}"


def tar_flag(url: str) -> str:
    for ext, flag in TAR_FLAGS.items():
        if url.endswith(ext):
            return flag
    raise StepFailed("download", f"{url} is not a .tar.gz, .tar.xz or .tar.zst")


def check_compression(url: str, head: bytes) -> None:
    """The downloaded image is compressed as its name says (so tar unpacks it after the disks
    were partitioned); checked before any disk is touched."""
    want = next(ext for ext in TAR_FLAGS if url.endswith(ext))
    got = next((ext for ext, magic in MAGIC.items() if head.startswith(magic)), None)
    if got != want:
        what = f"{got} data" if got else "no gzip, xz or zstd data"
        raise StepFailed("download", f"{url} holds {what}, not what its name ({want}) says; no disk was touched")


def partition_commands(devices: Sequence[str], raid1: bool) -> list[list[str]]:
    cmds: list[list[str]] = []
    root_type = "fd00" if raid1 else "8300"
    for dev in devices:
        cmds += [
            ["wipefs", "--all", "--force", dev],
            ["sgdisk", "--zap-all", dev],
            ["sgdisk", "-n1:0:+1M", "-t1:ef02", "-c1:bios", "-n2:0:+512M", "-t2:ef00", "-c2:esp",
             "-n3:0:0", f"-t3:{root_type}", "-c3:root", dev],
            ["partprobe", dev],
            ["udevadm", "settle", "--timeout=30"],
        ]
    return cmds


def filesystem_commands(devices: Sequence[str], raid1: bool) -> tuple[list[list[str]], str]:
    """(commands, root device)."""
    cmds: list[list[str]] = []
    root = partition_name(devices[0], 3)
    if raid1:
        members = [partition_name(d, 3) for d in devices]
        cmds.append(["mdadm", "--create", "/dev/md0", "--run", "--level=1", "--raid-devices=2",
                     "--metadata=1.2", "--homehost=any", *members])
        root = "/dev/md0"
    for dev in devices:
        cmds.append(["mkfs.vfat", "-F", "32", "-n", "ESP", partition_name(dev, 2)])
    cmds.append(["mkfs.ext4", "-q", "-F", "-L", "root", root])
    return cmds, root


def fstab(root_uuid: str, esp_uuid: str) -> str:
    return (f"UUID={root_uuid}\t/\text4\terrors=remount-ro\t0\t1\n"
            f"UUID={esp_uuid}\t/boot/efi\tvfat\tumask=0077,nofail\t0\t2\n")


def user_script(users: Sequence[dict[str, Any]]) -> str:
    """Shell run in the new root: the plan's accounts with their SSH keys, passwords locked."""
    out = ["set -eu", "passwd -l root >/dev/null"]
    for u in users:
        name = shlex.quote(u["name"])
        keys = shlex.quote("\n".join(u["keys"]) + "\n")
        if u["name"] == "root":
            out += ["install -d -m 0700 /root/.ssh", f"printf %s {keys} > /root/.ssh/authorized_keys",
                    "chmod 0600 /root/.ssh/authorized_keys"]
            continue
        uid = f" --uid {int(u['uid'])}" if u.get("uid") is not None else ""
        out += [f"id -u {name} >/dev/null 2>&1 || useradd --create-home --shell {shlex.quote(u['shell'])}{uid} {name}",
                f"passwd -l {name} >/dev/null",
                f'home=$(getent passwd {name} | cut -d: -f6)',
                f'install -d -m 0700 -o {name} -g "$(id -gn {name})" "$home/.ssh"',
                f'printf %s {keys} > "$home/.ssh/authorized_keys"',
                'chmod 0600 "$home/.ssh/authorized_keys"',
                f'chown {name}:"$(id -gn {name})" "$home/.ssh/authorized_keys"']
        if u.get("sudo"):
            rule = shlex.quote(f"{u['name']} ALL=(ALL) NOPASSWD:ALL\n")
            out += [f"printf %s {rule} > /etc/sudoers.d/90-provision-{u['name']}",
                    f"chmod 0440 /etc/sudoers.d/90-provision-{u['name']}"]
    return "\n".join(out) + "\n"


def failed_url(report_url: str, node: str) -> str:
    return re.sub(r"/api/installed/[^/]+$", f"/api/failed/{node}", report_url)


# --------------------------------------------------------------------------- side effects
def run_command(cmd: Sequence[str]) -> str:
    try:
        r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{cmd[0]} did not finish in {COMMAND_TIMEOUT:.0f} s") from None
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}")
    return r.stdout


def macs(sys_net: Path = Path("/sys/class/net")) -> list[str]:
    out = []
    for nic in sorted(sys_net.iterdir()):
        with_addr = nic / "address"
        if nic.name != "lo" and with_addr.exists():
            out.append(with_addr.read_text().strip())
    return out


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as r:
        data: bytes = r.read()
    return data


def http_post(url: str, body: str) -> None:
    request = urllib.request.Request(url, data=body.encode(), method="POST")
    for attempt in range(10):
        try:
            urllib.request.urlopen(request, timeout=HTTP_TIMEOUT).close()
            return
        except OSError:
            if attempt == 9:
                raise
            time.sleep(6)


def download(url: str, sha256: str, dest: Path, total: float = DOWNLOAD_TIMEOUT) -> None:
    """The image into ``dest``, hashed on the way; a mismatch deletes it and fails."""
    digest = hashlib.sha256()
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT) as r, dest.open("wb") as out:
        while chunk := r.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            if time.monotonic() - start > total:
                raise StepFailed("download", f"{url} took longer than {total:.0f} s")
    if digest.hexdigest() != sha256.lower():
        dest.unlink(missing_ok=True)
        raise StepFailed("download", f"image checksum mismatch: expected {sha256.lower()}, got "
                                     f"{digest.hexdigest()} ({url}); no disk was touched")


def wipefs_types(text: str) -> list[str]:
    """The signature types in ``wipefs --no-act --parsable`` output (offset,uuid,label,type)."""
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]
    return [row[3] for row in rows if len(row) > 3]


def signatures(run: Run, device: str) -> list[str]:
    """What wipefs finds on ``device`` and on its partitions."""
    found = wipefs_types(run(["wipefs", "--no-act", "--parsable", device]))
    for part in run(["lsblk", "-nrpo", "NAME", device]).split()[1:]:
        found += [f"{part}: {t}" for t in wipefs_types(run(["wipefs", "--no-act", "--parsable", part]))]
    return found


# the deploy's steps in their order (the docstring above says what each does): the names the
# console lines and the failure reports carry, which the VM lab's phase split reads back
STEPS = ("identify", "disks", "download", "partition", "filesystem", "extract", "identity", "bootloader",
         "hostkeys")


class Steps:
    """The deploy's current step, and on the console (the unit's output) each finished step
    with its seconds: an operator watching a node's screen sees where its deploy is, and
    where a slow one spends its time."""

    def __init__(self, say: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.say = say or (lambda line: print(line, flush=True))
        self.clock = clock
        self.name = ""
        self.started = clock()

    def enter(self, name: str) -> None:
        self.finish()
        self.name, self.started = name, self.clock()

    def finish(self) -> None:
        if self.name:
            self.say(f"provision-deploy: {self.name} done in {self.clock() - self.started:.0f} s")
        self.name = ""


def deploy(plan: dict[str, Any], *, run: Run = run_command, target: Path = TARGET, image: Path = IMAGE,
           nics: Callable[[], list[str]] = macs, fetch: Callable[[str, str, Path], None] = download,
           resolve: Callable[[str], str | None] | None = None, steps: Steps | None = None) -> list[str]:
    """Every step of the deploy; returns the new SSH host public keys. Raises StepFailed."""
    steps = steps or Steps()
    steps.enter("identify")
    check_identity(plan, nics())

    def by_id(path: str) -> str | None:
        return os.path.realpath(path) if os.path.exists(path) else None

    steps.enter("disks")
    found = {d: (resolve or by_id)(d) for d in plan["disks"]}
    try:
        sigs = {str(dev): signatures(run, str(dev)) for dev in found.values() if dev}
    except RuntimeError as exc:
        raise StepFailed(steps.name, str(exc)) from None
    refusal = disk_refusal(plan, found, sigs)
    if refusal:
        raise StepFailed(steps.name, refusal)
    devices = [str(found[d]) for d in plan["disks"]]
    raid1 = bool(plan["raid1"])
    url, sha = plan["image"]["url"], plan["image"]["sha256"]
    if not sha:
        raise StepFailed("download", f"the plan names no checksum for {url}: run `provision image build` and "
                                     "apply again; no disk was touched")
    flag = tar_flag(url)
    steps.enter("download")
    fetch(url, sha, image)  # raises StepFailed("download") before any disk is touched
    with image.open("rb") as f:
        check_compression(url, f.read(8))
    try:
        steps.enter("partition")
        for cmd in partition_commands(devices, raid1):
            run(cmd)
        steps.enter("filesystem")
        cmds, root = filesystem_commands(devices, raid1)
        for cmd in cmds:
            run(cmd)
        steps.enter("extract")
        esp = partition_name(devices[0], 2)
        run(["mkdir", "-p", str(target)])
        run(["mount", root, str(target)])
        run(["mkdir", "-p", f"{target}/boot/efi"])
        run(["mount", esp, f"{target}/boot/efi"])
        run(["tar", "-x", flag, "-p", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-f", str(image),
             "-C", str(target)])
        run(["rm", "-f", str(image)])
        steps.enter("identity")
        for f in plan["files"]:
            run(["install", "-D", "-m", f["mode"], "/dev/null", f"{target}{f['path']}"])
            Path(f"{target}{f['path']}").write_text(f["content"])
        root_uuid = run(["blkid", "-s", "UUID", "-o", "value", root]).strip()
        esp_uuid = run(["blkid", "-s", "UUID", "-o", "value", esp]).strip()
        Path(f"{target}/etc/fstab").write_text(fstab(root_uuid, esp_uuid))
        for mnt in ("dev", "proc", "sys", "run"):
            run(["mount", "--rbind", f"/{mnt}", f"{target}/{mnt}"])
        run(["chroot", str(target), "sh", "-c", user_script(plan["users"])])
        if raid1:  # the image's initramfs must assemble the root array
            conf = run(["mdadm", "--detail", "--scan"])
            Path(f"{target}/etc/mdadm/mdadm.conf").write_text(conf)
            run(["chroot", str(target), "update-initramfs", "-u", "-k", "all"])
        steps.enter("bootloader")
        Path(f"{target}/etc/default/grub.d").mkdir(parents=True, exist_ok=True)
        Path(f"{target}/etc/default/grub.d/50-provision.cfg").write_text(
            'GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8"\nGRUB_TIMEOUT=1\n')
        for dev in devices:
            run(["chroot", str(target), "grub-install", "--target=i386-pc", dev])
        run(["chroot", str(target), *efi_grub_install(signed_boot_chain(target))])
        for dev in devices[1:]:  # the mirror's ESP gets the same boot loader
            run(["mkdir", "-p", "/run/esp2"])
            run(["mount", partition_name(dev, 2), "/run/esp2"])
            run(["cp", "-a", f"{target}/boot/efi/.", "/run/esp2/"])
            run(["umount", "/run/esp2"])
        run(["chroot", str(target), "update-grub"])
        steps.enter("hostkeys")
        run(["chroot", str(target), "ssh-keygen", "-A"])
        keys = [p.read_text().strip() for p in sorted(Path(f"{target}/etc/ssh").glob("ssh_host_*_key.pub"))]
        if not keys:
            raise RuntimeError("ssh-keygen -A made no host keys")
        run(["sync"])
    except RuntimeError as exc:
        raise StepFailed(steps.name, str(exc)) from None
    steps.finish()
    return keys


def main(cmdline: str | None = None, deploy_with: Callable[[dict[str, Any]], list[str]] = deploy) -> int:
    """Fetch this node's plan (its URL on the kernel command line), deploy it, report to the
    head node: the host keys on success, the failed step and why otherwise."""
    plan: dict[str, Any] = {}
    try:
        url = plan_url(Path("/proc/cmdline").read_text() if cmdline is None else cmdline)
        try:
            plan = json.loads(http_get(url))
        except (OSError, ValueError) as exc:
            raise StepFailed("identify", f"cannot read the deploy plan {url}: {exc}") from None
        start = time.monotonic()
        keys = deploy_with(plan)
        print(f"provision-deploy: {plan['node']} deployed in {time.monotonic() - start:.0f} s", flush=True)
        http_post(plan["report_url"], "\n".join(keys) + "\n")
    except StepFailed as exc:
        print(f"provision-deploy: FAILED at {exc}", file=sys.stderr, flush=True)
        if plan.get("report_url"):
            try:
                http_post(failed_url(plan["report_url"], plan["node"]), f"{exc.step}: {exc.message}\n")
            except OSError as post:
                print(f"provision-deploy: cannot report the failure: {post}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
