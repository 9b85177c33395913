"""sushy-tools' Redfish emulator with its fake driver, over TLS, with HTTP basic auth
from a bcrypt htpasswd file (wrong credentials give real 401s).

Quirks of the fake driver that tests must live with: power changes land 1-11 s after
the request (a restart turns the system off at once and on again later), and a boot
override is always read back as "Continuous" even when "Once" was sent.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import bcrypt
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from emulators.ports import free_tcp_port
from emulators.process import EmulatorProcess


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "bmc.crt", directory / "bmc.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )
    return cert_path, key_path


def fake_system(name: str, *, power: str = "Off", mac: str = "52:54:00:00:00:01",
                boot_device: str = "Hdd", boot_mode: str = "UEFI") -> dict[str, Any]:
    return {
        "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.provision.test")),
        "name": name,
        "power_state": power,
        "boot_device": boot_device,
        "boot_mode": boot_mode,
        "nics": [{"mac": mac, "ip": "127.0.0.1"}],
    }


class RedfishEmulator(EmulatorProcess):
    """``with RedfishEmulator(tmp_path, [fake_system("gpu01")], {"admin": "pw"}) as bmc:``"""

    def __init__(self, workdir: Path, systems: list[dict[str, Any]], users: dict[str, str],
                 drives: dict[str, list[str]] | None = None) -> None:
        self.workdir = workdir
        self.systems = systems
        self.users = users
        # system name -> drive ids in its one Storage; sushy-tools serves every drive with
        # SerialNumber "1234570" (its template's)
        self.drives = drives or {}
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = workdir / "sushy-emulator.log"
        self.cert = workdir / "bmc.crt"  # the tests' own requests verify against it

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def uuid(self, name: str) -> str:
        return next(str(s["uuid"]) for s in self.systems if s["name"] == name)

    def _write_config(self) -> Path:
        htpasswd = self.workdir / "htpasswd"
        htpasswd.write_text(
            "".join(f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                    for u, p in self.users.items())
        )
        conf = self.workdir / "emulator.conf"
        conf.write_text(
            "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {json.dumps(self.systems)!s}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(self.workdir / 'state')!r}\n"
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
            f"SUSHY_EMULATOR_LISTEN_PORT = {self.port}\n"
            f"SUSHY_EMULATOR_STORAGE = {self._storage()!r}\n"
            f"SUSHY_EMULATOR_DRIVES = {self._drives()!r}\n"
        )
        return conf

    def _storage(self) -> dict[str, list[dict[str, Any]]]:
        return {self.uuid(name): [{"Id": "1", "Name": "Local Storage Controller", "Drives": ids,
                                   "StorageControllers": [{"MemberId": "0", "Name": "RAID", "SpeedGbps": 12}]}]
                for name, ids in self.drives.items()}

    def _drives(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        return {(self.uuid(name), "1"): [{"Id": i, "Name": f"Drive {i}", "CapacityBytes": 899527000000,
                                          "Protocol": "SAS"} for i in ids]
                for name, ids in self.drives.items()}

    def start(self) -> RedfishEmulator:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert, key = self_signed_cert(self.workdir)
        for _attempt in range(3):
            self.port = free_tcp_port()
            conf = self._write_config()
            log = self._log.open("ab")
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "sushy_tools.emulator.main", "--config", str(conf),
                 "--ssl-certificate", str(cert), "--ssl-key", str(key)],
                stdout=log, stderr=subprocess.STDOUT,
            )
            log.close()
            if self._wait_ready(20.0):
                return self
            self.stop()
        raise RuntimeError(f"sushy-emulator did not start; see {self._log}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            try:
                if requests.get(f"{self.url}/redfish/v1/", verify=str(self.cert), timeout=2).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.2)
        return False


    # ------------------------------------------------------------------ inspection
    def system(self, name: str) -> dict[str, Any]:
        """The system resource as the emulator serves it (with the first user's login)."""
        user, password = next(iter(self.users.items()))
        resp = requests.get(f"{self.url}/redfish/v1/Systems/{self.uuid(name)}", auth=(user, password),
                            verify=str(self.cert), timeout=10)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def power(self, name: str) -> str:
        return str(self.system(name)["PowerState"])

    def boot_target(self, name: str) -> str:
        return str(self.system(name)["Boot"]["BootSourceOverrideTarget"])


class RedfishPxeBootWatch:
    """Counts the times a system came on (Off -> On) with a PXE override: the fake
    driver has no boot log, so this watches the power state like an operator would."""

    def __init__(self, emulator: RedfishEmulator, name: str) -> None:
        self.emulator = emulator
        self.name = name
        self.count = 0
        self._last: str | None = None

    def __call__(self) -> int:
        system = self.emulator.system(self.name)
        power = system["PowerState"]
        if self._last == "Off" and power == "On" and system["Boot"]["BootSourceOverrideTarget"] == "Pxe":
            self.count += 1
        self._last = power
        return self.count
