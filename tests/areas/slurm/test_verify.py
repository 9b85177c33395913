"""provisioner.areas.slurm.verify: a compute node's Slurm state, GPU fencing, NCCL between two
nodes through srun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas.slurm import verify
from provisioner.nodecheck.check import Check, Outcome, Output, skip_reason
from provisioner.nodecheck.parsers import NodeContext, ParseError
from provisioner.verify import catalog


def names(checks: list[Check], node: str) -> list[str]:
    return [c.name for c in checks if c.node == node]


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def test_a_roll_expects_its_own_drain_and_nothing_else(kit: Any) -> None:
    """`apply --rolling` verifies a node it drained itself: that drain passes, another
    drain (the health check's) and every other bad flag still fail; plain verify fails all."""
    m = kit.load(kit.base()).manifest
    ours = ("NodeName=node01 Gres=gpu:rtx_a6000:2 State=IDLE+DRAIN "
            "Reason=provision apply --rolling [root@2026-11-23T09:00:00]")
    rolling = by_name(catalog.plan(m, ["node01"], drained_by="provision apply --rolling"), "node01", "slurm.node")
    assert rolling.judge(Output(stdout=ours)) == Outcome(
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


def test_slurm_node_verdicts(kit: Any) -> None:
    checks = catalog.plan(kit.load(kit.base(storage=True)).manifest)
    slurm = by_name(checks, "node01", "slurm.node")
    assert slurm.judge(Output(stdout="NodeName=node01 Gres=gpu:rtx_a6000:2 State=MIXED Partitions=batch")).status == (
        "PASS")
    assert slurm.judge(Output(stdout="NodeName=node01 Gres=gpu:rtx_a6000:1 State=IDLE")).detail == (
        "Gres gpu:rtx_a6000:1, manifest says gpu:rtx_a6000:2")
    drained = "NodeName=node01 Gres=gpu:rtx_a6000:2 State=IDLE+DRAIN Reason=bad gpu"
    assert slurm.judge(Output(stdout=drained)).detail == "state IDLE+DRAIN (bad gpu)"
    down = "NodeName=node01 Gres=gpu:rtx_a6000:2 State=DOWN+NOT_RESPONDING"
    assert slurm.judge(Output(stdout=down)).status == "FAIL"


# --------------------------------------------------------------------------- GPU fencing
GPU_LIST_ONE = "GPU 0: NVIDIA RTX A6000 (UUID: GPU-5f3c2a1e-8d4b-4c1e-9a7f-0b1c2d3e4f50)\n"
GPU_LIST_TWO = GPU_LIST_ONE + "GPU 1: NVIDIA RTX A6000 (UUID: GPU-6a4d3b2f-9e5c-4d2f-8b8a-1c2d3e4f5061)\n"


def test_gpu_fence_runs_a_one_gpu_job_from_the_head(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    fence = by_name(catalog.plan(m), "node01", "slurm.gpu_fence")
    assert fence.command is not None and fence.needs == "gpu" and fence.command.host == "head01"
    assert fence.command.text.startswith("srun -w node01 -N 1 -n 1 --gres=gpu:1 ")
    assert "--immediate=30" in fence.command.text and fence.command.text.endswith("nvidia-smi -L")
    assert fence.judge(Output(stdout=GPU_LIST_ONE)) == Outcome("PASS", "a --gres=gpu:1 job sees 1 of 2 GPUs")
    assert fence.judge(Output(stdout=GPU_LIST_TWO)) == Outcome(
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
    assert skip_reason(fence, ctx) == "no GPU device in this podman container"


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
    assert one.judge(Output(stdout=ALL_REDUCE_TWO_NODES)) == Outcome(
        "PASS", "6.8834 GB/s (floor 0.5, ethernet between node01 and node02)")
    slow = ALL_REDUCE_TWO_NODES.replace("6.8834", "0.3121")
    assert one.judge(Output(stdout=slow)) == Outcome(
        "FAIL", "bus bandwidth 0.3121 GB/s below the ethernet between node01 and node02 floor 0.5 GB/s")
    wrong = ALL_REDUCE_TWO_NODES.replace("values : 0 OK", "values : 3 FAILED")
    assert one.judge(Output(stdout=wrong)) == Outcome("FAIL", "3 wrong results")
    busy = Output(rc=1, stderr="srun: error: Unable to allocate resources: Immediate execution impossible\n")
    assert one.judge(busy) == Outcome("SKIP", "the GPUs of node01 and node02 were not free within 60 s "
                                                      "(jobs hold them)")
    # PMIx missing, a rank crashing, NCCL failing: failures, never a SKIP
    no_pmix = Output(rc=1, stderr="srun: error: Couldn't find the specified plugin name for mpi/pmix looking at "
                                  "all files\nsrun: error: MPI: Cannot create context for mpi/pmix\n")
    assert one.judge(no_pmix) == Outcome("FAIL", "the two-node job did not run (srun: error: MPI: Cannot "
                                                         "create context for mpi/pmix)")
    nccl_error = Output(rc=1, stdout="node02: Test NCCL failure common.cu:1005 'unhandled system error'\n",
                        stderr="srun: error: node02: task 1: Exited with exit code 2\n")
    assert one.judge(nccl_error).status == "FAIL"
    assert one.judge(Output(rc=-1, error="timed out after 420 s on head01")).status == "FAIL"
    assert skip_reason(one, NodeContext(container="podman", gpu_devices=0)) == (
        "no GPU device in this podman container")


def test_multi_node_nccl_floor_follows_the_fabric_and_the_manifest(kit: Any) -> None:
    data = kit.base()
    data["networks"]["infiniband"] = {"cidr": "10.0.3.0/24", "rdma": True}
    data["nodes"][1]["interfaces"]["infiniband"] = {"ip": "10.0.3.21", "interface": "ib0"}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).detail == (
        "6.8834 GB/s (floor 5, infiniband between node01 and node02)")
    data["verify"] = {"multi_node_busbw_floor_gbps": {"rdma": 20}}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).status == "FAIL"
    data["verify"] = {"multi_node_busbw_floor_gbps": {"rdma": 20, "infiniband": 6}}  # the fabric's own wins
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).detail.startswith("6.8834 GB/s (floor 6, infiniband")
    # RoCE: its own floor, else rdma's, else the default; InfiniBand first where both are shared
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "mtu": 9000}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0"}  # node[01-02]
    data["verify"] = {"multi_node_busbw_floor_gbps": {"roce": 3}}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert "(floor 5, infiniband between" in check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).detail
    del data["networks"]["infiniband"], data["nodes"][1]["interfaces"]["infiniband"]
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert "(floor 3, roce between node01 and node02)" in check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).detail
    data["verify"] = {"multi_node_busbw_floor_gbps": {"rdma": 7}}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).status == "FAIL"
    data["networks"]["roce"]["rdma"] = False  # RoCE NICs without RDMA: NCCL over sockets
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "nccl.multi_node")
    assert "(floor 0.5, ethernet between" in check.judge(Output(stdout=ALL_REDUCE_TWO_NODES)).detail
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


