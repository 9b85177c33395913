"""Run ipmi_bmc.py as a subprocess on a free UDP port; read its state file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from emulators.ports import free_udp_port
from emulators.process import EmulatorProcess

SCRIPT = Path(__file__).with_name("ipmi_bmc.py")


class IpmiEmulator(EmulatorProcess):
    """``with IpmiEmulator(tmp_path, "admin", "pw") as bmc: bmc.port, bmc.state()``"""

    def __init__(self, workdir: Path, user: str, password: str, *, boot_delay: float = 1.0) -> None:
        self.workdir = workdir
        self.user = user
        self.password = password
        self.boot_delay = boot_delay
        self.port = 0
        self.state_file = workdir / "ipmi-state.json"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> IpmiEmulator:
        self.workdir.mkdir(parents=True, exist_ok=True)
        secret = self.workdir / "ipmi.pass"
        secret.write_text(self.password + "\n")
        secret.chmod(0o600)
        self.port = self.port or free_udp_port()  # a restart keeps the port: the same BMC, back
        self.state_file.unlink(missing_ok=True)  # written again once it listens
        log = (self.workdir / "ipmi-bmc.log").open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--port", str(self.port), "--user", self.user,
             "--password-file", str(secret), "--state-file", str(self.state_file),
             "--boot-delay", str(self.boot_delay)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 20
        while not self.state_file.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the IPMI emulator did not start; see {self.workdir / 'ipmi-bmc.log'}")
            time.sleep(0.1)
        return self


    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.state_file.read_text())
        return data

    def boots(self) -> list[dict[str, Any]]:
        return list(self.state()["boots"])
