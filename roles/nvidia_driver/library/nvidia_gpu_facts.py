#!/usr/bin/python
"""Ansible module: NVIDIA GPUs on PCI and the state of the nvidia kernel module.

Read-only. The pure helpers (``pci_devices``, ``count_problem``, ``reboot_reasons``) are
unit-tested in tests/areas/gpu/test_decide.py.
"""

from __future__ import annotations

import os
import re

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: NVIDIA GPUs from PCI sysfs and the nvidia kernel module state
description:
  - Counts NVIDIA GPUs (vendor 0x10de, PCI class 0x03xx display controllers) and NVSwitches
    (vendor 0x10de, class 0x0680) under /sys/bus/pci/devices.
  - Reports whether nouveau is loaded, the version of the loaded nvidia module and the
    version of the nvidia module installed for the running kernel (modinfo).
  - Compares the GPU count with the expected one and lists reasons a reboot is needed.
  - Never changes anything.
options:
  expected_count:
    description: GPUs the manifest says this node has (0 = do not compare).
    type: int
    default: 0
  sysfs_root:
    description: Root of sysfs (tests point it at a fake tree).
    type: path
    default: /sys
author: provisioner
"""

RETURN = r"""
gpus:
  description: NVIDIA GPUs on PCI (address, device id, class).
  type: list
  elements: dict
  returned: always
gpu_count:
  description: Number of NVIDIA GPUs found.
  type: int
  returned: always
nvswitch_count:
  description: Number of NVIDIA NVSwitch bridges found.
  type: int
  returned: always
count_problem:
  description: Message when gpu_count differs from expected_count, else an empty string.
  type: str
  returned: always
nouveau_loaded:
  description: Whether the nouveau module is loaded.
  type: bool
  returned: always
loaded_version:
  description: Version of the loaded nvidia module ("" when not loaded).
  type: str
  returned: always
installed_version:
  description: Version of the nvidia module installed for the running kernel ("" when none).
  type: str
  returned: always
reboot_reasons:
  description: Why the node must reboot before the installed driver is the running one.
  type: list
  elements: str
  returned: always
"""

NVIDIA_VENDOR = "0x10de"
NVSWITCH_CLASS = "0x0680"


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def pci_devices(sysfs_root: str) -> tuple[list[dict[str, str]], int]:
    """(NVIDIA GPUs, NVSwitch count) from <sysfs_root>/bus/pci/devices/*/{vendor,class,device}.

    GPUs are display controllers (class 0x03xxxx: VGA 0x0300, 3D 0x0302). The HDMI audio
    function of a GPU (0x0403) and NVSwitches (0x0680) carry the same vendor and are not GPUs.
    """
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return [], 0
    gpus: list[dict[str, str]] = []
    switches = 0
    for name in names:
        dev = os.path.join(base, name)
        if _read(os.path.join(dev, "vendor")).lower() != NVIDIA_VENDOR:
            continue
        pci_class = _read(os.path.join(dev, "class")).lower()
        if pci_class.startswith("0x03"):
            gpus.append({"address": name, "device": _read(os.path.join(dev, "device")).lower(), "class": pci_class})
        elif pci_class.startswith(NVSWITCH_CLASS):
            switches += 1
    return gpus, switches


def count_problem(expected: int, found: int) -> str:
    """A message when the PCI count differs from the manifest's, else ""."""
    if expected <= 0 or expected == found:
        return ""
    if found == 0:
        return (f"the manifest says {expected} GPU(s) but PCI shows no NVIDIA GPU "
                "(wrong node, GPUs not seated, or disabled in the BIOS)")
    return (f"the manifest says {expected} GPU(s) but PCI shows {found}: a GPU fell off the bus, "
            "is missing, or the manifest is wrong")


def parse_proc_version(text: str) -> str:
    """Driver version from /proc/driver/nvidia/version ("NVRM version: ... 550.127.05 ...")."""
    match = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else ""


def reboot_reasons(gpu_count: int, nouveau_loaded: bool, loaded_version: str, installed_version: str) -> list[str]:
    """Why the installed driver is not (and cannot become) the running one without a reboot.

    Called after the role tried ``modprobe nvidia``: a module that is still not loaded
    counts as a reason (a reboot helps when the kernel was updated, or DKMS built for the
    next kernel; the check after the reboot fails loudly when it does not help).
    """
    reasons: list[str] = []
    if gpu_count == 0:
        return reasons
    if nouveau_loaded:
        reasons.append("nouveau is loaded and holds the GPUs (it is blacklisted now)")
    if loaded_version and installed_version and loaded_version != installed_version:
        reasons.append(f"the loaded nvidia module is {loaded_version} but {installed_version} is installed")
    if not loaded_version and not nouveau_loaded:
        if installed_version:
            reasons.append(f"the nvidia module {installed_version} is installed but does not load")
        else:
            reasons.append("no nvidia module is installed for the running kernel (a newer kernel waits for a reboot?)")
    return reasons


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "expected_count": {"type": "int", "default": 0},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )
    root = module.params["sysfs_root"]
    gpus, switches = pci_devices(root)
    nouveau = os.path.isdir(os.path.join(root, "module", "nouveau"))
    loaded = _read(os.path.join(root, "module", "nvidia", "version")) or parse_proc_version(
        _read("/proc/driver/nvidia/version")
    )
    installed = ""
    modinfo = module.get_bin_path("modinfo")
    if modinfo:
        rc, out, _err = module.run_command([modinfo, "-F", "version", "nvidia"])
        if rc == 0:
            installed = out.strip().splitlines()[0] if out.strip() else ""
    module.exit_json(
        changed=False,
        gpus=gpus,
        gpu_count=len(gpus),
        nvswitch_count=switches,
        count_problem=count_problem(module.params["expected_count"], len(gpus)),
        nouveau_loaded=nouveau,
        loaded_version=loaded,
        installed_version=installed,
        reboot_reasons=reboot_reasons(len(gpus), nouveau, loaded, installed),
    )


if __name__ == "__main__":
    main()
