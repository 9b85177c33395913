"""provisioner.verify.parsers on recorded command output, failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.verify import parsers
from provisioner.verify.parsers import ParseError

RECORDED = Path(__file__).parent / "recorded"

NVIDIA_SMI_OK = """\
0, NVIDIA RTX A6000, 580.65.06, Enabled, 0
1, NVIDIA RTX A6000, 580.65.06, Enabled, 0
"""
NVIDIA_SMI_CONSUMER = """\
0, NVIDIA GeForce RTX 3090, 550.127.05, Disabled, [N/A]
"""
NVIDIA_SMI_DRIVER_GONE = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                          "Make sure that the latest NVIDIA driver is installed and running.\n")

ALL_REDUCE = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1
#  Rank  0 Group  0 Pid  41230 on      gpu01 device  0 [0x4f] NVIDIA RTX A6000
#  Rank  1 Group  0 Pid  41230 on      gpu01 device  1 [0x52] NVIDIA RTX A6000
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
   134217728      33554432     float     sum      -1   2780.1   48.28   48.28      0   2779.6   48.29   48.29      0
   268435456      67108864     float     sum      -1   5551.9   48.35   48.35      0   5550.8   48.36   48.36      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 24.1312
#
"""
ALL_REDUCE_WRONG = ALL_REDUCE.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")

IB_WRITE_BW = """\
rate=100 Gb/sec (4X EDR)
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : mlx5_0
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      454000           0.00               96.41              0.183888
---------------------------------------------------------------------------------------
"""

ZPOOL_OK = (RECORDED / "zpool-status-ok.txt").read_text()
ZPOOL_DEGRADED = (RECORDED / "zpool-status-degraded.txt").read_text()

CHRONY_OK = """\
Reference ID    : 0A0D070A (10.213.7.10)
Stratum         : 11
Ref time (UTC)  : Mon Nov 23 05:40:01 2026
System time     : 0.000012345 seconds slow of NTP time
Last offset     : -0.000001234 seconds
RMS offset      : 0.000004321 seconds
Frequency       : 1.234 ppm fast
Leap status     : Normal
"""
CHRONY_UNSYNC = CHRONY_OK.replace("Leap status     : Normal", "Leap status     : Not synchronised").replace(
    "0.000012345 seconds slow", "0.250000000 seconds fast")

SCONTROL_IDLE = ("NodeName=gpu01 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUEfctv=32 CPUTot=32 CPULoad=0.01 "
                 "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:rtx_a6000:2 NodeAddr=gpu01 "
                 "NodeHostName=gpu01 Version=22.05.8 OS=Linux RealMemory=250000 AllocMem=0 FreeMem=240000 "
                 "Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
                 "Partitions=batch BootTime=2026-11-22T10:00:00 SlurmdStartTime=2026-11-22T10:01:00\n")
SCONTROL_DRAINED = SCONTROL_IDLE.replace("State=IDLE", "State=IDLE+DRAIN").replace(
    "Gres=gpu:rtx_a6000:2", "Gres=gpu:rtx_a6000:1").rstrip() + (
    " Reason=gpu count 1 < 2 [root@2026-11-23T05:00:00]\n")


def test_gpu_query_rows() -> None:
    rows = parsers.parse_gpu_query(NVIDIA_SMI_OK)
    assert [(r.index, r.name, r.driver, r.persistence, r.ecc_uncorrected) for r in rows] == [
        (0, "NVIDIA RTX A6000", "580.65.06", True, 0), (1, "NVIDIA RTX A6000", "580.65.06", True, 0)]
    (row,) = parsers.parse_gpu_query(NVIDIA_SMI_CONSUMER)
    assert row.ecc_uncorrected is None and not row.persistence


def test_gpu_query_recorded_on_an_h100() -> None:
    (row,) = parsers.parse_gpu_query((RECORDED / "nvidia-smi-gpu-query-h100.csv").read_text())
    assert (row.index, row.name, row.driver, row.persistence, row.ecc_uncorrected) == (
        0, "NVIDIA H100 80GB HBM3", "580.159.04", True, 0)


