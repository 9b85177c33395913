"""The BMC interface shared by the Redfish and IPMI drivers.

A driver controls one node's baseboard management controller: power state, power on/off/
cycle, and a one-time boot override (PXE or disk) that always carries the boot mode
(UEFI or legacy) explicitly and is read back to confirm it took.

Every failure is a :class:`BmcError` that names the node and the BMC address, so a recap
over many nodes says which one failed and why ("BMC 10.0.1.11 rejected the credentials
for gpu01"). Passwords never appear in messages, reprs or logs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from provisioner.errors import ProvisionError

PowerState = Literal["on", "off", "unknown"]
PowerAction = Literal["on", "off", "cycle"]
BootTarget = Literal["pxe", "disk"]
BootMode = Literal["uefi", "legacy"]
BOOT_TARGETS: tuple[BootTarget, ...] = ("pxe", "disk")
POWER_ACTIONS: tuple[PowerAction, ...] = ("on", "off", "cycle")

T = TypeVar("T")


class BmcError(ProvisionError):
    """A BMC operation failed; ``str()`` is a one-line message naming node and address."""

    def __init__(self, node: str, address: str, message: str, *, kind: str = "error") -> None:
        self.node = node
        self.address = address
        self.kind = kind  # "credentials", "unreachable", "rejected", "unconfirmed", "config", "error"
        super().__init__(message)


class CredentialsError(BmcError):
    def __init__(self, node: str, address: str, detail: str = "") -> None:
        msg = f"BMC {address} rejected the credentials for {node}"
        super().__init__(node, address, msg + (f" ({detail})" if detail else ""), kind="credentials")


class UnreachableError(BmcError):
    def __init__(self, node: str, address: str, detail: str) -> None:
        super().__init__(node, address, f"BMC {address} of {node} is unreachable: {detail}", kind="unreachable")


@dataclass(frozen=True)
class BootOverride:
    """A boot override as the BMC reports it."""

    target: BootTarget | str | None  # "pxe", "disk", another device name, or None (no override)
    once: bool | None  # True: next boot only; False: persistent; None: not reported
    mode: BootMode | None  # None when the BMC does not report a mode


@dataclass(frozen=True)
class BootConfirmation:
    """What :meth:`Bmc.set_boot_once` sent and what the BMC read back."""

    requested: BootOverride
    readback: BootOverride
    warnings: tuple[str, ...] = field(default_factory=tuple)


class Bmc(Protocol):
    """One node's BMC. Drivers: :class:`~provisioner.bmc.redfish.RedfishBmc`,
    :class:`~provisioner.bmc.ipmi.IpmiBmc`."""

    node: str
    address: str

    def power_state(self) -> PowerState: ...

    def power_on(self) -> None: ...

    def power_off(self) -> None: ...

    def power_cycle(self) -> None:
        """Restart a running node, or power on a node that is off."""
        ...

    def boot_override(self) -> BootOverride: ...

    def set_boot_once(self, target: BootTarget, mode: BootMode) -> BootConfirmation:
        """Set the next boot (only) to ``target`` in ``mode``, read it back, and raise
        :class:`BmcError` unless the BMC confirms target and mode."""
        ...

    def drive_serials(self) -> tuple[str, ...] | None:
        """The serial numbers of the system's drives as the BMC lists them (None: the BMC
        keeps no disk inventory, as IPMI; or does not show it)."""
        ...

    def close(self) -> None: ...


def confirm_boot(node: str, address: str, requested: BootOverride, readback: BootOverride) -> BootConfirmation:
    """Compare a boot override read back from a BMC with the one requested.

    Target and mode must match (a BMC that does not report a mode gets a warning); a BMC
    that reads the override back as persistent gets a warning, not an error: the PXE
    server's per-node script boots a node from its disk once the install reported, so a
    persistent PXE override cannot cause a reinstall loop. (sushy-tools' emulator always
    reads overrides back as "Continuous".)
    """
    warnings: list[str] = []
    if readback.target != requested.target:
        shown = readback.target if readback.target is not None else "no override"
        raise BmcError(
            node, address,
            f"BMC {address} of {node} did not take the boot override: asked for {requested.target}, "
            f"it reports {shown}",
            kind="unconfirmed",
        )
    if readback.mode is None:
        warnings.append(f"BMC {address} of {node} does not report the boot mode; sent {requested.mode}")
    elif readback.mode != requested.mode:
        raise BmcError(
            node, address,
            f"BMC {address} of {node} did not take the boot mode: asked for {requested.mode}, "
            f"it reports {readback.mode}",
            kind="unconfirmed",
        )
    if readback.once is False:
        warnings.append(
            f"BMC {address} of {node} reports the {requested.target} override as persistent, not "
            "next-boot-only (sushy-tools' emulator always does); the PXE server boots installed "
            "nodes from disk, so this cannot cause a reinstall"
        )
    elif readback.once is None:
        warnings.append(f"BMC {address} of {node} does not report whether the override is one-time")
    return BootConfirmation(requested, readback, tuple(warnings))


def retry(
    call: Callable[[], T],
    *,
    attempts: int,
    delay: float,
    retry_on: tuple[type[BaseException], ...],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``call`` up to ``attempts`` times, sleeping ``delay`` (doubling) between tries,
    retrying only on ``retry_on``; the last error propagates."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    wait = delay
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except retry_on:
            if attempt == attempts:
                raise
            sleep(wait)
            wait *= 2
    raise AssertionError("unreachable")  # pragma: no cover


def wait_for_power(
    bmc: Bmc,
    want: PowerState,
    *,
    timeout: float,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Poll until the BMC reports ``want``; raise :class:`BmcError` after ``timeout``."""
    deadline = clock() + timeout
    state = bmc.power_state()
    while state != want:
        if clock() >= deadline:
            raise BmcError(
                bmc.node, bmc.address,
                f"BMC {bmc.address} of {bmc.node} still reports power {state} after {timeout:.0f} s "
                f"(waiting for {want})",
                kind="unconfirmed",
            )
        sleep(interval)
        state = bmc.power_state()
