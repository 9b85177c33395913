"""provisioner.verify.catalog: every area's checks, node by node, through the registry."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.nodecheck.check import Check, Command, Needs, Output, not_judged, skip_reason
from provisioner.nodecheck.parsers import NodeContext
from provisioner.verify import catalog


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
    assert node == ["hosts", "clock", "mtu.management", "mtu.data", "mount:/scratch", "io:/scratch"]


def test_a_nodes_checks_come_area_by_area_in_registry_order(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    node1 = names(catalog.plan(m), "node01")
    assert node1[:4] == ["hosts", "clock", "mtu.management", "mtu.data"]  # common
    first = {name: node1.index(name) for name in ("mount:/data", "gpu.count", "docker.runtime", "slurm.node")}
    assert first["mount:/data"] < first["gpu.count"] < first["docker.runtime"] < first["slurm.node"]


def test_checks_for_one_node_is_its_share_of_the_plan(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    node = m.node("node01")
    planned = names(catalog.plan(m), "node01")
    assert [c.name for c in catalog.checks_for(m, node)] == planned
    assert [c.name for c in catalog.checks_for(m, node, "", catalog.cluster_facts(m))] == planned


@pytest.mark.parametrize(("needs", "ctx", "why"), [
    ("kernel", NodeContext("podman", 0), "no kernel access (podman container)"),
    ("kernel", NodeContext("", 0), ""),
    ("gpu", NodeContext("podman", 0), "no GPU device in this podman container"),
    ("gpu", NodeContext("podman", 2), ""),  # devices handed to the container: it runs
    ("gpu", NodeContext("", 0), ""),  # bare metal without devices: runs and fails, never skips
    ("", NodeContext("docker", 0), ""),
])
def test_skip_reason(needs: Needs, ctx: NodeContext, why: str) -> None:
    check = Check("n", "c", Command("n", "true", 5), not_judged, needs)
    assert skip_reason(check, ctx) == why


def test_an_error_is_never_a_pass(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    for check in catalog.plan(m):
        if check.command is not None:
            out = check.judge(Output(rc=-1, error="timed out after 75 s (no answer from x)"))
            assert out.status == "FAIL" and "timed out" in out.detail, check.name
