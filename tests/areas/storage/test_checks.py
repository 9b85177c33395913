"""provisioner.areas.storage.checks: a problem is reported on the node that has to change."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from provisioner.errors import ManifestError
from provisioner.validate import load_text


def test_rdma_mount_error_names_the_client_without_infiniband(kit: Any) -> None:
    """Issue 18: adding a node without InfiniBand reported the RDMA-mount error on
    `nodes[0]: head01` (the NFS server, whose variables were computed first)."""
    data = kit.example("llm-200k.yaml")
    gpu05 = copy.deepcopy(data["nodes"][1])
    gpu05.update(name="gpu05", install_disks=["nvme-X"],
                 interfaces={"management": {"ip": "10.10.0.30", "mac": "3c:ec:ef:10:00:30", "interface": "eno1"}})
    gpu05["bmc"]["address"] = "10.10.1.30"
    data["nodes"].append(gpu05)
    text = kit.dump(data)
    with pytest.raises(ManifestError) as info:
        load_text(text, "m.yaml")
    (diag,) = [d for d in info.value.diagnostics if "infiniband" in d.message]
    assert diag.path == "nodes[2]"
    assert diag.line == kit.line_of(text, "name: gpu05")
    assert diag.message == "gpu05: mount /data: proto rdma but gpu05 has no infiniband interface"
