"""`provision bmc ... --json`: one row per node, null where the table says "-" or unknown."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioner.bmc.ops import BmcRow
from provisioner.cli import main
from provisioner.commands import bmc as bmc_cmd

Capsys = pytest.CaptureFixture[str]


def test_bmc_status_in_json(write_manifest: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    """bmc had no --json (issue 27 item 13). A node without a BMC: nulls and its error, exit 1."""
    data = kit.base()
    data["nodes"][0]["bmc"] = {"type": "redfish", "address": "10.0.1.10", "user": "admin", "password_env": "X_PW"}
    path = write_manifest(data)
    rows = {"head01": BmcRow("head01", "redfish", "10.0.1.10", True, power="unknown", boot="none",
                             warnings=("self-signed certificate",))}
    monkeypatch.setattr(bmc_cmd, "bmc_status", lambda nodes: [
        rows.get(n.name, BmcRow(n.name, "-", "-", False, message=f"{n.name} has no bmc section in the manifest"))
        for n in nodes])
    assert main(["bmc", str(path), "status", "--json", "--limit", "head01,node01"]) == 1
    assert json.loads(capsys.readouterr().out) == [
        {"node": "head01", "bmc": "redfish", "address": "10.0.1.10", "ok": True, "power": None, "next_boot": "none",
         "error": None, "warnings": ["self-signed certificate"]},
        {"node": "node01", "bmc": None, "address": None, "ok": False, "power": None, "next_boot": None,
         "error": "node01 has no bmc section in the manifest", "warnings": []}]