def test_gpu_query_refuses_an_error_message() -> None:
    with pytest.raises(ParseError, match="5 comma-separated"):
        parsers.parse_gpu_query(NVIDIA_SMI_DRIVER_GONE)


def test_xid_lines() -> None:
    log = ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.65.06\n"
           "NVRM: Xid (PCI:0000:4f:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
           "NVRM: Xid (PCI:0000:52:00): 48, pid=0, An uncorrectable double bit error\n")
    assert parsers.parse_xid(log) == [("0000:4f:00", 79), ("0000:52:00", 48)]
    assert parsers.parse_xid("") == []


def test_all_reduce_summary() -> None:
    assert parsers.parse_all_reduce(ALL_REDUCE) == parsers.AllReduce(24.1312, 0)
    assert parsers.parse_all_reduce(ALL_REDUCE_WRONG).out_of_bounds == 12
    with pytest.raises(ParseError, match="Avg bus bandwidth"):
        parsers.parse_all_reduce("gpu01: Test CUDA failure common.cu:892 'no CUDA-capable device is detected'\n")


def test_device_query_and_nccl_version() -> None:
    assert parsers.parse_device_query("devices 2\n") == 2
    with pytest.raises(ParseError, match="CUDA: no CUDA-capable device"):
        parsers.parse_device_query("error no CUDA-capable device is detected\n")
    assert parsers.parse_nccl_version("NCCL 2.21.5 (code 22105)\n") == "2.21.5"
    with pytest.raises(ParseError):
        parsers.parse_nccl_version("")


def test_ib_write_bw() -> None:
    assert parsers.parse_write_bw(IB_WRITE_BW) == parsers.WriteBw(100.0, 96.41)
    with pytest.raises(ParseError, match="rate"):
        parsers.parse_write_bw(IB_WRITE_BW.replace("rate=100 Gb/sec (4X EDR)\n", ""))
    with pytest.raises(ParseError, match="result row"):
        parsers.parse_write_bw("rate=100 Gb/sec (4X EDR)\n Couldn't connect to 10.0.3.2:18515\n")


def test_ping() -> None:
    ok = "PING 10.0.2.11 (10.0.2.11) 8972(9000) bytes of data.\n...\n3 packets transmitted, 3 received, 0% packet loss"
    assert parsers.parse_ping(ok) == parsers.Ping(3, 3, False)
    small = ("PING 10.0.2.11 (10.0.2.11) 8972(9000) bytes of data.\nping: local error: message too long, mtu=1500\n"
             "3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2041ms\n")
    assert parsers.parse_ping(small) == parsers.Ping(3, 0, True)
    with pytest.raises(ParseError):
        parsers.parse_ping("ping: connect: Network is unreachable\n")


def test_findmnt() -> None:
    text = ('{"filesystems": [{"source": "10.0.2.10:/tank/data", "fstype": "nfs4", '
            '"options": "rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp,nconnect=8"}]}')
    mnt = parsers.parse_findmnt(text)
    assert mnt is not None and mnt.fstype == "nfs4" and "nconnect=8" in mnt.options
    assert parsers.parse_findmnt("") is None
    with pytest.raises(ParseError):
        parsers.parse_findmnt("findmnt: unknown column")


def test_io() -> None:
    text = ("64+0 records in\n64+0 records out\n67108864 bytes (67 MB, 64 MiB) copied, 0.31 s, 216 MB/s\n"
            "write rc=0\n64+0 records in\n64+0 records out\n67108864 bytes (67 MB, 64 MiB) copied, 0.05 s, 1.3 GB/s\n"
            "read rc=0\n")
    assert parsers.parse_io(text) == parsers.DdRun(True, True, "216 MB/s", "1.3 GB/s")
    failed = "dd: failed to open '/data/x': Read-only file system\nwrite rc=1\ndd: failed to open\nread rc=1\n"
    assert parsers.parse_io(failed) == parsers.DdRun(False, False)


