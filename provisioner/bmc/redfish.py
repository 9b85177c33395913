"""Redfish driver (``sushy``): one ComputerSystem behind one BMC."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import sushy
import urllib3
from sushy import exceptions as sushy_exc

from provisioner.bmc.base import (
    BmcError,
    BootConfirmation,
    BootMode,
    BootOverride,
    BootTarget,
    CredentialsError,
    PowerState,
    UnreachableError,
    confirm_boot,
    retry,
)
from provisioner.bmc.credentials import Secret

# sushy logs its own view of failures (auth fallbacks, 401s) as warnings/errors; our
# BmcError carries the same facts with the node name, so keep sushy quiet.
logging.getLogger("sushy").setLevel(logging.CRITICAL)

T = TypeVar("T")

_TARGETS: dict[BootTarget, Any] = {"pxe": sushy.BootSource.PXE, "disk": sushy.BootSource.HDD}
_MODES: dict[BootMode, Any] = {
    "uefi": sushy.BootSourceOverrideMode.UEFI,
    "legacy": sushy.BootSourceOverrideMode.LEGACY,
}
_TRANSIENT = (sushy_exc.ConnectionError, sushy_exc.ServerSideError)


def base_url(address: str, port: int | None, scheme: str = "https") -> str:
    return f"{scheme}://{address}" + (f":{port}" if port else "")


def system_path(systems_collection_path: str, system_id: str) -> str:
    """A manifest ``system_id`` may be a full path or just the member's Id."""
    if system_id.startswith("/"):
        return system_id
    return systems_collection_path.rstrip("/") + "/" + system_id


