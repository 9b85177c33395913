"""The pure parts of the BMC layer: boot confirmation, retries, power waits."""

from __future__ import annotations

import pytest

from provisioner.bmc.base import BmcError, BootOverride, confirm_boot, retry, wait_for_power


def test_confirmed_one_time_override_has_no_warnings() -> None:
    c = confirm_boot("gpu01", "10.0.1.11", BootOverride("pxe", True, "uefi"), BootOverride("pxe", True, "uefi"))
    assert c.warnings == ()


def test_wrong_target_read_back_is_an_error() -> None:
    with pytest.raises(BmcError, match="did not take the boot override: asked for pxe, it reports disk"):
        confirm_boot("gpu01", "10.0.1.11", BootOverride("pxe", True, "uefi"), BootOverride("disk", True, "uefi"))


def test_missing_override_read_back_is_an_error() -> None:
    with pytest.raises(BmcError, match="it reports no override") as info:
        confirm_boot("gpu01", "10.0.1.11", BootOverride("pxe", True, "uefi"), BootOverride(None, None, None))
    assert info.value.kind == "unconfirmed"


def test_wrong_mode_read_back_is_an_error() -> None:
    with pytest.raises(BmcError, match="did not take the boot mode: asked for legacy, it reports uefi"):
        confirm_boot("gpu01", "10.0.1.11", BootOverride("pxe", True, "legacy"), BootOverride("pxe", True, "uefi"))


def test_persistent_read_back_and_unreported_mode_are_warnings() -> None:
    c = confirm_boot("gpu01", "10.0.1.11", BootOverride("pxe", True, "uefi"), BootOverride("pxe", False, None))
    assert len(c.warnings) == 2
    assert any("persistent" in w for w in c.warnings)
    assert any("does not report the boot mode" in w for w in c.warnings)


def test_retry_retries_only_the_named_errors() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "up"

    slept: list[float] = []
    assert retry(flaky, attempts=3, delay=1.0, retry_on=(ConnectionError,), sleep=slept.append) == "up"
    assert slept == [1.0, 2.0]

    def denied() -> str:
        raise PermissionError("no")

    with pytest.raises(PermissionError):
        retry(denied, attempts=5, delay=0.0, retry_on=(ConnectionError,), sleep=slept.append)


class FakePower:
    node = "gpu01"
    address = "10.0.1.11"

    def __init__(self, states: list[str]) -> None:
        self.states = states

    def power_state(self) -> str:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def test_wait_for_power_polls_until_the_state() -> None:
    now = [0.0]
    bmc = FakePower(["off", "off", "on"])
    wait_for_power(bmc, "on", timeout=10, interval=1, clock=lambda: now[0],  # type: ignore[arg-type]
                   sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] == 2.0


def test_wait_for_power_gives_up_with_the_last_state() -> None:
    now = [0.0]
    with pytest.raises(BmcError, match="still reports power off after 5 s"):
        wait_for_power(FakePower(["off"]), "on", timeout=5, interval=1,  # type: ignore[arg-type]
                       clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