def test_zpool_status() -> None:
    ok = parsers.parse_zpool_status(ZPOOL_OK)
    assert (ok.state, ok.data_errors, ok.device_errors, ok.scan_errors) == ("ONLINE", False, 0, 0)
    bad = parsers.parse_zpool_status(ZPOOL_DEGRADED)
    assert (bad.state, bad.data_errors, bad.device_errors, bad.scan_errors) == ("DEGRADED", True, 1, 3)
    with pytest.raises(ParseError, match="state"):
        parsers.parse_zpool_status("cannot open 'tank': no such pool\n")


def test_scontrol_node() -> None:
    assert parsers.parse_scontrol_node(SCONTROL_IDLE) == parsers.SlurmNode("IDLE", "gpu:rtx_a6000:2", "")
    drained = parsers.parse_scontrol_node(SCONTROL_DRAINED)
    assert drained.state == "IDLE+DRAIN" and drained.reason == "gpu count 1 < 2 [root@2026-11-23T05:00:00]"
    with pytest.raises(ParseError):
        parsers.parse_scontrol_node("Node gpu09 not found\n")


def test_docker_runtimes() -> None:
    text = '{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}'
    assert parsers.parse_docker_runtimes(text) == {"io.containerd.runc.v2", "nvidia", "runc"}
    with pytest.raises(ParseError):
        parsers.parse_docker_runtimes("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")


def test_chrony_tracking() -> None:
    ok = parsers.parse_chrony_tracking(CHRONY_OK)
    assert ok.synchronised and ok.offset_s == pytest.approx(-0.000012345)
    bad = parsers.parse_chrony_tracking(CHRONY_UNSYNC)
    assert not bad.synchronised and bad.offset_s == pytest.approx(0.25)
    with pytest.raises(ParseError, match="chronyd"):
        parsers.parse_chrony_tracking("506 Cannot talk to daemon\n")


def test_hosts_and_context() -> None:
    hosts = parsers.parse_hosts("127.0.0.1 localhost\n10.0.0.10 head01.test head01 # the head\n")
    assert hosts.names["head01"] == {"10.0.0.10"} and "#" not in hosts.names
    assert parsers.parse_context("container=podman\ngpu_devices=0\n") == parsers.NodeContext("podman", 0)
    assert parsers.parse_context("container=none\ngpu_devices=8\n") == parsers.NodeContext("", 8)
    with pytest.raises(ParseError):
        parsers.parse_context("sh: systemd-detect-virt: not found\n")


def test_burn_lines() -> None:
    text = ("gpu 0 seconds=60.0 iterations=1530 errors=0 cpu_mismatch=0 gflops=41234 max_temp_c=71 "
            "max_power_w=412.3 slowdown=hw_slowdown watch=nvml\ngpu 1 error=an illegal memory access was "
            "encountered\nburn-in done gpus=2\n")
    g0, g1 = parsers.parse_burn(text)
    assert (g0.index, g0.iterations, g0.errors, g0.max_temp_c, g0.max_power_w, g0.slowdown, g0.watched) == (
        0, 1530, 0, 71, 412.3, ("hw_slowdown",), True)
    assert (g1.index, g1.error) == (1, "an illegal memory access was encountered")


def test_burn_recorded_on_an_h100() -> None:
    (row,) = parsers.parse_burn((RECORDED / "gpu-burn-h100.txt").read_text())
    assert (row.seconds, row.iterations, row.errors, row.cpu_mismatch, row.max_temp_c, row.slowdown) == (
        30.0, 3220, 0, 0, 74, ())
    assert row.watched and row.gflops == 59006 and row.max_power_w == 554.9


@pytest.mark.parametrize(("text", "message"), [
    ("gpu 0 seconds=60.0 iterations=1\n", "no 'burn-in done' line"),
    ("no usable GPU: 0 devices\n", "no usable GPU: 0 devices"),
    ("gpu 0 seconds=60.0 iterations=x errors=0\nburn-in done gpus=1\n", "unreadable burn-in line"),
    ("burn-in done gpus=1\n", "0 GPU lines for gpus=1"),
])
def test_burn_refuses_what_it_cannot_read(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parsers.parse_burn(text)
