"""provisioner.areas.slurm.facts: a node's facts against the manifest."""

from __future__ import annotations

from provisioner.areas.slurm.facts import fact_report

EXPECTED = {"name": "gpu01", "cpus": 48, "real_memory_mb": 249037, "memory_gb": 256,
            "gpu_count": 2, "gpu_type": "rtx_a6000", "gpu_files": "/dev/nvidia[0-1]"}
GOOD = {"vcpus": 48, "memtotal_mb": 257000, "gpu_devices": ["/dev/nvidia0", "/dev/nvidia1"]}


def test_facts_matching_the_manifest() -> None:
    assert fact_report(EXPECTED, GOOD) == {"errors": [], "warnings": []}


def test_fewer_gpus_than_the_manifest() -> None:
    report = fact_report(EXPECTED, {**GOOD, "gpu_devices": ["/dev/nvidia0"]})
    assert len(report["errors"]) == 1
    msg = report["errors"][0]
    assert "gpu01" in msg and "2 GPU(s) (rtx_a6000)" in msg and "/dev/nvidia1 missing" in msg
    assert "1 /dev/nvidia<N> found: /dev/nvidia0" in msg


def test_no_gpu_device_at_all() -> None:
    report = fact_report(EXPECTED, {**GOOD, "gpu_devices": []})
    assert "/dev/nvidia0, /dev/nvidia1 missing" in report["errors"][0]
    assert "found: none" in report["errors"][0]


def test_less_memory_than_the_manifest() -> None:
    report = fact_report(EXPECTED, {**GOOD, "memtotal_mb": 225000})
    assert len(report["errors"]) == 1
    assert "225000 MB" in report["errors"][0] and "RealMemory=249037" in report["errors"][0]


def test_fewer_cpus_than_the_manifest() -> None:
    report = fact_report(EXPECTED, {**GOOD, "vcpus": 24})
    assert len(report["errors"]) == 1 and "48 CPUs" in report["errors"][0]


def test_more_hardware_is_only_a_warning() -> None:
    report = fact_report(
        EXPECTED, {"vcpus": 64, "memtotal_mb": 515000, "gpu_devices": [f"/dev/nvidia{i}" for i in range(4)]}
    )
    assert report["errors"] == []
    assert len(report["warnings"]) == 2


def test_node_without_gpus_in_manifest() -> None:
    expected = {**EXPECTED, "gpu_count": 0, "gpu_type": "", "gpu_files": ""}
    assert fact_report(expected, {**GOOD, "gpu_devices": []}) == {"errors": [], "warnings": []}
