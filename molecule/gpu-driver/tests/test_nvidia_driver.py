"""Verify the nvidia_driver role on Debian 12 in a container (userspace driver, branch 535)."""

from __future__ import annotations

import re

import pytest

USERSPACE = ["nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced"]


@pytest.mark.parametrize("name", USERSPACE)
def test_userspace_package_on_branch_535(host, name):
    pkg = host.package(name)
    assert pkg.is_installed
    assert pkg.version.startswith("535."), pkg.version


def test_kernel_packages_not_installed_in_container(host):
    # no kernel: the DKMS module package must not be there
    assert not host.package("nvidia-kernel-dkms").is_installed
    assert not host.package("nvidia-driver").is_installed


@pytest.mark.parametrize("name", USERSPACE)
def test_package_held(host, name):
    out = host.check_output("dpkg --get-selections %s", name)
    assert re.match(rf"^{re.escape(name)}(:amd64)?\s+hold$", out), out


def test_branch_pin(host):
    pin = host.file("/etc/apt/preferences.d/nvidia-driver")
    assert pin.is_file
    assert pin.mode == 0o644
    assert "Pin: version 535.*" in pin.content_string
    assert "Pin-Priority: 1001" in pin.content_string
    package_line = next(ln for ln in pin.content_string.splitlines() if ln.startswith("Package:"))
    assert set(USERSPACE) <= set(package_line.split()[1:])
    # apt applies it: the installed version carries priority 1001
    policy = host.check_output("apt-cache policy nvidia-smi")
    installed = re.search(r"Installed: (\S+)", policy).group(1)
    assert re.search(rf"\*\*\* {re.escape(installed)} 1001", policy), policy


def test_nouveau_blacklisted(host):
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert conf.is_file
    assert conf.user == "root"
    assert conf.mode == 0o644
    lines = conf.content_string.splitlines()
    assert "blacklist nouveau" in lines
    assert "options nouveau modeset=0" in lines


def test_persistenced_enabled(host):
    svc = host.service("nvidia-persistenced")
    assert svc.is_enabled


DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/provision.conf"


def test_persistenced_dropin_turns_persistence_mode_on(host):
    dropin = host.file(DROPIN)
    assert dropin.is_file
    assert dropin.user == "root"
    assert dropin.mode == 0o644
    lines = dropin.content_string.splitlines()
    # the packaged ExecStart is cleared, then ours (Debian's user is nvpd)
    assert lines[-2:] == ["ExecStart=", "ExecStart=/usr/bin/nvidia-persistenced --user nvpd"]
    # systemd loaded it: `systemctl cat` lists the drop-in and the effective command is ours
    cat = host.check_output("systemctl cat nvidia-persistenced")
    assert f"# {DROPIN}" in cat
    show = host.check_output("systemctl show -p ExecStart nvidia-persistenced")
    assert "argv[]=/usr/bin/nvidia-persistenced --user nvpd ;" in show, show
    assert "--no-persistence-mode" not in show


def test_persistence_mode_on_every_gpu(host):
    # needs the kernel module and GPUs: a container has neither
    if not host.file("/dev/nvidiactl").exists:
        pytest.skip("no GPU (no /dev/nvidiactl): persistence mode is checked with nvidia-smi -q on GPU nodes")
    out = host.check_output("nvidia-smi -q")
    modes = re.findall(r"^\s*Persistence Mode\s*:\s*(\S+)", out, re.M)
    assert modes and set(modes) == {"Enabled"}, modes


def test_nvidia_smi_present_without_kernel_module(host):
    # the userspace is there; without the kernel module (container) nvidia-smi says so
    assert host.exists("nvidia-smi")
    result = host.run("nvidia-smi")
    assert result.rc != 0
    assert "couldn't communicate with the NVIDIA driver" in result.stdout + result.stderr


def test_libcuda_and_nvml_loadable(host):
    out = host.check_output("ldconfig -p")
    assert "libcuda.so.1" in out
    assert "libnvidia-ml.so.1" in out
