"""IPMI-over-LAN driver (``pyghmi``).

pyghmi blocks without a deadline when a BMC never answers a login step, so every call
runs in a daemon thread bounded by ``timeout``. pyghmi negotiates the cipher suite itself
(17, falling back to 3 when the BMC declines 17).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyghmi.ipmi import command as ipmi_command
from pyghmi.ipmi.private import session as ipmi_session

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
from provisioner.errors import NETWORK_ERRNO_WORDS, errno_text_reason, network_reason

T = TypeVar("T")

# Chassis control (IPMI 2.0, 28.3) directives.
CHASSIS_POWER_OFF = 0
CHASSIS_POWER_ON = 1
CHASSIS_POWER_CYCLE = 2
CHASSIS_HARD_RESET = 3

_BOOTDEV: dict[BootTarget, str] = {"pxe": "network", "disk": "hd"}
_CREDENTIAL_ERRORS = (
    "incorrect password",
    "unauthorized name",
    "invalid name",
    "insufficient privilege",
    "unauthorized role",
    "invalid role",
    "rakp",
)


class _Timeout(Exception):
    pass


class _Transient(Exception):
    pass


def error_text(exc: BaseException) -> str:
    """What a pyghmi error says, in words: a network errno (pyghmi lets ``OSError(101, ...)``
    through, whose first argument is the bare number) becomes "network is unreachable";
    an error without a message becomes "" (never "None")."""
    reason = network_reason(exc)
    if reason is not None:
        return reason
    first = exc.args[0] if exc.args else None
    if first is None:
        return ""
    return str(first).strip()


def classify(message: str) -> str:
    """'credentials', 'unreachable' or 'rejected' for a pyghmi error text (see error_text)."""
    if errno_text_reason(message or "") is not None or (message or "").strip() in NETWORK_ERRNO_WORDS.values():
        return "unreachable"
    text = (message or "").lower()
    if any(marker in text for marker in _CREDENTIAL_ERRORS):
        return "credentials"
    if not text or text == "none" or "timeout" in text or "session" in text or "no response" in text:
        return "unreachable"
    return "rejected"


def forget_login(address: str, user: str, password: str, port: int) -> None:
    """Work around pyghmi (1.6): it registers a login under str keys but removes it
    under bytes keys, so the entry stays, and the next Command for the same BMC, user
    and password in this process waits forever for a login that already finished."""
    ipmi_session.Session.initting_sessions.pop((address, user, password, port, None), None)


def forget_session(address: str, port: int) -> None:
    """Mark pyghmi's cached sessions to this BMC broken, so that the next Command logs in
    afresh. Without keepalive pyghmi hands a cached session to the next Command however long
    it idled; a BMC that dropped it meanwhile (real ones expire idle sessions after a minute
    or so) never answers on it, and a retry got the same dead session: an install failed at
    its first BMC step after the preflight had asked the same BMC minutes before."""
    for handlers in list(ipmi_session.Session.bmc_handlers.values()):
        for session in list(handlers.values()):
            if getattr(session, "bmc", None) == address and getattr(session, "port", None) == port:
                session.broken = True


def run_with_deadline(fn: Callable[[], T], timeout: float) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`_Timeout` after ``timeout`` seconds.

    A daemon thread, not an executor: a pyghmi call stuck on a silent BMC must not keep
    the process from exiting.
    """
    box: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)

    def target() -> None:
        try:
            box.put((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            box.put((False, exc))

    threading.Thread(target=target, daemon=True, name="ipmi-call").start()
    try:
        ok, value = box.get(timeout=timeout)
    except queue.Empty:
        raise _Timeout() from None
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


class IpmiBmc:
    """Power and one-time boot control over IPMI 2.0 (RMCP+)."""

    def __init__(
        self,
        node: str,
        address: str,
        *,
        user: str,
        password: Secret,
        port: int | None = None,
        timeout: float = 30.0,
        retries: int = 2,
        retry_delay: float = 2.0,
        command_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.node = node
        self.address = address
        self._user = user
        self._password = password
        self._port = port or 623
        self._timeout = timeout
        self._retries = max(1, retries)
        self._retry_delay = retry_delay
        self._factory = command_factory
        self._cmd: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"IpmiBmc(node={self.node!r}, address={self.address!r}, port={self._port}, user={self._user!r})"

    # ------------------------------------------------------------------ plumbing
    def _command(self) -> Any:
        if self._cmd is None:
            factory = self._factory
            if factory is None:
                factory = ipmi_command.Command
            password = self._password.reveal()
            try:
                self._cmd = factory(
                    bmc=self.address, userid=self._user, password=password, port=self._port, keepalive=False,
                )
            finally:
                forget_login(self.address, self._user, password, self._port)
        return self._cmd

    def _error(self, exc: BaseException, doing: str) -> BmcError:
        if isinstance(exc, BmcError):
            return exc
        if isinstance(exc, _Timeout):
            return UnreachableError(self.node, self.address, f"no answer within {self._timeout:.0f} s while {doing}")
        text = error_text(exc)
        if isinstance(exc, _Transient):
            return UnreachableError(self.node, self.address, f"{text or 'no answer'} while {doing}")
        kind = classify(text)
        if kind == "credentials":
            return CredentialsError(self.node, self.address, text)
        if kind == "unreachable":
            return UnreachableError(self.node, self.address, f"no IPMI session ({text or 'timed out'}) while {doing}")
        return BmcError(self.node, self.address, f"BMC {self.address} rejected {doing} for {self.node}: {text}",
                        kind="rejected")

    def _call(self, doing: str, fn: Callable[[Any], T]) -> T:
        def once() -> T:
            try:
                return run_with_deadline(lambda: fn(self._command()), self._timeout)
            except _Timeout:
                self._drop_session()  # the session is unusable; a retry logs in afresh
                raise
            except BmcError:
                raise
            except Exception as exc:
                text = error_text(exc)
                if classify(text) == "unreachable":
                    self._drop_session()
                    raise _Transient(text or "no answer") from None
                raise

        with self._lock:
            try:
                return retry(once, attempts=self._retries, delay=self._retry_delay, retry_on=(_Transient,))
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                raise self._error(exc, doing) from None

    def _chassis(self, cmd: Any, directive: int) -> None:
        response = cmd.raw_command(netfn=0, command=2, data=[directive])
        if "error" in response:
            raise BmcError(self.node, self.address,
                           f"BMC {self.address} rejected chassis control {directive} for {self.node}: "
                           f"{response['error']}", kind="rejected")

    # ------------------------------------------------------------------ power
    def power_state(self) -> PowerState:
        def read(cmd: Any) -> PowerState:
            state = cmd.get_power().get("powerstate")
            return "on" if state == "on" else "off" if state == "off" else "unknown"

        return self._call("reading the power state", read)

    def power_on(self) -> None:
        self._call("powering on", lambda cmd: self._chassis(cmd, CHASSIS_POWER_ON))

    def power_off(self) -> None:
        self._call("powering off", lambda cmd: self._chassis(cmd, CHASSIS_POWER_OFF))

    def power_cycle(self) -> None:
        def cycle(cmd: Any) -> None:
            if cmd.get_power().get("powerstate") == "off":
                self._chassis(cmd, CHASSIS_POWER_ON)
                return
            response = cmd.raw_command(netfn=0, command=2, data=[CHASSIS_POWER_CYCLE])
            if "error" in response:  # some BMCs only offer a hard reset
                self._chassis(cmd, CHASSIS_HARD_RESET)

        self._call("power cycling", cycle)

    # ------------------------------------------------------------------ boot
    def boot_override(self) -> BootOverride:
        def read(cmd: Any) -> BootOverride:
            info = cmd.get_bootdev()
            if "error" in info:
                raise BmcError(self.node, self.address,
                               f"BMC {self.address} of {self.node}: reading boot flags failed: {info['error']}",
                               kind="rejected")
            dev = info.get("bootdev")
            target: str | None
            if dev in (None, "default"):
                target = None
            elif dev == "network":
                target = "pxe"
            elif dev == "hd":
                target = "disk"
            else:
                target = str(dev)
            persistent = info.get("persistent")
            once = None if target is None or persistent is None else not persistent
            uefi = info.get("uefimode")
            mode: BootMode | None = None if uefi is None or target is None else ("uefi" if uefi else "legacy")
            return BootOverride(target, once, mode)

        return self._call("reading the boot override", read)

    def set_boot_once(self, target: BootTarget, mode: BootMode) -> BootConfirmation:
        def send(cmd: Any) -> None:
            result = cmd.set_bootdev(_BOOTDEV[target], persist=False, uefiboot=(mode == "uefi"))
            if isinstance(result, dict) and "error" in result:
                raise BmcError(self.node, self.address,
                               f"BMC {self.address} rejected boot device {target} for {self.node}: {result['error']}",
                               kind="rejected")

        self._call(f"setting the next boot to {target} ({mode})", send)
        return confirm_boot(self.node, self.address, BootOverride(target, True, mode), self.boot_override())

    def drive_serials(self) -> tuple[str, ...] | None:
        """IPMI keeps no disk inventory."""
        return None

    def _drop_session(self) -> None:
        self._cmd = None
        forget_session(self.address, self._port)

    def close(self) -> None:
        # pyghmi shares one session per (BMC, user, password, port) inside the process and
        # would hand it to the next Command for the same BMC however long it idled; the BMC
        # may have expired it by then. Each IpmiBmc logs in afresh instead (not logged out:
        # the BMC expires an idle session itself).
        self._drop_session()
