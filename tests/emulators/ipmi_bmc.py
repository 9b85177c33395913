#!/usr/bin/env python3
"""An IPMI 2.0 (RMCP+) BMC on 127.0.0.1 for tests, built on pyghmi's server side.

Beyond pyghmi's bundled fake BMC it implements power cycle (off at once, on again after
--boot-delay seconds), keeps the boot flags a client sets (device, persistent, UEFI)
and answers them back like a real BMC, clears a one-time override at the next boot,
and logs every boot (device and mode) to the JSON --state-file, which tests read.

Two fixes make pyghmi's server negotiate like a real BMC: it declines cipher suites
other than 3 (pyghmi's server only speaks suite 3 but accepts any proposal, so a client
proposing suite 17 would fail its handshake instead of falling back), and it answers an
unknown user name with RAKP2 "unauthorized name" instead of silence.

Run: ipmi_bmc.py --port N --user NAME --password-file FILE --state-file FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any

import pyghmi.ipmi.bmc as bmc
import pyghmi.ipmi.private.constants as constants
import pyghmi.ipmi.private.serversession as serversession

AUTH_HMAC_SHA1 = 1
RMCP_NO_CIPHER_SUITE_MATCH = 0x11
RMCP_UNAUTHORIZED_NAME = 0x0D
COMPLETION_NOT_IN_PRESENT_STATE = 0xD5

_open_session = serversession.ServerSession.create_open_session_response
_got_rakp1 = serversession.ServerSession._got_rakp1


def _negotiating_open_session(self: Any, request: bytearray) -> bytearray:
    if len(request) > 12 and request[12] != AUTH_HMAC_SHA1:
        self.clientsessionid = request[4:8]
        return bytearray([request[0], RMCP_NO_CIPHER_SUITE_MATCH, 0, 0]) + request[4:8]
    result: bytearray = _open_session(self, request)
    return result


def _rakp1_rejecting_unknown_users(self: Any, data: bytearray) -> Any:
    name = bytes(data[28:]).decode("utf-8", errors="replace")
    if data[27] and self.authdata.get(name) is None:
        reply = bytearray([data[0], RMCP_UNAUTHORIZED_NAME, 0, 0]) + self.clientsessionid
        self.send_payload(reply, constants.payload_types["rakp2"], retry=False)
        return None
    return _got_rakp1(self, data)


serversession.ServerSession.create_open_session_response = _negotiating_open_session
serversession.ServerSession._got_rakp1 = _rakp1_rejecting_unknown_users


def _drop_sessionless(self: Any, data: bytes, sockaddr: Any) -> None:
    """A packet for no session this BMC keeps (one it dropped): pyghmi's server calls a
    client-only method here and the whole emulator died (seen in the VM lab, when the client
    reused a session the server no longer had). A real BMC ignores such a packet."""


serversession.ServerSession.sessionless_data = _drop_sessionless
# A session's integrity key exists once RAKP3 is done; pyghmi's client sessions start with
# k1 = None and drop an authenticated packet that comes before it, its server sessions had no
# k1 at all and the whole emulator died of such a packet (an AttributeError, seen in the VM
# lab under load: the client's next request overtook the session's last setup step). A real
# BMC drops it and the client sends it again.
serversession.ServerSession.k1 = None

DEVICES = {0x0: "default", 0x1: "network", 0x2: "hd", 0x3: "safe", 0x5: "optical", 0x6: "setup", 0xF: "floppy"}


class EmulatedBmc(bmc.Bmc):  # type: ignore[misc]
    def __init__(self, authdata: dict[str, str], port: int, state_file: Path, boot_delay: float) -> None:
        super().__init__(authdata, port=port, address="127.0.0.1")
        self.state_file = state_file
        self.boot_delay = boot_delay
        self.lock = threading.Lock()
        self.power = "off"
        self.flags = 0  # boot flags byte 1: bit7 valid, bit6 persistent, bit5 UEFI
        self.device = 0  # boot flags byte 2: device selector << 2
        self.boots: list[dict[str, Any]] = []
        self.save()

    # ------------------------------------------------------------------ state file
    def save(self) -> None:
        data = {
            "power": self.power,
            "override": {
                "valid": bool(self.flags & 0x80),
                "persistent": bool(self.flags & 0x40),
                "uefi": bool(self.flags & 0x20),
                "device": DEVICES.get((self.device >> 2) & 0xF, "unknown"),
            },
            "boots": self.boots,
        }
        fd, tmp = tempfile.mkstemp(dir=self.state_file.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, self.state_file)

    def _boot(self) -> None:
        valid = bool(self.flags & 0x80)
        device = DEVICES.get((self.device >> 2) & 0xF, "unknown") if valid else "default"
        self.boots.append({"device": device, "uefi": bool(self.flags & 0x20) if valid else None})
        if valid and not self.flags & 0x40:  # a one-time override is used up
            self.flags, self.device = 0, 0
        self.power = "on"
        self.save()

    def _delayed_boot(self) -> None:
        with self.lock:
            if self.power == "off":
                self._boot()

    # ------------------------------------------------------------------ power
    def get_power_state(self) -> str:
        return self.power

    def power_on(self) -> int:
        with self.lock:
            if self.power == "off":
                self._boot()
        return 0

    def power_off(self) -> int:
        with self.lock:
            self.power = "off"
            self.save()
        return 0

    def power_shutdown(self) -> int:
        return self.power_off()

    def power_cycle(self) -> int:
        with self.lock:
            if self.power == "off":
                return COMPLETION_NOT_IN_PRESENT_STATE
            self.power = "off"
            self.save()
        threading.Timer(self.boot_delay, self._delayed_boot).start()
        return 0

    def power_reset(self) -> int:
        with self.lock:
            if self.power == "off":
                return COMPLETION_NOT_IN_PRESENT_STATE
            self._boot()
        return 0

    # ------------------------------------------------------------------ boot flags
    def get_system_boot_options(self, request: dict[str, Any], session: Any) -> Any:
        if request["data"][0] & 0x7F == 5:
            with self.lock:
                data = [1, 5, self.flags, self.device, 0, 0, 0]
            return session.send_ipmi_response(data=data)
        return session.send_ipmi_response(code=0x80)

    def set_system_boot_options(self, request: dict[str, Any], session: Any) -> Any:
        data = request["data"]
        param = data[0] & 0x7F
        if param == 5 and len(data) >= 3:
            with self.lock:
                self.flags, self.device = data[1], data[2]
                self.save()
            return session.send_ipmi_response()
        if param in (0, 3, 4):  # set-in-progress, service partition, acknowledge: accepted
            return session.send_ipmi_response()
        return session.send_ipmi_response(code=0x80)

    def get_system_guid(self) -> Any:
        return self.uuid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="IPMI BMC emulator for tests")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-file", required=True)
    parser.add_argument("--state-file", required=True)
    parser.add_argument("--boot-delay", type=float, default=1.0)
    args = parser.parse_args(argv)
    password = Path(args.password_file).read_text().strip()
    server = EmulatedBmc({args.user: password}, args.port, Path(args.state_file), args.boot_delay)
    while True:  # a packet pyghmi's server cannot handle costs that packet, not the BMC
        try:
            server.listen(timeout=30)
        except Exception:  # logged; the BMC answers the next packet
            traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
