"""provision bmc status|power|pxe over several nodes: one row each, failures isolated."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from emulators.creds import IPMI_PASSWORD, REDFISH_PASSWORD
from emulators.ipmi import IpmiEmulator
from emulators.manifests import ipmi_bmc, manifest, node_dict, redfish_bmc
from emulators.redfish import RedfishEmulator

from provisioner.bmc import bmc_answers, bmc_power, bmc_pxe, bmc_status, make_bmc
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node


@pytest.fixture(scope="module")
def lab(redfish: RedfishEmulator, ipmi: IpmiEmulator) -> Iterator[Manifest]:
    yield manifest([
        node_dict("gpu01", 1, bmc=redfish_bmc(redfish.port, system_id=redfish.uuid("gpu01"))),
        node_dict("gpu02", 2, bmc=ipmi_bmc(ipmi.port)),
        node_dict("gpu03", 3, bmc=redfish_bmc(redfish.port, env="WRONG_PASSWORD", system_id=redfish.uuid("gpu02"))),
        node_dict("gpu04", 4),  # no BMC
    ])


ENV = {"TEST_BMC_PASSWORD": REDFISH_PASSWORD, "TEST_IPMI_PASSWORD": IPMI_PASSWORD, "WRONG_PASSWORD": "nope"}


def factory(node: Node):  # type: ignore[no-untyped-def]
    return make_bmc(node, timeout=30, retries=2, environ=ENV)


def compute(m: Manifest) -> list[Node]:
    return [n for n in m.nodes if n.name != "head"]


def test_status_rows_per_node(lab: Manifest) -> None:
    rows = {r.node: r for r in bmc_status(compute(lab), factory=factory)}
    assert list(rows) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert rows["gpu01"].ok and rows["gpu01"].type == "redfish" and rows["gpu01"].power in ("on", "off")
    assert rows["gpu02"].ok and rows["gpu02"].type == "ipmi" and rows["gpu02"].boot is not None
    assert not rows["gpu03"].ok
    assert rows["gpu03"].message.startswith("BMC 127.0.0.1 rejected the credentials for gpu03")
    assert not rows["gpu04"].ok and "no bmc section" in rows["gpu04"].message
    assert "nope" not in " ".join(r.message for r in rows.values())


def test_the_install_preflight_asks_each_bmc(lab: Manifest) -> None:
    """Issue 26 item 3: before an install, apply reads each BMC's power state with the
    manifest's credentials, and the drives a Redfish BMC lists; a wrong password or no BMC
    is that node's failure, in words; IPMI lists no drives."""
    answers = bmc_answers(compute(lab), factory=factory)
    assert answers["gpu01"][0] and answers["gpu01"][1].startswith("power o")
    assert answers["gpu01"][2] == ("1234570",)  # the emulator's one drive (its template's serial)
    assert answers["gpu02"][0] and "boot override" in answers["gpu02"][1] and answers["gpu02"][2] is None
    assert not answers["gpu03"][0] and answers["gpu03"][2] is None
    assert answers["gpu03"][1].startswith("BMC 127.0.0.1 rejected the credentials for gpu03")
    assert not answers["gpu04"][0] and "no bmc section" in answers["gpu04"][1]


def test_a_redfish_system_without_storage_lists_no_drive_serials(lab: Manifest, redfish: RedfishEmulator) -> None:
    node = lab.node("gpu01").model_copy(update={"bmc": lab.node("gpu01").bmc.model_copy(  # type: ignore[union-attr]
        update={"system_id": redfish.uuid("gpu02")})})
    bmc = factory(node)
    try:
        assert bmc.drive_serials() is None  # the emulator answers HTTP 500 there: unchecked, not failed
    finally:
        bmc.close()


def test_pxe_then_power_cycle(lab: Manifest, redfish: RedfishEmulator, ipmi: IpmiEmulator) -> None:
    nodes = [lab.node("gpu01"), lab.node("gpu02")]
    rows = bmc_pxe(nodes, factory=factory)
    assert all(r.ok for r in rows), rows
    assert rows[0].boot == "pxe, persistent, uefi"  # sushy-tools reads "Once" back as Continuous
    assert rows[0].warnings
    assert rows[1].boot == "pxe, next boot only, uefi"
    before = len(ipmi.boots())
    rows = bmc_power(nodes, "cycle", wait=True, wait_timeout=60, poll_interval=0.5, factory=factory)
    assert [r.ok for r in rows] == [True, True], rows
    assert redfish.power("gpu01") == "On"
    assert ipmi.boots()[before:] == [{"device": "network", "uefi": True}]


def test_power_off_and_on(lab: Manifest) -> None:
    node = [lab.node("gpu02")]
    assert bmc_power(node, "off", wait=True, wait_timeout=30, poll_interval=0.2, factory=factory)[0].power == "off"
    assert bmc_power(node, "on", wait=True, wait_timeout=30, poll_interval=0.2, factory=factory)[0].power == "on"


def test_unknown_action_is_refused(lab: Manifest) -> None:
    with pytest.raises(ValueError, match="unknown power action"):
        bmc_power([lab.node("gpu02")], "reboot", factory=factory)  # type: ignore[arg-type]
