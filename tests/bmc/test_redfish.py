"""RedfishBmc against sushy-tools' emulator (fake driver, TLS, basic auth)."""

from __future__ import annotations

import time

import pytest
from emulators.creds import REDFISH_PASSWORD
from emulators.manifests import manifest, node_dict, redfish_bmc
from emulators.redfish import RedfishEmulator

from provisioner.bmc import CredentialsError, UnreachableError, make_bmc, wait_for_power
from provisioner.bmc.credentials import Secret
from provisioner.bmc.redfish import RedfishBmc, system_path


def driver(emulator: RedfishEmulator, system: str, password: str = REDFISH_PASSWORD, **kw: object) -> RedfishBmc:
    return RedfishBmc(system, "127.0.0.1", user="admin", password=Secret(password), port=emulator.port,
                      system_id=emulator.uuid(system), timeout=10, retries=1, **kw)  # type: ignore[arg-type]


def test_system_path_takes_an_id_or_a_path() -> None:
    assert system_path("/redfish/v1/Systems", "abc") == "/redfish/v1/Systems/abc"
    assert system_path("/redfish/v1/Systems/", "/redfish/v1/Systems/x") == "/redfish/v1/Systems/x"


def test_power_state_and_boot_override(redfish: RedfishEmulator) -> None:
    bmc = driver(redfish, "gpu01")
    try:
        assert bmc.power_state() == "off"
        override = bmc.boot_override()
        assert override.target == "disk"  # the emulator's initial Hdd, read back as Continuous
        assert override.once is False
    finally:
        bmc.close()


@pytest.mark.parametrize("mode, redfish_mode", [("uefi", "UEFI"), ("legacy", "Legacy")])
def test_one_time_pxe_sends_the_boot_mode_and_confirms(redfish: RedfishEmulator, mode: str,
                                                       redfish_mode: str) -> None:
    bmc = driver(redfish, "gpu01")
    try:
        confirmation = bmc.set_boot_once("pxe", mode)  # type: ignore[arg-type]
    finally:
        bmc.close()
    assert confirmation.readback.target == "pxe"
    assert confirmation.readback.mode == mode
    # the emulator accepts "Once" but reads it back as Continuous: reported, not hidden
    assert confirmation.readback.once is False
    assert any("persistent" in w and "sushy-tools" in w for w in confirmation.warnings)
    system = redfish.system("gpu01")
    assert system["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    assert system["Boot"]["BootSourceOverrideMode"] == redfish_mode


def test_power_cycle_of_a_node_that_is_off_powers_it_on(redfish: RedfishEmulator) -> None:
    bmc = driver(redfish, "gpu01")
    try:
        bmc.power_off()
        wait_for_power(bmc, "off", timeout=20, interval=0.3)
        bmc.power_cycle()
        wait_for_power(bmc, "on", timeout=20, interval=0.3)
    finally:
        bmc.close()
    assert redfish.power("gpu01") == "On"


def test_power_cycle_of_a_running_node_restarts_it(redfish: RedfishEmulator) -> None:
    bmc = driver(redfish, "gpu02")
    try:
        assert bmc.power_state() == "on"
        bmc.power_cycle()
        seen_off = redfish.power("gpu02") == "Off"  # the fake driver goes off at once
        wait_for_power(bmc, "on", timeout=20, interval=0.3)
    finally:
        bmc.close()
    assert seen_off


def test_wrong_password_is_a_clear_credentials_error(redfish: RedfishEmulator) -> None:
    bmc = driver(redfish, "gpu01", password="not-the-password")
    with pytest.raises(CredentialsError) as info:
        bmc.power_state()
    assert str(info.value).startswith("BMC 127.0.0.1 rejected the credentials for gpu01")
    assert info.value.node == "gpu01" and info.value.address == "127.0.0.1"
    assert "not-the-password" not in str(info.value) and "not-the-password" not in repr(bmc)


def test_nobody_listening_is_unreachable() -> None:
    from emulators.ports import free_tcp_port

    bmc = RedfishBmc("gpu09", "127.0.0.1", user="admin", password=Secret("x"), port=free_tcp_port(),
                     timeout=2, retries=2, retry_delay=0.1)
    start = time.monotonic()
    with pytest.raises(UnreachableError, match=r"BMC 127\.0\.0\.1 of gpu09 is unreachable"):
        bmc.power_state()
    assert time.monotonic() - start < 15


def test_make_bmc_builds_the_redfish_driver_from_the_manifest(redfish: RedfishEmulator) -> None:
    m = manifest([node_dict("gpu01", 1, bmc=redfish_bmc(redfish.port, system_id=redfish.uuid("gpu01")))])
    bmc = make_bmc(m.node("gpu01"), timeout=10, environ={"TEST_BMC_PASSWORD": REDFISH_PASSWORD})
    try:
        assert isinstance(bmc, RedfishBmc)
        assert bmc.power_state() in ("on", "off")
    finally:
        bmc.close()
