"""provisioner.areas.gpu.verify: the GPUs, their driver, CUDA, NCCL and Docker's NVIDIA runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.gpu import verify
from provisioner.nodecheck.check import Check, Output
from provisioner.nodecheck.parsers import ParseError
from provisioner.verify import catalog


def names(checks: list[Check], node: str) -> list[str]:
    return [c.name for c in checks if c.node == node]


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def test_nvswitch_floor_and_fabric_manager(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["gpu"] = {"model": "H100 SXM5", "count": 8, "nvswitch": True}
    data["verify"] = {"busbw_floor_gbps": {"nvswitch": 300}}
    m = kit.load(data).manifest
    checks = catalog.plan(m)
    assert "fabricmanager" in names(checks, "node01")
    assert verify.busbw_floor(m, m.node("node01")) == ("nvswitch", 300.0)
    assert verify.busbw_floor(kit.load(kit.base()).manifest, m.node("node01")) == ("nvswitch", 150.0)
    allreduce = by_name(checks, "node01", "nccl.all_reduce")
    assert "-g 8" in allreduce.command.text  # type: ignore[union-attr]
    slow = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 212.5\n"
    assert allreduce.judge(Output(stdout=slow)).status == "FAIL"
    fast = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 402.1\n"
    assert allreduce.judge(Output(stdout=fast)).status == "PASS"


def test_gpu_verdicts(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    checks = catalog.plan(m)

    def judge(name: str, stdout: str, rc: int = 0) -> tuple[str, str]:
        o = by_name(checks, "node01", name).judge(Output(rc=rc, stdout=stdout))
        return o.status, o.detail

    good = "0, NVIDIA RTX A6000, 580.65.06, Enabled, 0\n1, NVIDIA RTX A6000, 580.65.06, Enabled, 0\n"
    for name in ("gpu.count", "gpu.model", "gpu.driver", "gpu.persistence", "gpu.ecc"):
        assert judge(name, good)[0] == "PASS", name
    one = "0, NVIDIA RTX A6000, 550.127.05, Disabled, 3\n"
    assert judge("gpu.count", one) == ("FAIL", "1 GPUs seen, manifest says 2")
    assert judge("gpu.driver", one) == ("FAIL", "driver 550.127.05, manifest branch 580")
    assert judge("gpu.persistence", one) == ("FAIL", "persistence mode off on GPU 0")
    assert judge("gpu.ecc", one) == ("FAIL", "uncorrected ECC errors since boot: GPU 0: 3")
    assert judge("gpu.model", "0, NVIDIA GeForce RTX 3090, 580.65.06, Enabled, [N/A]\n")[0] == "FAIL"
    assert judge("gpu.ecc", "0, NVIDIA RTX A6000, 580.65.06, Enabled, [N/A]\n")[0] == "SKIP"
    # no driver: nvidia-smi's complaint is no PASS
    status, detail = judge("gpu.count", "NVIDIA-SMI has failed because it couldn't communicate with the driver\n", 9)
    assert status == "FAIL" and "5 comma-separated" in detail
    assert judge("gpu.xid", "NVRM: Xid (PCI:0000:4f:00): 79, pid=1, GPU has fallen off the bus.\n") == (
        "FAIL", "1 Xid errors since boot: Xid 79 on 0000:4f:00")
    assert judge("gpu.xid", "") == ("PASS", "none since boot")
    assert judge("cuda", "devices 2\n")[0] == "PASS"
    assert judge("cuda", "error no CUDA-capable device is detected\n", 1)[0] == "FAIL"
    assert judge("nccl.version", "NCCL 2.21.5 (code 22105)\n")[0] == "PASS"
    assert judge("nccl.version", "NCCL 2.18.3 (code 21803)\n") == ("FAIL", "NCCL 2.18.3, manifest says 2.21.5")


def test_docker_runtime_and_no_image(kit: Any) -> None:
    checks = catalog.plan(kit.load(kit.base()).manifest)
    docker = by_name(checks, "node01", "docker.runtime")
    assert docker.judge(Output(stdout='{"runc":{}}')).status == "FAIL"
    assert docker.judge(Output(stdout='{"runc":{},"nvidia":{}}')).status == "PASS"
    assert by_name(checks, "node01", "docker.gpu_run").skip.startswith("no verify.docker_image")


def test_docker_run_with_an_image(kit: Any) -> None:
    data = kit.base()
    data["verify"] = {"docker_image": "cuda:12.6-base"}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "docker.gpu_run")
    assert check.skip == "" and "cuda:12.6-base nvidia-smi -L" in check.command.text  # type: ignore[union-attr]
    assert check.judge(Output(stdout="GPU 0: NVIDIA RTX A6000 (UUID: x)\nGPU 1: NVIDIA RTX A6000 (UUID: y)\n")).status \
        == "PASS"
    assert check.judge(Output(rc=125, stderr="docker: Error response from daemon: unknown runtime\n")).status == "FAIL"


def test_model_names_match_loosely() -> None:
    assert verify.model_matches("RTX A6000", "NVIDIA RTX A6000")
    assert verify.model_matches("GeForce RTX 3090", "NVIDIA GeForce RTX 3090")
    assert verify.model_matches("H100", "NVIDIA H100 80GB HBM3")
    assert not verify.model_matches("A100", "NVIDIA H100 80GB HBM3")
    assert not verify.model_matches("RTX A6000", "NVIDIA RTX A5000")


# --------------------------------------------------------------------------- parsers
NVIDIA_SMI_OK = """\
0, NVIDIA RTX A6000, 580.65.06, Enabled, 0
1, NVIDIA RTX A6000, 580.65.06, Enabled, 0
"""


NVIDIA_SMI_CONSUMER = """\
0, NVIDIA GeForce RTX 3090, 550.127.05, Disabled, [N/A]
"""


NVIDIA_SMI_DRIVER_GONE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                          "Make sure that the latest NVIDIA driver is installed and running.\n")


def test_gpu_query_rows() -> None:
    rows = verify.parse_gpu_query(NVIDIA_SMI_OK)
    assert [(r.index, r.name, r.driver, r.persistence, r.ecc_uncorrected) for r in rows] == [
        (0, "NVIDIA RTX A6000", "580.65.06", True, 0), (1, "NVIDIA RTX A6000", "580.65.06", True, 0)]
    (row,) = verify.parse_gpu_query(NVIDIA_SMI_CONSUMER)
    assert row.ecc_uncorrected is None and not row.persistence


def test_gpu_query_recorded_on_an_h100() -> None:
    (row,) = verify.parse_gpu_query((Path(__file__).parent / "recorded" / "nvidia-smi-gpu-query-h100.csv").read_text())
    assert (row.index, row.name, row.driver, row.persistence, row.ecc_uncorrected) == (
        0, "NVIDIA H100 80GB HBM3", "580.159.04", True, 0)


def test_gpu_query_refuses_an_error_message() -> None:
    with pytest.raises(ParseError, match="5 comma-separated"):
        verify.parse_gpu_query(NVIDIA_SMI_DRIVER_GONE)


def test_xid_lines() -> None:
    log = ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.65.06\n"
           "NVRM: Xid (PCI:0000:4f:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
           "NVRM: Xid (PCI:0000:52:00): 48, pid=0, An uncorrectable double bit error\n")
    assert verify.parse_xid(log) == [("0000:4f:00", 79), ("0000:52:00", 48)]
    assert verify.parse_xid("") == []


def test_device_query_and_nccl_version() -> None:
    assert verify.parse_device_query("devices 2\n") == 2
    with pytest.raises(ParseError, match="CUDA: no CUDA-capable device"):
        verify.parse_device_query("error no CUDA-capable device is detected\n")
    assert verify.parse_nccl_version("NCCL 2.21.5 (code 22105)\n") == "2.21.5"
    with pytest.raises(ParseError):
        verify.parse_nccl_version("")


def test_docker_runtimes() -> None:
    text = '{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}'
    assert verify.parse_docker_runtimes(text) == {"io.containerd.runc.v2", "nvidia", "runc"}
    with pytest.raises(ParseError):
        verify.parse_docker_runtimes("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
