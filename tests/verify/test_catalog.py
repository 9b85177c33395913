"""provisioner.verify.catalog: which checks apply where, when they SKIP, how output is judged."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.verify import catalog
from provisioner.verify.catalog import Check, Output
from provisioner.verify.parsers import NodeContext


def names(checks: list[Check], node: str) -> list[str]:
    return [c.name for c in checks if c.node == node]


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def test_checks_follow_the_manifest(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    checks = catalog.plan(m)
    head = names(checks, "head01")
    assert head == ["hosts", "clock", "mtu.management", "mtu.data", "zfs:tank"]
    node1 = names(checks, "node01")
    for expected in ("gpu.count", "gpu.model", "gpu.driver", "gpu.persistence", "gpu.ecc", "gpu.xid", "cuda",
                     "nccl.version", "nccl.all_reduce", "mtu.data", "mount:/data", "io:/data", "mount:/union",
                     "io:/union", "slurm.node", "docker.runtime", "docker.gpu_run"):
        assert expected in node1, expected
    assert "fabricmanager" not in node1  # no NVSwitch
    assert "mount:/union" not in names(checks, "node02")  # the union is on node01 only
    assert "rdma.write_bw" not in node1  # no InfiniBand network
    # Slurm's view of a node is asked on the controller
    assert by_name(checks, "node01", "slurm.node").command.host == "head01"  # type: ignore[union-attr]
    # a limit keeps only those nodes
    assert {c.node for c in catalog.plan(m, ["node02"])} == {"node02"}


def test_no_gpu_no_slurm_no_docker_no_such_checks(kit: Any) -> None:
    data = kit.base()
    data["slurm"] = {"enabled": False}
    data["docker"] = {"enabled": False}
    del data["nodes"][1]["hardware"]["gpu"]
    m = kit.load(data).manifest
    node = names(catalog.plan(m), "node01")
    assert node == ["hosts", "clock", "mtu.management", "mtu.data"]


def test_nvswitch_floor_and_fabric_manager(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["hardware"]["gpu"] = {"model": "H100 SXM5", "count": 8, "nvswitch": True}
    data["verify"] = {"busbw_floor_gbps": {"nvswitch": 300}}
    m = kit.load(data).manifest
    checks = catalog.plan(m)
    assert "fabricmanager" in names(checks, "node01")
    assert catalog.busbw_floor(m, m.node("node01")) == ("nvswitch", 300.0)
    assert catalog.busbw_floor(kit.load(kit.base()).manifest, m.node("node01")) == ("nvswitch", 150.0)
    allreduce = by_name(checks, "node01", "nccl.all_reduce")
    assert "-g 8" in allreduce.command.text  # type: ignore[union-attr]
    slow = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 212.5\n"
    assert allreduce.judge(Output(stdout=slow)).status == "FAIL"
    fast = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 402.1\n"
    assert allreduce.judge(Output(stdout=fast)).status == "PASS"


def test_a_ring_of_peers_and_a_lonely_node(kit: Any) -> None:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    m = kit.load(data).manifest
    checks = catalog.plan(m)
    bw = by_name(checks, "node01", "rdma.write_bw")
    assert bw.skip == "" and bw.command is not None and bw.command.setup is not None
    assert bw.command.setup[0] == "node02" and "10.0.3.22" in bw.command.text
    ping = by_name(checks, "node02", "mtu.infiniband")
    assert "-s 2016" in ping.command.text and "10.0.3.21" in ping.command.text  # type: ignore[union-attr]
    # head01 has no InfiniBand interface: no such checks there
    assert "rdma.write_bw" not in names(checks, "head01")
    # one node alone on the fabric: the pair test applies but has no peer
    del data["nodes"][1]["interfaces"]["infiniband"]
    data["nodes"][0]["interfaces"]["infiniband"] = {"ip": "10.0.3.10", "interface": "ib0"}
    lonely = catalog.plan(kit.load(data).manifest)
    assert by_name(lonely, "head01", "rdma.write_bw").skip == "no other node on the infiniband network"
    assert by_name(lonely, "head01", "mtu.infiniband").skip == "no other node on the infiniband network"


def _fabric_pair(kit: Any) -> Check:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24"}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    return by_name(catalog.plan(kit.load(data).manifest), "node01", "rdma.write_bw")


@pytest.mark.parametrize(("fails", "status"), [(False, "PASS"), (True, "FAIL")])
def test_write_bw_client_runs_once_and_its_own_error_is_shown(kit: Any, tmp_path: Path, fails: bool,
                                                              status: str) -> None:
    """The client's shell text with a stand-in ib_write_bw: one run against the listening
    server (a failed run ended that server: no retries that could only say "cannot connect"),
    and a failure's own message in the verdict."""
    bw = _fabric_pair(kit)
    assert bw.command is not None
    fake = tmp_path / "ib_write_bw"
    fake.write_text("#!/bin/sh\n"
                    f"echo run >> {tmp_path}/runs\n"
                    f"if {'true' if fails else 'false'}; then echo ' Failed to modify QP to RTR' >&2; exit 1; fi\n"
                    "echo ' #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]'\n"
                    "echo ' 65536 1000 0.00 91.2 0.17'\n")
    fake.chmod(0o755)
    r = subprocess.run(["sh", "-c", bw.command.text], capture_output=True, text=True, timeout=30, check=False,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert r.returncode == (1 if fails else 0), r.stdout + r.stderr
    assert (tmp_path / "runs").read_text() == "run\n"
    verdict = bw.judge(Output(rc=r.returncode, stdout=r.stdout.replace("rate=", "rate=100 Gb/sec (4X EDR)", 1),
                              stderr=r.stderr))
    assert verdict.status == status, verdict
    assert ("Failed to modify QP to RTR" in verdict.detail) == fails


def _server_bin(tmp_path: Path, ib_write_bw: str) -> dict[str, str]:
    """A PATH with a stand-in ib_write_bw and an ss that shows a listener once it made one."""
    (tmp_path / "ib_write_bw").write_text(f"#!/bin/sh\n{ib_write_bw}\n")
    (tmp_path / "ss").write_text(f"#!/bin/sh\n[ -e {tmp_path}/listening ] && echo 'LISTEN 0 1 0.0.0.0:18515'\n"
                                 "exit 0\n")
    for f in ("ib_write_bw", "ss"):
        (tmp_path / f).chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_write_bw_server_returns_once_it_listens(kit: Any, tmp_path: Path) -> None:
    """The peer side returns when the server listens (here after a slow device open), not
    after a fixed pause, and leaves the server running for the client."""
    bw = _fabric_pair(kit)
    assert bw.command is not None and bw.command.setup is not None
    assert "-p 18515" in bw.command.setup[1] and "-p 18515" in bw.command.text
    env = _server_bin(tmp_path, f"echo \"$@\" > {tmp_path}/args; sleep 1; touch {tmp_path}/listening; sleep 2")
    r = subprocess.run(["sh", "-c", bw.command.setup[1]], capture_output=True, text=True, timeout=30, check=False,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "listening").exists()
    assert (tmp_path / "args").read_text().split() == ["--report_gbits", "-D", "3", "-p", "18515"]


@pytest.mark.parametrize(("server", "said"), [
    ("echo ' Failed to open device rxe0'; exit 1", "Failed to open device rxe0"),  # exits: said at once
    ("sleep 20", "after 2 s"),  # never listens: bounded
])
def test_write_bw_server_that_cannot_listen_fails_with_its_output(tmp_path: Path, server: str, said: str) -> None:
    env = _server_bin(tmp_path, server)
    r = subprocess.run(["sh", "-c", catalog.write_bw_server(wait_s=2)], capture_output=True, text=True,
                       timeout=30, check=False, env=env)
    assert r.returncode == 1
    assert "ib_write_bw server not listening on port 18515" in r.stderr and said in r.stderr


@pytest.mark.parametrize(("needs", "ctx", "why"), [
    ("kernel", NodeContext("podman", 0), "no kernel access (podman container)"),
    ("kernel", NodeContext("", 0), ""),
    ("gpu", NodeContext("podman", 0), "no GPU device in this podman container"),
    ("gpu", NodeContext("podman", 2), ""),  # devices handed to the container: it runs
    ("gpu", NodeContext("", 0), ""),  # bare metal without devices: runs and fails, never skips
    ("", NodeContext("docker", 0), ""),
])
def test_skip_reason(needs: catalog.Needs, ctx: NodeContext, why: str) -> None:
    check = Check("n", "c", catalog.Command("n", "true", 5), catalog._not_judged, needs)
    assert catalog.skip_reason(check, ctx) == why


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


def test_an_error_is_never_a_pass(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    for check in catalog.plan(m):
        if check.command is not None:
            out = check.judge(Output(rc=-1, error="timed out after 75 s (no answer from x)"))
            assert out.status == "FAIL" and "timed out" in out.detail, check.name


def test_a_roll_expects_its_own_drain_and_nothing_else(kit: Any) -> None:
    """`apply --rolling` verifies a node it drained itself: that drain passes, another
    drain (the health check's) and every other bad flag still fail; plain verify fails all."""
    m = kit.load(kit.base()).manifest
    ours = ("NodeName=node01 Gres=gpu:rtx_a6000:2 State=IDLE+DRAIN "
            "Reason=provision apply --rolling [root@2026-11-23T09:00:00]")
    rolling = by_name(catalog.plan(m, ["node01"], drained_by="provision apply --rolling"), "node01", "slurm.node")
    assert rolling.judge(Output(stdout=ours)) == catalog.Outcome(
        "PASS", "IDLE+DRAIN (provision apply --rolling: resumed after verify), gpu:rtx_a6000:2")
    assert rolling.judge(Output(stdout=ours.replace("State=IDLE", "State=MIXED"))).status == "PASS"
    theirs = ours.replace("provision apply --rolling", "gpu count 1 < 2")
    assert rolling.judge(Output(stdout=theirs)).detail == (
        "state IDLE+DRAIN (gpu count 1 < 2 [root@2026-11-23T09:00:00])")
    down = ours.replace("State=IDLE+DRAIN", "State=DOWN+DRAIN+NOT_RESPONDING")
    assert rolling.judge(Output(stdout=down)).status == "FAIL"
    short = ours.replace("gpu:rtx_a6000:2", "gpu:rtx_a6000:1")
    assert rolling.judge(Output(stdout=short)).detail == "Gres gpu:rtx_a6000:1, manifest says gpu:rtx_a6000:2"
    plain = by_name(catalog.plan(m, ["node01"]), "node01", "slurm.node")
    assert plain.judge(Output(stdout=ours)).status == "FAIL"


def test_storage_slurm_clock_hosts_verdicts(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    checks = catalog.plan(m)
    mount = by_name(checks, "node01", "mount:/data")
    good = ('{"filesystems": [{"source": "10.0.2.10:/tank/data", "fstype": "nfs4", "options": '
            '"rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp,nconnect=8,port=0"}]}')
    assert mount.judge(Output(stdout=good)).status == "PASS"
    soft = good.replace(",hard,", ",soft,").replace("nconnect=8", "nconnect=1")
    assert mount.judge(Output(stdout=soft)).detail == "/data lacks nconnect=8, hard"
    assert mount.judge(Output(stdout="")).detail == "/data is not mounted"
    # rsize/wsize are settled with the server and the transport: less than asked is reported,
    # more than asked (or none) is not what the unit asked for
    small = good.replace("rsize=1048576,wsize=1048576", "rsize=131072,wsize=262144")
    assert mount.judge(Output(stdout=small)) == catalog.Outcome(
        "PASS", "nfs4 from 10.0.2.10:/tank/data (rsize=131072, wsize=262144: the most the server and "
        "transport offer)")
    big = good.replace("rsize=1048576", "rsize=2097152")
    assert mount.judge(Output(stdout=big)).detail == "/data lacks rsize=1048576"
    none = good.replace("wsize=1048576,", "")
    assert mount.judge(Output(stdout=none)).detail == "/data lacks wsize=1048576"
    local = good.replace('"nfs4"', '"ext4"')
    assert mount.judge(Output(stdout=local)).status == "FAIL"
    union = by_name(checks, "node01", "mount:/union")
    assert union.judge(Output(stdout='{"filesystems": [{"source": "data:scratch", "fstype": "fuse.mergerfs", '
                                     '"options": "rw,relatime"}]}')).status == "PASS"
    pool = by_name(checks, "head01", "zfs:tank")
    assert pool.judge(Output(stdout="  pool: tank\n state: ONLINE\nerrors: No known data errors\n")).status == "PASS"
    assert pool.judge(Output(stdout="  pool: tank\n state: FAULTED\nerrors: No known data errors\n")).detail == (
        "tank: state FAULTED")
    slurm = by_name(checks, "node01", "slurm.node")
    assert slurm.judge(Output(stdout="NodeName=node01 Gres=gpu:rtx_a6000:2 State=MIXED Partitions=batch")).status == (
        "PASS")
    assert slurm.judge(Output(stdout="NodeName=node01 Gres=gpu:rtx_a6000:1 State=IDLE")).detail == (
        "Gres gpu:rtx_a6000:1, manifest says gpu:rtx_a6000:2")
    drained = "NodeName=node01 Gres=gpu:rtx_a6000:2 State=IDLE+DRAIN Reason=bad gpu"
    assert slurm.judge(Output(stdout=drained)).detail == "state IDLE+DRAIN (bad gpu)"
    down = "NodeName=node01 Gres=gpu:rtx_a6000:2 State=DOWN+NOT_RESPONDING"
    assert slurm.judge(Output(stdout=down)).status == "FAIL"
    clock = by_name(checks, "node01", "clock")
    near = "System time     : 0.000200000 seconds fast of NTP time\nLeap status     : Normal\n"
    assert clock.judge(Output(stdout=near)) == catalog.Outcome("PASS", "offset +0.200 ms")
    far = near.replace("0.000200000", "0.500000000")
    assert clock.judge(Output(stdout=far)).detail == "offset +500.0 ms, limit 100 ms"
    no_daemon = clock.judge(Output(rc=1, stderr="506 Cannot talk to daemon\n"))
    assert no_daemon.detail.endswith("(506 Cannot talk to daemon)")
    hosts = by_name(checks, "node01", "hosts")
    full = "10.0.0.10 head01.test.internal head01\n10.0.0.21 node01.test.internal node01\n" \
           "10.0.0.22 node02.test.internal node02\n"
    assert hosts.judge(Output(stdout=full)) == catalog.Outcome("PASS", "3 nodes")
    assert hosts.judge(Output(stdout=full.replace("10.0.0.22", "10.0.0.99"))).detail == (
        "/etc/hosts lacks node02, node02.test.internal")
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
    assert catalog.model_matches("RTX A6000", "NVIDIA RTX A6000")
    assert catalog.model_matches("GeForce RTX 3090", "NVIDIA GeForce RTX 3090")
    assert catalog.model_matches("H100", "NVIDIA H100 80GB HBM3")
    assert not catalog.model_matches("A100", "NVIDIA H100 80GB HBM3")
    assert not catalog.model_matches("RTX A6000", "NVIDIA RTX A5000")


def test_write_bw_and_ping_verdicts() -> None:
    bw = catalog.write_bw_verdict(0.75)
    from_rate = catalog.parsers.WriteBw
    assert bw(from_rate(100, 96.4)).status == "PASS"
    assert bw(from_rate(100, 60.0)).detail == "60 Gb/s, below 0.75 of the 100 Gb/s link"
    ping = catalog.ping_verdict(9000, "node02")
    assert ping(catalog.parsers.Ping(3, 0, True)).status == "FAIL"
    assert ping(catalog.parsers.Ping(3, 0, False)).detail == "no answer from node02 at MTU 9000"
    assert ping(catalog.parsers.Ping(3, 3, False)).status == "PASS"


def test_io_verdict(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    io = by_name(catalog.plan(m), "node01", "io:/data")
    assert ".provision-verify-node01" in io.command.text  # type: ignore[union-attr]
    assert io.judge(Output(stdout="write rc=1\nread rc=1\n")).detail == "cannot write 64 MiB under /data"
    assert io.judge(Output(stdout="write rc=0\nread rc=1\n")).detail == "cannot read back 64 MiB under /data"


# --------------------------------------------------------------------------- GPU fencing
GPU_LIST_ONE = "GPU 0: NVIDIA RTX A6000 (UUID: GPU-5f3c2a1e-8d4b-4c1e-9a7f-0b1c2d3e4f50)\n"
GPU_LIST_TWO = GPU_LIST_ONE + "GPU 1: NVIDIA RTX A6000 (UUID: GPU-6a4d3b2f-9e5c-4d2f-8b8a-1c2d3e4f5061)\n"


def test_gpu_fence_runs_a_one_gpu_job_from_the_head(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    fence = by_name(catalog.plan(m), "node01", "slurm.gpu_fence")
    assert fence.command is not None and fence.needs == "gpu" and fence.command.host == "head01"
    assert fence.command.text.startswith("srun -w node01 -N 1 -n 1 --gres=gpu:1 ")
    assert "--immediate=30" in fence.command.text and fence.command.text.endswith("nvidia-smi -L")
    assert fence.judge(Output(stdout=GPU_LIST_ONE)) == catalog.Outcome("PASS", "a --gres=gpu:1 job sees 1 of 2 GPUs")
    assert fence.judge(Output(stdout=GPU_LIST_TWO)) == catalog.Outcome(
        "FAIL", "a --gres=gpu:1 job sees 2 of 2 GPUs: devices are not fenced (cgroup.conf ConstrainDevices)")
    assert fence.judge(Output(stdout="")).detail == "a --gres=gpu:1 job sees no GPU"
    busy = Output(rc=1, stderr="srun: error: Unable to allocate resources: Immediate execution impossible\n")
    assert fence.judge(busy).status == "SKIP" and "no GPU of node01 was free within 30 s" in fence.judge(busy).detail
    down = Output(rc=1, stderr="srun: error: Unable to create step for job 12: Requested nodes are busy\n"
                               "srun: error: node01: task 0: Exited with exit code 1\n")
    assert fence.judge(down).status == "FAIL" and "did not run" in fence.judge(down).detail
    # an allocation refused for another reason (GRES the node does not have) is a failure
    misfit = Output(rc=1, stderr="srun: error: Unable to allocate resources: Requested node configuration is "
                                 "not available\n")
    assert fence.judge(misfit).status == "FAIL" and "did not run" in fence.judge(misfit).detail
    assert fence.judge(Output(rc=-1, error="timed out after 90 s on head01")).status == "FAIL"
    # a container without GPU device files cannot run it
    ctx = NodeContext(container="podman", gpu_devices=0)
    assert catalog.skip_reason(fence, ctx) == "no GPU device in this podman container"


def test_gpu_fence_is_skipped_where_nothing_can_be_fenced(kit: Any) -> None:
    data = kit.base()
    rolling = catalog.plan(kit.load(data).manifest, ["node01"], drained_by="provision apply --rolling")
    assert by_name(rolling, "node01", "slurm.gpu_fence").skip.startswith("drained by provision apply --rolling")
    data["nodes"][1]["hardware"]["gpu"]["count"] = 1
    assert by_name(catalog.plan(kit.load(data).manifest), "node01", "slurm.gpu_fence").skip == (
        "one GPU: nothing to fence a job from")
    data = kit.base()
    data["slurm"]["constrain_devices"] = False
    assert by_name(catalog.plan(kit.load(data).manifest), "node01", "slurm.gpu_fence").skip == (
        "slurm.constrain_devices is off in the manifest")
    data = kit.base()
    for node in data["nodes"]:  # Slurm 21.08 on cgroup v2: validate warns, nothing is fenced
        node["os"] = "ubuntu-22.04"
    skip = by_name(catalog.plan(kit.load(data).manifest), "node01", "slurm.gpu_fence").skip
    assert "cannot fence devices" in skip, skip
    # nodes without GPUs have no such check
    assert "slurm.gpu_fence" not in names(catalog.plan(kit.load(kit.base()).manifest), "head01")


# --------------------------------------------------------------------------- multi-node NCCL
# all_reduce_perf (MPI build) under `srun -N 2 --ntasks-per-node=1 --mpi=pmix`, as rank 0 prints it
ALL_REDUCE_TWO_NODES = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1
#
# Using devices
#  Rank  0 Group  0 Pid  51220 on     node01 device  0 [0x4f] NVIDIA RTX A6000
#  Rank  1 Group  0 Pid  51220 on     node01 device  1 [0x52] NVIDIA RTX A6000
#  Rank  2 Group  0 Pid  48711 on     node02 device  0 [0x4f] NVIDIA RTX A6000
#  Rank  3 Group  0 Pid  48711 on     node02 device  1 [0x52] NVIDIA RTX A6000
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
   134217728      33554432     float     sum      -1    14630    9.17   13.76      0    14621    9.18   13.77      0
   268435456      67108864     float     sum      -1    29204    9.19   13.79      0    29198    9.19   13.79      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 6.8834
#
"""


def test_multi_node_nccl_pairs_gpu_nodes_through_slurm(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    checks = catalog.plan(m)
    one, two = by_name(checks, "node01", "nccl.multi_node"), by_name(checks, "node02", "nccl.multi_node")
    assert one.command is not None and two.command is not None
    assert one.needs == "gpu" and one.command.host == "head01"  # Slurm starts it from the controller
    assert one.command.text.startswith("srun -w node01,node02 -N 2 --ntasks-per-node=1 --gres=gpu:2 --mpi=pmix "
                                       "-t 5 --immediate=60 sh -c ")
    assert "/opt/nccl-tests/*/build-mpi/all_reduce_perf" in one.command.text
    assert one.command.text.endswith(" sh -b 8 -e 256M -f 2 -g 2")
    assert two.command.text.startswith("srun -w node02,node01 ")  # a ring: the last pairs with the first
    assert "nccl.multi_node" not in names(checks, "head01")
    # no InfiniBand: NCCL over sockets, the ethernet floor
    assert one.judge(Output(stdout=ALL_REDUCE_TWO_NODES)) == catalog.Outcome(
        "PASS", "6.8834 GB/s (floor 0.5, ethernet between node01 and node02)")
    slow = ALL_REDUCE_TWO_NODES.replace("6.8834", "0.3121")
    assert one.judge(Output(stdout=slow)) == catalog.Outcome(
        "FAIL", "bus bandwidth 0.3121 GB/s below the ethernet between node01 and node02 floor 0.5 GB/s")
    wrong = ALL_REDUCE_TWO_NODES.replace("values : 0 OK", "values : 3 FAILED")
    assert one.judge(Output(stdout=wrong)) == catalog.Outcome("FAIL", "3 wrong results")
    busy = Output(rc=1, stderr="srun: error: Unable to allocate resources: Immediate execution impossible\n")
    assert one.judge(busy) == catalog.Outcome("SKIP", "the GPUs of node01 and node02 were not free within 60 s "
                                                      "(jobs hold them)")
    # PMIx missing, a rank crashing, NCCL failing: failures, never a SKIP
    no_pmix = Output(rc=1, stderr="srun: error: Couldn't find the specified plugin name for mpi/pmix looking at "
                                  "all files\nsrun: error: MPI: Cannot create context for mpi/pmix\n")
    assert one.judge(no_pmix) == catalog.Outcome("FAIL", "the two-node job did not run (srun: error: MPI: Cannot "
                                                         "create context for mpi/pmix)")
    nccl_error = Output(rc=1, stdout="node02: Test NCCL failure common.cu:1005 'unhandled system error'\n",
                        stderr="srun: error: node02: task 1: Exited with exit code 2\n")
    assert one.judge(nccl_error).status == "FAIL"
    assert one.judge(Output(rc=-1, error="timed out after 420 s on head01")).status == "FAIL"
    assert catalog.skip_reason(one, NodeContext(container="podman", gpu_devices=0)) == (
        "no GPU device in this podman container")


def test_multi_node_nccl_floor_follows_the_fabric_and_the_manifest(kit: Any) -> None:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24", "rdma": True}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).detail == (
        "6.8834 GB/s (floor 5, rdma between node01 and node02)")
    data["verify"] = {"multi_node_busbw_floor_gbps": {"rdma": 20}}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).status == "FAIL"
    # pairs of unequal nodes use the GPUs both have
    data = kit.base()
    data["nodes"][1]["name"] = "node01"
    data["nodes"].append({**data["nodes"][1], "name": "node02",
                          "interfaces": {"management": {"ip": "10.0.0.22", "mac": "52:54:00:00:00:22",
                                                        "interface": "eno1"},
                                         "data": {"ip": "10.0.2.22", "interface": "ens1"}},
                          "bmc": {**data["nodes"][1]["bmc"], "address": "10.0.1.22"},
                          "hardware": {**data["nodes"][1]["hardware"], "gpu": {"model": "RTX A6000", "count": 4}}})
    check = by_name(catalog.plan(kit.load(data).manifest), "node02", "nccl.multi_node")
    assert check.command is not None and "--gres=gpu:2 " in check.command.text and check.command.text.endswith("-g 2")


def test_multi_node_nccl_needs_a_partner_and_an_undrained_node(kit: Any) -> None:
    data = kit.base()
    data["nodes"][1]["name"] = "node01"  # one GPU compute node
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.command is None and check.skip == "no other GPU compute node to pair with"
    rolling = catalog.plan(kit.load(kit.base()).manifest, ["node01"], drained_by="provision apply --rolling")
    assert by_name(rolling, "node01", "nccl.multi_node").skip.startswith("drained by provision apply --rolling")
    data = kit.base()
    data["slurm"] = {"enabled": False}
    assert "nccl.multi_node" not in names(catalog.plan(kit.load(data).manifest), "node01")  # Slurm starts it


BURN_OK = ("gpu 0 seconds=60.0 iterations=1530 errors=0 cpu_mismatch=0 gflops=41234 max_temp_c=71 "
           "max_power_w=412.3 slowdown=none watch=nvml\n"
           "gpu 1 seconds=60.0 iterations=1529 errors=0 cpu_mismatch=0 gflops=41200 max_temp_c=69 "
           "max_power_w=405.0 slowdown=none watch=nvml\nburn-in done gpus=2\n")


def test_burn_in_is_planned_only_when_asked(kit: Any) -> None:
    assert "gpu.burn" not in names(catalog.plan(kit.load(kit.base()).manifest), "node01")
    data = kit.base()
    data["verify"] = {"burn_in_s": 600}
    checks = catalog.plan(kit.load(data).manifest)
    burn = by_name(checks, "node01", "gpu.burn")
    assert burn.needs == "gpu" and burn.command is not None
    assert burn.command.timeout == 600 + catalog.BURN_BUILD_S
    assert burn.command.text.endswith('"$d/burn" 600') and "__global__ void burn" in burn.command.text
    assert "gpu.burn" not in names(checks, "head01")  # no GPUs there


@pytest.mark.parametrize(("stdout", "status", "detail"), [
    (BURN_OK, "PASS", "2 GPUs, 60 s, 0 errors, >= 41200 GFLOP/s each, max 71 C"),
    (BURN_OK.replace("errors=0 cpu_mismatch=0 gflops=41200", "errors=3 cpu_mismatch=0 gflops=41200"),
     "FAIL", "GPU 1 3 wrong results"),
    (BURN_OK.replace("cpu_mismatch=0 gflops=41234", "cpu_mismatch=2 gflops=41234"),
     "FAIL", "GPU 0 2 results differ from the CPU's"),
    (BURN_OK.replace("slowdown=none watch=nvml\ngpu 1", "slowdown=hw_thermal,sw_thermal watch=nvml\ngpu 1"),
     "FAIL", "GPU 0 slowed down (hw_thermal, sw_thermal)"),
    (BURN_OK.replace("max_temp_c=69", "max_temp_c=88"), "FAIL", "GPU 1 reached 88 C (limit 87)"),
    (BURN_OK.replace("seconds=60.0 iterations=1529", "seconds=20.5 iterations=1529"),
     "FAIL", "GPU 1 stopped after 20.5 s of 60"),
    (BURN_OK.replace("watch=nvml", "watch=none").replace("max_temp_c=71", "max_temp_c=-1"),
     "PASS", "2 GPUs, 60 s, 0 errors, >= 41200 GFLOP/s each, temperatures not watched (no NVML)"),
    ("gpu 0 error=out of memory\nburn-in done gpus=1\n", "FAIL", "1 GPUs ran, manifest says 2"),
    ("no usable GPU: no CUDA-capable device is detected\n", "FAIL",
     "no usable GPU: no CUDA-capable device is detected (exit 2)"),
])
def test_burn_verdict(kit: Any, stdout: str, status: str, detail: str) -> None:
    data = kit.base()
    data["verify"] = {"burn_in_s": 60}
    burn = by_name(catalog.plan(kit.load(data).manifest), "node01", "gpu.burn")
    outcome = burn.judge(Output(stdout=stdout, rc=2 if stdout.startswith("no usable") else 0))
    assert (outcome.status, outcome.detail) == (status, detail)