# --------------------------------------------------------------------------- parsers
SCONTROL_IDLE = ("NodeName=gpu01 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUEfctv=32 CPUTot=32 CPULoad=0.01 "
                 "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:rtx_a6000:2 NodeAddr=gpu01 "
                 "NodeHostName=gpu01 Version=22.05.8 OS=Linux RealMemory=250000 AllocMem=0 FreeMem=240000 "
                 "Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
                 "Partitions=batch BootTime=2026-11-22T10:00:00 SlurmdStartTime=2026-11-22T10:01:00\n")


SCONTROL_DRAINED = SCONTROL_IDLE.replace("State=IDLE", "State=IDLE+DRAIN").replace(
    "Gres=gpu:rtx_a6000:2", "Gres=gpu:rtx_a6000:1").rstrip() + (
    " Reason=gpu count 1 < 2 [root@2026-11-23T05:00:00]\n")


def test_scontrol_node() -> None:
    assert verify.parse_scontrol_node(SCONTROL_IDLE) == verify.SlurmNode("IDLE", "gpu:rtx_a6000:2", "")
    drained = verify.parse_scontrol_node(SCONTROL_DRAINED)
    assert drained.state == "IDLE+DRAIN" and drained.reason == "gpu count 1 < 2 [root@2026-11-23T05:00:00]"
    with pytest.raises(ParseError):
        verify.parse_scontrol_node("Node gpu09 not found\n")


# --------------------------------------------------------------------------- slurm.ssh_adopt (issue 29 item 3)
DATA = Path(__file__).parent / "data"
TASKS = Path(__file__).resolve().parents[3] / "roles" / "slurm" / "tasks" / "ssh_adopt.yml"


