"""provisioner.areas.storage.fabric: the opensm node, IPoIB, nvidia-peermem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from provisioner.areas.storage import fabric
from provisioner.manifest import Manifest

ROOT = Path(__file__).resolve().parents[3]
HGST = "ata-HGST_HUS726T6TALE6L4_V8G0000"


# =========================================================================== fabric
def test_opensm_node(llm: Manifest, kit: Any) -> None:
    assert fabric.opensm_node(llm) is None  # subnet_manager: switch
    data = kit.example("llm-200k.yaml")
    data["networks"]["infiniband"]["subnet_manager"] = "opensm"
    assert fabric.opensm_node(kit.load(data).manifest) == "head01"
    del data["nodes"][0]["interfaces"]["infiniband"]
    data["nfs"] = {}  # its exports serve the fabric, which head01 is no longer on
    assert fabric.opensm_node(kit.load(data).manifest) == "gpu01"


def test_ipoib_and_peermem(llm: Manifest, lab: Manifest) -> None:
    assert fabric.ipoib_config(llm, llm.node("gpu03")) == {
        "interface": "ibp65s0", "address": "10.10.2.23/24", "mtu": 2044, "mode": "datagram"
    }
    assert fabric.wants_peermem(llm, llm.node("gpu03"))
    assert not fabric.wants_peermem(llm, llm.node("head01"))  # no GPU
    assert fabric.ipoib_config(lab, lab.node("gpu1")) == {}
    assert not fabric.wants_peermem(lab, lab.node("gpu1"))  # no fabric