class RedfishBmc:
    """Power and one-time boot control over Redfish.

    ``retries`` applies to connection errors and 5xx answers; 4xx answers (bad
    credentials, rejected requests) fail at once.
    """

    def __init__(
        self,
        node: str,
        address: str,
        *,
        user: str,
        password: Secret,
        port: int | None = None,
        system_id: str | None = None,
        verify_tls: bool = False,
        timeout: float = 20.0,
        retries: int = 3,
        retry_delay: float = 2.0,
        scheme: str = "https",
    ) -> None:
        self.node = node
        self.address = address
        self._user = user
        self._password = password
        self._url = base_url(address, port, scheme)
        self._system_id = system_id
        self._verify = verify_tls
        self._timeout = timeout
        self._retries = max(1, retries)
        self._retry_delay = retry_delay
        self._root: Any = None
        self._system: Any = None
        self._lock = threading.Lock()
        if not verify_tls:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    def __repr__(self) -> str:
        return f"RedfishBmc(node={self.node!r}, url={self._url!r}, user={self._user!r})"

    # ------------------------------------------------------------------ plumbing
    def _error(self, exc: Exception, doing: str) -> BmcError:
        if isinstance(exc, BmcError):
            return exc
        if isinstance(exc, sushy_exc.AccessError):
            return CredentialsError(self.node, self.address, f"HTTP {exc.status_code} while {doing}")
        if isinstance(exc, sushy_exc.ConnectionError):
            return UnreachableError(self.node, self.address, f"no connection to {self._url} while {doing}")
        if isinstance(exc, sushy_exc.ResourceNotFoundError):
            return BmcError(self.node, self.address,
                            f"BMC {self.address} of {self.node}: not found while {doing}: {exc}",
                            kind="config")
        if isinstance(exc, sushy_exc.HTTPError):
            return BmcError(self.node, self.address,
                            f"BMC {self.address} rejected {doing} for {self.node}: HTTP {exc.status_code} "
                            f"{exc.detail or ''}".rstrip(),
                            kind="rejected")
        if isinstance(exc, sushy_exc.SushyError):
            return BmcError(self.node, self.address, f"BMC {self.address} of {self.node}: {doing} failed: {exc}",
                            kind="rejected")
        return BmcError(self.node, self.address,
                        f"BMC {self.address} of {self.node}: {doing} failed: {type(exc).__name__}: {exc}")

    def _call(self, doing: str, fn: Callable[[], T]) -> T:
        with self._lock:
            try:
                return retry(fn, attempts=self._retries, delay=self._retry_delay, retry_on=_TRANSIENT)
            except Exception as exc:  # mapped to one message naming node and BMC
                raise self._error(exc, doing) from None

    def _connect(self) -> Any:
        if self._system is not None:
            return self._system
        root = sushy.Sushy(
            self._url,
            username=self._user,
            password=self._password.reveal(),
            verify=self._verify,
            server_side_retries=1,
            server_side_retries_delay=1,
            read_timeout=self._timeout,
            connect_timeout=self._timeout,
        )
        collection = root.get_system_collection()
        if self._system_id:
            path = system_path(collection.path, self._system_id)
        else:
            members = list(collection.members_identities)
            if not members:
                raise BmcError(self.node, self.address, f"BMC {self.address} of {self.node} lists no systems",
                               kind="config")
            path = members[0]
        self._root = root
        self._system = root.get_system(path)
        return self._system

    def _fresh(self) -> Any:
        system = self._connect()
        system.refresh(force=True)
        return system

    # ------------------------------------------------------------------ inventory
    def drive_serials(self) -> tuple[str, ...] | None:
        """The SerialNumber of every drive of the system's Storage (Redfish Storage ->
        Drives); None when the BMC offers no Storage collection or answers it with an error
        (sushy-tools: HTTP 500 for a system without storage): the disk stays unchecked then,
        not the BMC failed."""

        def read() -> tuple[str, ...] | None:
            system = self._connect()
            try:
                members = system.storage.get_members()
            except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError, sushy_exc.HTTPError):
                return None
            return tuple(str(d.serial_number).strip() for st in members for d in st.drives
                         if d.serial_number and str(d.serial_number).strip())

        return self._call("reading the drives", read)

    # ------------------------------------------------------------------ power
    def power_state(self) -> PowerState:
        def read() -> PowerState:
            state = self._fresh().power_state
            if state == sushy.PowerState.ON:
                return "on"
            if state == sushy.PowerState.OFF:
                return "off"
            return "unknown"

        return self._call("reading the power state", read)

    def _reset(self, *choices: Any) -> None:
        system = self._fresh()
        allowed = system.get_allowed_reset_system_values()
        for choice in choices:
            if choice in allowed:
                system.reset_system(choice)
                return
        names = "/".join(c.value for c in choices)
        raise BmcError(self.node, self.address,
                       f"BMC {self.address} of {self.node} offers none of {names}", kind="rejected")

    def power_on(self) -> None:
        self._call("powering on", lambda: self._reset(sushy.ResetType.ON, sushy.ResetType.FORCE_ON))

    def power_off(self) -> None:
        self._call("powering off", lambda: self._reset(sushy.ResetType.FORCE_OFF))

    def power_cycle(self) -> None:
        def cycle() -> None:
            if self._fresh().power_state == sushy.PowerState.OFF:
                self._reset(sushy.ResetType.ON, sushy.ResetType.FORCE_ON)
            else:
                self._reset(sushy.ResetType.FORCE_RESTART, sushy.ResetType.POWER_CYCLE)

        self._call("power cycling", cycle)

    # ------------------------------------------------------------------ boot
    def boot_override(self) -> BootOverride:
        def read() -> BootOverride:
            boot = self._fresh().boot
            enabled = boot.enabled
            target = boot.target
            if enabled == sushy.BootSourceOverrideEnabled.DISABLED or target in (None, sushy.BootSource.NONE):
                shown: str | None = None
            elif target == sushy.BootSource.PXE:
                shown = "pxe"
            elif target == sushy.BootSource.HDD:
                shown = "disk"
            else:
                shown = str(target.value)
            once: bool | None = None
            if enabled == sushy.BootSourceOverrideEnabled.ONCE:
                once = True
            elif enabled == sushy.BootSourceOverrideEnabled.CONTINUOUS:
                once = False
            mode: BootMode | None = None
            if boot.mode == sushy.BootSourceOverrideMode.UEFI:
                mode = "uefi"
            elif boot.mode == sushy.BootSourceOverrideMode.LEGACY:
                mode = "legacy"
            return BootOverride(shown, once, mode)

        return self._call("reading the boot override", read)

    def set_boot_once(self, target: BootTarget, mode: BootMode) -> BootConfirmation:
        def send() -> None:
            system = self._fresh()
            try:
                system.set_system_boot_options(
                    target=_TARGETS[target],
                    enabled=sushy.BootSourceOverrideEnabled.ONCE,
                    mode=_MODES[mode],
                )
            except sushy_exc.InvalidParameterValueError as exc:
                raise BmcError(self.node, self.address,
                               f"BMC {self.address} of {self.node} does not offer boot target {target}: {exc}",
                               kind="rejected") from None

        self._call(f"setting the next boot to {target} ({mode})", send)
        requested = BootOverride(target, True, mode)
        return confirm_boot(self.node, self.address, requested, self.boot_override())

    def close(self) -> None:
        root, self._root, self._system = self._root, None, None
        auth = getattr(root, "_auth", None) if root is not None else None
        if auth is not None:
            # ends the Redfish session, if one was opened; a BMC that went away cannot
            with contextlib.suppress(Exception):
                auth.close()
