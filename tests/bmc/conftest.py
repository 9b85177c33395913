"""BMC emulators for the driver tests, started once per module and always stopped."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators.creds import IPMI_PASSWORD, REDFISH_PASSWORD  # noqa: E402
from emulators.ipmi import IpmiEmulator  # noqa: E402
from emulators.redfish import RedfishEmulator, fake_system  # noqa: E402


@pytest.fixture(scope="module")
def redfish(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedfishEmulator]:
    systems = [fake_system("gpu01", power="Off"), fake_system("gpu02", power="On")]
    with RedfishEmulator(tmp_path_factory.mktemp("redfish"), systems, {"admin": REDFISH_PASSWORD},
                         drives={"gpu01": ["32ADF365C6C1B7BD"]}) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def ipmi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiEmulator]:
    with IpmiEmulator(tmp_path_factory.mktemp("ipmi"), "admin", IPMI_PASSWORD, boot_delay=0.5) as emulator:
        yield emulator