def role_edits(answer: str) -> str:
    """``answer`` (the check's command on a fresh Debian 12 node) as it reads once the role's
    ssh_adopt.yml ran: its block after ``@include common-account``, its session include, the
    package's module and slurm.conf's PrologFlags. Taken from the task file, so the check and
    the role cannot drift apart."""
    tasks = {t["name"]: t for t in yaml.safe_load(TASKS.read_text())}
    block = next(t["ansible.builtin.blockinfile"] for t in tasks.values() if "ansible.builtin.blockinfile" in t)
    session = tasks["No pam_systemd in sshd's session stack (it conflicts with pam_slurm_adopt)"]
    text = block["block"].replace("{{ slurm_ssh_access_file }}", "/etc/security/access-slurm-adopt.conf")
    out = answer.replace("@include common-account\n", "@include common-account\n" + text, 1)
    out = out.replace("@include common-session\n", session["ansible.builtin.lineinfile"]["line"] + "\n", 1)
    out = out.replace("==> module\n", "==> module\n/lib/security/pam_slurm_adopt.so\n")
    return out.replace("==> prologflags\n", "==> prologflags\nPrologFlags             = Alloc,Contain\n")


def test_ssh_adopt_runs_on_compute_nodes_that_adopt_only(kit: Any) -> None:
    data = kit.base()
    assert "slurm.ssh_adopt" not in names(catalog.plan(kit.load(data).manifest, ["node01"]), "node01")
    data["users"] = [{"name": "alice", "uid": 2001}]
    checks = catalog.plan(kit.load(data).manifest, ["node01", "head01"])
    check = by_name(checks, "node01", "slurm.ssh_adopt")
    assert check.command is not None and check.command.host == "node01"  # on the node itself
    assert "slurm.ssh_adopt" not in names(checks, "head01")


def test_ssh_adopt_fails_on_a_fresh_node_and_passes_once_the_role_ran() -> None:
    fresh = (DATA / "pam-sshd-debian-12.txt").read_text()
    outcome = verify.adopt_verdict(verify.parse_sections(fresh))
    assert outcome.status == "FAIL"
    assert outcome.detail.split("; ") == [
        "sshd's account stack ends with requisite pam_deny.so, required pam_permit.so, not sufficient "
        "pam_access.so then required pam_slurm_adopt.so",
        "pam_systemd.so is in sshd's session stack: it moves adopted sessions out of the job's cgroup",
        "pam_slurm_adopt.so is not installed",
        "slurm.conf has no PrologFlags=Contain (no PrologFlags): no extern step to adopt into"]
    passed = Outcome("PASS", "SSH: admins (pam_access), then only users with a job here (pam_slurm_adopt)")
    assert verify.adopt_verdict(verify.parse_sections(role_edits(fresh))) == passed
    # what the role left on the molecule scenario's compute node
    recorded = (DATA / "pam-sshd-debian-12-adopted.txt").read_text()
    assert verify.adopt_verdict(verify.parse_sections(recorded)) == passed


def test_ssh_adopt_follows_includes_and_names_what_is_missing() -> None:
    adopted = role_edits((DATA / "pam-sshd-debian-12.txt").read_text())
    # pam_systemd in the included file reaches sshd's stack
    back = adopted.replace("pam_unix.so \n# end of pam-auth-update", "pam_unix.so \nsession optional pam_systemd.so\n"
                           "# end of pam-auth-update", 1)
    assert "pam_systemd.so is in sshd's session stack" in verify.adopt_verdict(verify.parse_sections(back)).detail
    # the admins' rule after pam_slurm_adopt: order matters
    access = "account    sufficient   pam_access.so accessfile=/etc/security/access-slurm-adopt.conf\n"
    adopt = "account    required     pam_slurm_adopt.so\n"
    swapped = adopted.replace(access + adopt, adopt + access)
    assert swapped != adopted
    assert verify.adopt_verdict(verify.parse_sections(swapped)).detail.startswith(
        "sshd's account stack ends with required pam_slurm_adopt.so, sufficient pam_access.so")
    no_file = adopted.replace(" accessfile=/etc/security/access-slurm-adopt.conf", "")
    assert verify.adopt_verdict(verify.parse_sections(no_file)).detail == (
        "sshd's pam_access.so has no accessfile= (the admins' rules)")
    with pytest.raises(ParseError, match=r"no /etc/pam\.d/sshd"):
        verify.parse_sections("==> module\n")
    with pytest.raises(ParseError, match="not a PAM rule"):
        verify.pam_stack({"sshd": ["account"]}, "sshd")
