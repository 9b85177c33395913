"""IpmiBmc against a pyghmi BMC on 127.0.0.1 (tests/emulators/ipmi_bmc.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from emulators.creds import IPMI_PASSWORD
from emulators.ipmi import IpmiEmulator
from emulators.manifests import ipmi_bmc, manifest, node_dict
from emulators.ports import free_udp_port

from provisioner.bmc import CredentialsError, UnreachableError, make_bmc, wait_for_power
from provisioner.bmc.credentials import Secret
from provisioner.bmc.ipmi import IpmiBmc, classify, error_text


def driver(emulator: IpmiEmulator, user: str = "admin", password: str = IPMI_PASSWORD, **kw: float) -> IpmiBmc:
    return IpmiBmc("gpu02", "127.0.0.1", user=user, password=Secret(password), port=emulator.port,
                   timeout=kw.get("timeout", 20.0), retries=1)


def wait_boots(emulator: IpmiEmulator, count: int, timeout: float = 15) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        boots = emulator.boots()
        if len(boots) >= count:
            return boots
        time.sleep(0.1)
    raise AssertionError(f"expected {count} boots, saw {emulator.boots()}")


def test_classify_pyghmi_errors() -> None:
    assert classify("Incorrect password provided") == "credentials"
    assert classify("Unauthorized name") == "credentials"
    assert classify("None") == "unreachable"
    assert classify("timeout") == "unreachable"
    assert classify("Invalid data field in request") == "rejected"


def test_one_time_pxe_in_uefi_mode_is_confirmed_and_used_once(ipmi: IpmiEmulator) -> None:
    bmc = driver(ipmi)
    try:
        bmc.power_off()
        wait_for_power(bmc, "off", timeout=10, interval=0.2)
        confirmation = bmc.set_boot_once("pxe", "uefi")
        assert confirmation.readback.target == "pxe"
        assert confirmation.readback.once is True
        assert confirmation.readback.mode == "uefi"
        assert confirmation.warnings == ()
        before = len(ipmi.boots())
        bmc.power_cycle()  # off: powers on
        boots = wait_boots(ipmi, before + 1)
        assert boots[-1] == {"device": "network", "uefi": True}
        wait_for_power(bmc, "on", timeout=10, interval=0.2)
        # next boot only: the override is gone after that boot
        assert bmc.boot_override().target is None
    finally:
        bmc.close()


def test_legacy_mode_is_sent_explicitly(ipmi: IpmiEmulator) -> None:
    bmc = driver(ipmi)
    try:
        confirmation = bmc.set_boot_once("pxe", "legacy")
        assert confirmation.readback.mode == "legacy"
        assert ipmi.state()["override"] == {"valid": True, "persistent": False, "uefi": False, "device": "network"}
    finally:
        bmc.close()


def test_power_cycle_of_a_running_node(ipmi: IpmiEmulator) -> None:
    bmc = driver(ipmi)
    try:
        bmc.power_on()
        wait_for_power(bmc, "on", timeout=10, interval=0.2)
        bmc.set_boot_once("disk", "uefi")
        before = len(ipmi.boots())
        bmc.power_cycle()
        assert ipmi.state()["power"] == "off"  # off at once, on again after the boot delay
        boots = wait_boots(ipmi, before + 1)
        assert boots[-1] == {"device": "hd", "uefi": True}
        wait_for_power(bmc, "on", timeout=10, interval=0.2)
    finally:
        bmc.close()


def test_a_session_the_bmc_may_have_dropped_is_not_reused(tmp_path: Path) -> None:
    """A BMC that lost its sessions (restarted here) still answers the next driver: seen in the
    VM lab, the install's first BMC step failed minutes after the preflight had asked the same
    BMC (the emulator died of a packet for a session it no longer had)."""
    with IpmiEmulator(tmp_path, "admin", IPMI_PASSWORD, boot_delay=0.5) as emulator:
        first = driver(emulator)
        assert first.power_state() in ("on", "off")
        first.close()
        emulator.stop()
        emulator.start()  # the same BMC back, without the sessions it had
        second = driver(emulator, timeout=10)
        try:
            assert second.power_state() in ("on", "off")
        finally:
            second.close()


def test_wrong_password_is_a_clear_credentials_error(ipmi: IpmiEmulator) -> None:
    bmc = driver(ipmi, password="not-the-password")
    with pytest.raises(CredentialsError) as info:
        bmc.power_state()
    assert str(info.value).startswith("BMC 127.0.0.1 rejected the credentials for gpu02")
    assert "not-the-password" not in str(info.value) and "not-the-password" not in repr(bmc)


def test_unknown_user_is_a_clear_credentials_error(ipmi: IpmiEmulator) -> None:
    with pytest.raises(CredentialsError, match=r"BMC 127\.0\.0\.1 rejected the credentials for gpu02"):
        driver(ipmi, user="nobody").power_state()


def test_silent_bmc_is_unreachable_within_the_timeout() -> None:
    bmc = IpmiBmc("gpu09", "127.0.0.1", user="admin", password=Secret("x"), port=free_udp_port(),
                  timeout=3, retries=1)
    start = time.monotonic()
    with pytest.raises(UnreachableError, match=r"BMC 127\.0\.0\.1 of gpu09 is unreachable"):
        bmc.power_state()
    assert time.monotonic() - start < 10


def test_make_bmc_builds_the_ipmi_driver_from_the_manifest(ipmi: IpmiEmulator) -> None:
    m = manifest([node_dict("gpu02", 2, bmc=ipmi_bmc(ipmi.port))])
    bmc = make_bmc(m.node("gpu02"), timeout=20, environ={"TEST_IPMI_PASSWORD": IPMI_PASSWORD})
    try:
        assert isinstance(bmc, IpmiBmc)
        assert bmc.power_state() in ("on", "off")
    finally:
        bmc.close()


class _RaisingCommand:
    """A pyghmi Command whose power read raises ``exc`` (what pyghmi lets through)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def get_power(self) -> dict[str, str]:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (OSError(101, "Network is unreachable"), "network is unreachable"),
        (OSError(113, "No route to host"), "no route to host"),
        (OSError(111, "Connection refused"), "connection refused"),
        (Exception(101), "network is unreachable"),
        (Exception(None), "no answer"),
    ],
)
def test_an_unreachable_bmc_is_reported_in_words_not_as_a_rejection(exc: BaseException, words: str) -> None:
    """Issue 19 item 16: `BMC 10.x rejected reading the power state for node: 101`; and issue
    18 item 4: `... is unreachable: None while reading the power state`."""
    bmc = IpmiBmc("gpu01", "10.10.1.21", user="admin", password=Secret("x"), timeout=5, retries=2,
                  retry_delay=0.01, command_factory=lambda **kw: _RaisingCommand(exc))
    with pytest.raises(UnreachableError) as info:
        bmc.power_state()
    message = str(info.value)
    assert message == f"BMC 10.10.1.21 of gpu01 is unreachable: {words} while reading the power state"
    assert "None" not in message and "101" not in message and "rejected" not in message


def test_error_text_and_classify_know_errno_values() -> None:
    assert error_text(OSError(101, "Network is unreachable")) == "network is unreachable"
    assert error_text(Exception(None)) == "" and error_text(Exception()) == ""
    assert error_text(Exception("Invalid data field")) == "Invalid data field"
    assert classify("network is unreachable") == "unreachable"
    assert classify("[Errno 113] No route to host") == "unreachable"
    assert classify("101") == "unreachable"
