"""`provision image build` for real: the lab manifest's Debian 12 node image and deploy ramdisk,
built with mmdebstrap through its apt proxy (the test bed's apt-cacher-ng, reached at the host's
end of the lab's management bridge), proven (every package the lab's roles install resolves in
the image from Debian's pockets and components; the lab selects no vendor repository, which
cannot be reached from here), then found in the cache on the second run; and the proof of a GPU
variant (Debian's driver and CUDA from non-free) failing on a misspelt package the manifest names,
and on it alone. test_lab.py deploys this very image (it finds it in
the cache). Lab lane (root, minutes: ~3-4 min on 2 cores the first time; the cache under
LAB_CACHE keeps it between runs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from lab.labvm import LAB_IMAGES, Netns, lab_manifest
from provisioner import packages, preflight
from provisioner.areas.baremetal.preflight import NIC_FAMILIES, missing_nic_drivers
from provisioner.validate import load_manifest

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
ANY_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC8kTz5vP3wJ9tYl0c0cA0mH7f2Jb3Yx1uY8R9n2kQ1a lab"
PROXY = "http://10.213.9.254:3142"  # lab.yaml's apt proxy: apt-cacher-ng at the host's end of the bridge
CACHE = LAB_IMAGES


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "building an image needs root"
    if shutil.which("mmdebstrap") is None:
        return "mmdebstrap is not installed (tests/testbed/setup.sh installs it)"
    try:
        urllib.request.urlopen(f"{PROXY}/acng-report.html", timeout=10).close()
    except OSError:
        return f"the test bed's apt-cacher-ng does not answer on {PROXY} (tests/testbed/setup.sh)"
    return None


def provision(*args: str) -> subprocess.CompletedProcess[str]:
    # this checkout's provisioner (cwd first on sys.path), whichever one the venv installed
    return subprocess.run([sys.executable, "-m", "provisioner.cli", *args], capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)


def test_debian_12_image_is_built_once_and_holds_what_a_node_needs(tmp_path: Path, lab_network: Netns) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    manifest = lab_manifest(tmp_path, ANY_KEY)  # any key: none is in an image
    start = time.monotonic()
    first = provision("image", "build", str(manifest), "--cache-dir", str(CACHE))
    took = time.monotonic() - start
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"^deploy ramdisk: (built|cached)", first.stdout, re.M), first.stdout
    # what apply's preflight reads: the ramdisk carries every server NIC family's driver
    modules = preflight.ramdisk_modules(CACHE)
    assert modules is not None and missing_nic_drivers(modules) == [], NIC_FAMILIES
    print(f"\nimage build: {first.stdout.strip().splitlines()[-1]} ({took:.0f} s)")
    match = re.search(r"debian-12: (built|cached).*: (\S+) sha256 ([0-9a-f]{64})", first.stdout)
    assert match, first.stdout
    image = Path(match.group(2))
    # the checksum file beside it is sha256sum's
    subprocess.run(["sha256sum", "-c", f"{image.name}.sha256"], cwd=image.parent, check=True, capture_output=True)
    firstboot, mask_path = "./etc/systemd/system/provision-firstboot.service", \
        "./etc/systemd/system/systemd-firstboot.service"
    names, files, links = read_image(image, {"./etc/machine-id", firstboot}, {mask_path})
    assert files["./etc/machine-id"] == b""
    assert b"ssh-keygen -A" in files[firstboot]
    assert any(re.match(r"\./boot/vmlinuz-\d", n) for n in names)
    assert any(re.match(r"\./boot/initrd\.img-\d", n) for n in names)
    for path in ("./usr/sbin/sshd", "./usr/bin/python3", "./usr/sbin/grub-install", "./sbin/mdadm",
                 "./usr/lib/grub/i386-pc/boot.img", "./usr/lib/grub/x86_64-efi/linux.mod",
                 "./etc/systemd/system/multi-user.target.wants/provision-firstboot.service"):
        assert path in names or path.replace("./sbin/", "./usr/sbin/") in names, path
    assert not [n for n in names if n.startswith("./etc/ssh/ssh_host_")]  # every node makes its own
    assert "./etc/hostname" not in names
    assert links[mask_path] == "/dev/null"  # no console prompt on the first boot
    # the proof: every package the lab's roles install resolves in the image, from every
    # pocket and component of Debian 12 (through the lab's proxy); its record lies beside it
    proven = re.search(r"^debian-12: (proven in \d+ s|proof cached): (\d+) packages resolve from (\d+) sources "
                       r"\(kernel (\S+)\): (\S+)$", first.stdout, re.M)
    assert proven, first.stdout
    print(f"image proof: {proven.group(0)}")
    record = json.loads(Path(proven.group(5)).read_text())
    assert record["image_sha256"] == match.group(3) and record["os"] == "debian-12"
    assert {"slurmd", "slurmctld", "zfs-dkms", f"linux-headers-{record['kernel']}", "nfs-kernel-server",
            "prometheus", "nginx", "chrony"} <= set(record["packages"])
    assert record["sources"] == [
        f"deb http://deb.debian.org/debian {suite} main contrib non-free non-free-firmware"
        for suite in ("bookworm", "bookworm-updates")] + [
        "deb http://deb.debian.org/debian-security bookworm-security main contrib non-free non-free-firmware"]
    # same inputs: found in the cache, not rebuilt
    start = time.monotonic()
    again = provision("image", "build", str(manifest), "--cache-dir", str(CACHE))
    assert again.returncode == 0 and f"debian-12: cached: {image} sha256 {match.group(3)}" in again.stdout, again.stdout
    assert re.search(r"^deploy ramdisk: cached: ", again.stdout, re.M), again.stdout
    assert re.search(r"^debian-12: proof cached: ", again.stdout, re.M), again.stdout
    assert time.monotonic() - start < 60


def test_the_image_proof_fails_on_a_package_no_source_has(tmp_path: Path, lab_network: Netns) -> None:
    """The lab manifest with pxe1 a GPU node on Debian's own stack (driver 535 and CUDA 11.8
    from non-free, NCCL from PyPI, the nvidia-smi collector: no NVIDIA repository, which
    cannot be reached from here) and a misspelt package: the build fails at the proof naming
    that package alone, the OS, the sources looked in and the manifest field, so the GPU
    stack resolved in the image; the image stays as it was (its node image does not change
    with GPUs, the proof of the lab's own list beside it untouched)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    manifest = lab_manifest(tmp_path, ANY_KEY)
    data = yaml.safe_load(manifest.read_text())
    pxe1 = next(n for n in data["nodes"] if n["name"] == "pxe1")
    pxe1["hardware"]["gpu"] = {"model": "RTX A6000", "count": 1}
    data["software"] = {"nvidia_driver": {"branch": "535", "source": "debian"},
                        "cuda": {"versions": ["11.8"], "source": "debian"}, "nccl": {"source": "pypi"}}
    data["monitoring"]["gpu_metrics"] = "nvidia-smi"
    data["role_vars"] = {"all": {"common_packages": ["htop", "slurmdd"]}}
    manifest.write_text(yaml.safe_dump(data))
    asked = set(packages.wanted(load_manifest(manifest).manifest, "debian-12").packages)
    assert {"nvidia-driver", "nvidia-kernel-dkms", "firmware-misc-nonfree", "nvidia-cuda-toolkit", "slurmdd"} <= asked
    start = time.monotonic()
    failed = provision("image", "build", str(manifest), "--cache-dir", str(CACHE))
    took = time.monotonic() - start
    assert failed.returncode == 1, failed.stdout + failed.stderr
    print(f"\nimage proof, failure case ({took:.0f} s):\n{failed.stderr.strip()}")
    assert "debian-12: 1 package(s) the roles install do not resolve in the image:" in failed.stderr
    assert re.search(r"^  slurmdd: no package of that name in these sources; asked for by role_vars: "
                     r"common_packages \(role common, roles/common/tasks/packages.yml: Install base packages; "
                     r"nodes head1, store1, store2, pxe1\)$", failed.stderr, re.M), failed.stderr
    assert "debian-12: sources looked in:\n  deb http://deb.debian.org/debian bookworm main contrib non-free " \
           "non-free-firmware\n" in failed.stderr
    assert not list(CACHE.glob(".proof-*"))  # the scratch tree is gone


def read_image(image: Path, files: set[str], links: set[str]) -> tuple[set[str], dict[str, bytes], dict[str, str]]:
    """In one pass over the image (a .tar.zst, which Python's tarfile reads only as the stream
    ``zstd -dc`` gives): every member's name, the contents of ``files``, the targets of ``links``."""
    names: set[str] = set()
    contents: dict[str, bytes] = {}
    targets: dict[str, str] = {}
    with subprocess.Popen(["zstd", "-dc", str(image)], stdout=subprocess.PIPE) as unzstd:
        assert unzstd.stdout is not None
        with tarfile.open(fileobj=unzstd.stdout, mode="r|") as tar:
            for member in tar:
                names.add(member.name)
                if member.name in files:
                    data = tar.extractfile(member)
                    contents[member.name] = data.read() if data is not None else b""
                if member.name in links:
                    targets[member.name] = member.linkname
    assert unzstd.returncode == 0, f"zstd -dc {image}: exit {unzstd.returncode}"
    return names, contents, targets
