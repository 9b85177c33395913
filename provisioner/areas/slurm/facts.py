"""What a node reports against what the manifest promises (the role slurm's fact check)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.areas.slurm.decide import gpu_files
from provisioner.areas.slurm.hostlist import expand_hostlist


def fact_report(expected: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, list[str]]:
    """Compare what a node reports with what the manifest promises.

    ``expected``: the role variable ``slurm_node_expected`` (name, cpus, real_memory_mb,
    memory_gb, gpu_count, gpu_type, gpu_files). ``observed``: ``vcpus``, ``memtotal_mb``
    and ``gpu_devices`` (the /dev/nvidia<N> files present). ``errors`` are contradictions
    that would make slurmctld drain the node or hand out GPUs that do not exist;
    ``warnings`` are harmless differences (more hardware than the manifest says).
    """
    errors: list[str] = []
    warnings: list[str] = []
    name = str(expected.get("name", "this node"))
    cpus = int(expected.get("cpus", 0))
    vcpus = int(observed.get("vcpus", 0))
    if vcpus < cpus:
        errors.append(
            f"{name}: the manifest says {cpus} CPUs (sockets x cores_per_socket x "
            f"threads_per_core) but the node has {vcpus}; fix hardware.cpu in the manifest"
        )
    real_mem = int(expected.get("real_memory_mb", 0))
    mem_gb = int(expected.get("memory_gb", 0))
    memtotal = int(observed.get("memtotal_mb", 0))
    if memtotal < real_mem:
        errors.append(
            f"{name}: the node has {memtotal} MB of memory, less than RealMemory={real_mem} MB "
            f"derived from memory_gb: {mem_gb} in the manifest; fix hardware.memory_gb (or a "
            "missing DIMM)"
        )
    elif mem_gb and memtotal > mem_gb * 1024 * 1.1:
        warnings.append(
            f"{name}: the node has {memtotal} MB of memory, more than memory_gb: {mem_gb} in "
            "the manifest; Slurm only hands out the manifest's amount"
        )
    want = int(expected.get("gpu_count", 0))
    found = sorted(str(d) for d in observed.get("gpu_devices", []) or [])
    if want:
        wanted = expand_hostlist(str(expected.get("gpu_files", gpu_files(want))))
        missing = [d for d in wanted if d not in found]
        if missing:
            gpu_type = expected.get("gpu_type", "gpu")
            errors.append(
                f"{name}: the manifest says {want} GPU(s) ({gpu_type}) but "
                f"{', '.join(missing)} missing ({len(found)} /dev/nvidia<N> found: "
                f"{', '.join(found) or 'none'}); fix hardware.gpu.count in the manifest or the "
                "node (driver loaded? GPU seated?)"
            )
    if len(found) > want:
        warnings.append(
            f"{name}: {len(found)} GPU device files found, the manifest says {want}; the extra "
            "GPUs are not given to Slurm"
        )
    return {"errors": errors, "warnings": warnings}
