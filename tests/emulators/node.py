"""A fake bare-metal node for the install lifecycle: it watches its BMC emulator and,
when it sees itself boot from PXE, plays the installer: an installer SSH server with
its own host key comes up, the "installed" report goes to the PXE state service with
the new system's host key, and after a short "reboot" SSH answers with that key."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from types import TracebackType

import paramiko

from emulators.ssh import FakeSshServer, new_host_key, public_line

BootWatch = Callable[[], int]  # how many PXE boots the node has seen so far


class FakeNode:
    def __init__(self, name: str, pxe_boots: BootWatch, report_url: str, *,
                 install_seconds: float = 0.5, reboot_seconds: float = 0.5, poll: float = 0.2) -> None:
        self.name = name
        self.pxe_boots = pxe_boots
        self.report_url = report_url
        self.install_seconds = install_seconds
        self.reboot_seconds = reboot_seconds
        self.poll = poll
        self.installer_key: paramiko.PKey = new_host_key()
        self.system_key: paramiko.PKey = new_host_key()
        self.ssh = FakeSshServer(self.installer_key)
        self.installs = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"fake-node-{name}")

    @property
    def ssh_port(self) -> int:
        return self.ssh.port

    def _run(self) -> None:
        seen = self.pxe_boots()
        while not self._stop.wait(self.poll):
            try:
                now = self.pxe_boots()
            except Exception as exc:  # the emulator may be busy; try again
                self.errors.append(f"watch: {exc}")
                continue
            if now > seen:
                seen = now
                self._install()

    def _install(self) -> None:
        self.ssh.stop()
        self.ssh.host_key = self.installer_key  # the installer's own SSH server
        self.ssh.start()
        time.sleep(self.install_seconds)
        body = (public_line(self.system_key) + f" root@{self.name}\n").encode()
        request = urllib.request.Request(self.report_url, data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:  # the late command's report
                resp.read()
        except Exception as exc:
            self.errors.append(f"report: {exc}")
            return
        time.sleep(self.reboot_seconds)
        self.ssh.stop()
        self.ssh.host_key = self.system_key  # the installed system
        self.ssh.start()
        self.installs += 1

    def start(self) -> FakeNode:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.ssh.stop()

    def __enter__(self) -> FakeNode:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
