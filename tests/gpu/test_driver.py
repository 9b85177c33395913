"""The nvidia_driver role's facts module (roles/nvidia_driver/library/nvidia_gpu_facts.py)
on the real machine: its PCI count and driver version agree with what the driver says."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from gpukit import ROLES, Gpu, run


def facts_module() -> ModuleType:
    path = ROLES / "nvidia_driver" / "library" / "nvidia_gpu_facts.py"
    spec = importlib.util.spec_from_file_location("nvidia_gpu_facts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loaded_version(facts: ModuleType) -> str:
    """What the module reads for the loaded driver (sysfs first, then /proc)."""
    sysfs = Path("/sys/module/nvidia/version")
    if sysfs.is_file():
        return sysfs.read_text().strip()
    proc = Path("/proc/driver/nvidia/version")
    return str(facts.parse_proc_version(proc.read_text())) if proc.is_file() else ""


def test_pci_shows_every_gpu_the_driver_lists(gpus: list[Gpu]) -> None:
    facts = facts_module()
    found, _switches = facts.pci_devices("/sys")
    assert len(found) == len(gpus), f"PCI: {found}; nvidia-smi: {gpus}"
    assert facts.count_problem(len(gpus), len(found)) == ""


def test_loaded_driver_is_the_one_nvidia_smi_reports(gpus: list[Gpu]) -> None:
    facts = facts_module()
    loaded = loaded_version(facts)
    if not loaded:
        pytest.skip("neither /sys/module/nvidia/version nor /proc/driver/nvidia/version is readable here")
    assert {g.driver for g in gpus} == {loaded}


def test_no_reboot_is_asked_for_on_a_running_driver(gpus: list[Gpu]) -> None:
    facts = facts_module()
    loaded = loaded_version(facts)
    if not loaded:
        pytest.skip("the loaded driver's version is not readable here")
    installed = ""
    modinfo = shutil.which("modinfo") or ("/sbin/modinfo" if Path("/sbin/modinfo").exists() else None)
    if modinfo:
        proc = run([modinfo, "-F", "version", "nvidia"], 30)
        installed = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
    nouveau = Path("/sys/module/nouveau").is_dir()
    assert facts.reboot_reasons(len(gpus), nouveau, loaded, installed) == [], (
        f"loaded {loaded}, installed {installed or '(modinfo found none)'}, nouveau {nouveau}")
