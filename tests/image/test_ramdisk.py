"""The deploy ramdisk: recipe (agent inside, cache key), the initramfs writer (newc cpio the
kernel unpacks) and its build cache, with mmdebstrap faked (the real build is the lab's)."""

from __future__ import annotations

import gzip
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.image import agent
from provisioner.image import build as ib
from provisioner.image import recipe as rc

AGENT = Path(agent.__file__).read_text()


def read_newc(data: bytes) -> dict[str, tuple[int, bytes]]:
    """name -> (mode, content) of a newc cpio archive."""
    out: dict[str, tuple[int, bytes]] = {}
    pos = 0
    while True:
        assert data[pos:pos + 6] == b"070701", pos
        fields = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, namesize = fields[1], fields[6], fields[11]
        pos += 110
        name = data[pos:pos + namesize - 1].decode()
        pos += namesize + (-(110 + namesize) % 4)
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, data[pos:pos + size])
        pos += size + (-size % 4)


def test_the_ramdisk_recipe_carries_the_agent_and_its_tools() -> None:
    r = rc.ramdisk_recipe("http://127.0.0.1:3142/deb.debian.org/debian", None, AGENT)
    assert r.os == "deploy-ramdisk" and r.suite == "bookworm"
    for package in ("linux-image-amd64", "python3", "gdisk", "mdadm", "dosfstools", "parted", "systemd-sysv"):
        assert package in r.packages
    assert "provision-deploy" in r.customize_hook and 'ln -sf /lib/systemd/systemd "$r"/init' in r.customize_hook
    env = rc.build_environment(r)
    assert env["PROVISION_AGENT"] == AGENT and "provision-deploy" in env["PROVISION_DEPLOY_UNIT"]
    assert "DHCP=ipv4" in env["PROVISION_DEPLOY_NETWORK"] and "drivers/gpu" in env["PROVISION_DROP"]
    assert rc.ramdisk_recipe(r.mirror, None, AGENT + "# changed\n").key != r.key  # a new agent: a new ramdisk
    assert "--format=directory" in rc.mmdebstrap_command(r, "/x", "directory")
    subprocess.run(["sh", "-n", "-c", rc.RAMDISK_HOOK], check=True)


# The server NICs a provisioning network runs on (paths under lib/modules/<kernel>/kernel/):
# Intel, NVIDIA/Mellanox ConnectX, Broadcom NetXtreme.
SERVER_NICS = {
    "ixgbe": "drivers/net/ethernet/intel/ixgbe/ixgbe.ko",
    "i40e": "drivers/net/ethernet/intel/i40e/i40e.ko",
    "ice": "drivers/net/ethernet/intel/ice/ice.ko",
    "igb": "drivers/net/ethernet/intel/igb/igb.ko",
    "mlx5_core": "drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko",
    "mlxfw": "drivers/net/ethernet/mellanox/mlxfw/mlxfw.ko",  # mlx5_core needs it
    "bnxt_en": "drivers/net/ethernet/broadcom/bnxt/bnxt_en.ko",
    "tg3": "drivers/net/ethernet/broadcom/tg3.ko",
}


@pytest.mark.parametrize("module", sorted(SERVER_NICS))
def test_the_ramdisk_keeps_the_server_nic_drivers(module: str, tmp_path: Path) -> None:
    # run the hook's drop loop on a module tree: a node whose provisioning NIC is a
    # ConnectX got no DHCP in the ramdisk when drivers/net/ethernet/mellanox was dropped
    kernel = tmp_path / "lib/modules/6.1.0-28-amd64/kernel"
    for path in [*SERVER_NICS.values(), "drivers/gpu/drm/ast/ast.ko", "sound/core/snd.ko"]:
        (kernel / path).parent.mkdir(parents=True, exist_ok=True)
        (kernel / path).write_bytes(b"ko")
    loop = 'for d in $PROVISION_DROP; do rm -rf "$r"/lib/modules/*/kernel/"$d"; done'
    assert loop in rc.RAMDISK_HOOK
    subprocess.run(["sh", "-c", 'r="$1"; ' + loop, "sh", str(tmp_path)], check=True,
                   env={"PATH": "/usr/bin:/bin", "PROVISION_DROP": " ".join(rc.RAMDISK_DROP)})
    assert (kernel / SERVER_NICS[module]).is_file()
    assert not (kernel / "drivers/gpu").exists() and not (kernel / "sound").exists()  # the drop still works


def test_initramfs_keeps_files_links_dirs_and_modes_and_leaves_boot_out(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "usr/local/sbin").mkdir(parents=True)
    (tree / "boot").mkdir()
    (tree / "boot/vmlinuz-6").write_bytes(b"kernel")
    (tree / "usr/local/sbin/provision-deploy").write_text("#!/usr/bin/python3\n")
    (tree / "usr/local/sbin/provision-deploy").chmod(0o755)
    (tree / "odd").write_bytes(b"12345")  # a size that needs padding
    os.symlink("/lib/systemd/systemd", tree / "init")
    out = tmp_path / "initrd.img"
    ib.write_initramfs(tree, out)
    entries = read_newc(gzip.decompress(out.read_bytes()))
    assert set(entries) == {"usr", "usr/local", "usr/local/sbin", "usr/local/sbin/provision-deploy", "odd", "init"}
    mode, content = entries["usr/local/sbin/provision-deploy"]
    assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o755 and content == b"#!/usr/bin/python3\n"
    assert entries["odd"][1] == b"12345"
    assert stat.S_ISLNK(entries["init"][0]) and entries["init"][1] == b"/lib/systemd/systemd"
    assert stat.S_ISDIR(entries["usr"][0])


class FakeTree:
    """Stands in for mmdebstrap --format=directory."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        assert "--format=directory" in cmd and kwargs["env"]["PROVISION_AGENT"] == AGENT
        self.calls += 1
        tree = Path(cmd[-2])
        (tree / "boot").mkdir(parents=True)
        (tree / "boot/vmlinuz-6.1.0-50-amd64").write_bytes(b"kernel")
        (tree / "etc").mkdir()
        (tree / "etc/hostname").write_text("deploy\n")
        return subprocess.CompletedProcess(cmd, 0)


def test_the_ramdisk_is_built_once_per_recipe(tmp_path: Path) -> None:
    r = rc.ramdisk_recipe(None, None, AGENT)
    run = FakeTree()
    ramdisk = ib.build_ramdisk(r, tmp_path, run=run, which=lambda _: "/x", euid=lambda: 0, exists=lambda _: True)
    assert ramdisk.source == "built" and ramdisk.kernel.read_bytes() == b"kernel"
    assert "etc/hostname" in read_newc(gzip.decompress(ramdisk.initrd.read_bytes()))
    subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=ramdisk.directory, check=True, capture_output=True)
    assert (tmp_path / "deploy-ramdisk").resolve() == ramdisk.directory
    again = ib.build_ramdisk(r, tmp_path, run=run, which=lambda _: "/x", euid=lambda: 0, exists=lambda _: True)
    assert again.source == "cached"
    assert run.calls == 1
    ramdisk.initrd.write_bytes(b"tampered")
    with pytest.raises(ib.ImageError, match=r"cached deploy ramdisk initrd\.img: SHA-256 mismatch"):
        ib.build_ramdisk(r, tmp_path, run=run, which=lambda _: "/x", euid=lambda: 0, exists=lambda _: True)
    assert not list(tmp_path.glob(".ramdisk-*"))  # no work tree left behind
