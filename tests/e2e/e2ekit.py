"""Helpers of the end-to-end tests: systemd containers of the test bed image reached over
SSH, the `provision` command, and what a run left in the state directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

IMAGE = "localhost/provision-base:bookworm"
ROOT = Path(__file__).resolve().parents[2]


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], check=check, capture_output=True, text=True, timeout=timeout)


def have_testbed() -> str | None:
    """Why the end-to-end tests cannot run here (None: they can)."""
    if shutil.which("podman") is None:
        return "podman is not installed (run tests/testbed/setup.sh)"
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        return f"{IMAGE} is missing (run tests/testbed/setup.sh)"
    return None


def remove(names: list[str], net: str) -> None:
    for name in names:
        podman("rm", "-f", "-t", "0", name, check=False)
    podman("network", "rm", "-f", net, check=False)


def start(name: str, net: str, ip: str, pubkey: str, privileges: list[str]) -> None:
    """A systemd container of the test bed image on ``net`` whose root accepts ``pubkey``."""
    podman("run", "-d", "--name", name, "--hostname", name, "--network", net, "--ip", ip, "--systemd=always",
           *privileges, IMAGE, "/sbin/init")
    subprocess.run(
        ["podman", "exec", "-i", name, "bash", "-c",
         "mkdir -p -m 700 /root/.ssh && cat > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys"],
        input=pubkey, text=True, check=True, capture_output=True, timeout=60,
    )


def wait_ssh(ip: str, key: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        r = subprocess.run(
            ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=3", f"root@{ip}", "true"],
            capture_output=True, text=True, timeout=30,
        )
        if r.returncode == 0:
            return
        time.sleep(1)
    raise AssertionError(f"sshd on {ip} did not answer")


def provision(*args: str, cwd: Path, env: dict[str, str], timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    """The installed `provision` of the venv running the tests."""
    exe = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "provision"
    return subprocess.run([str(exe), *args], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def state(work: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((work / ".provision" / "state.json").read_text())
    return data


def heavy_hosts(work: Path, run_id: str) -> set[str]:
    """Hosts that ran a task of a node-local play in run ``run_id`` (from job events)."""
    hosts: set[str] = set()
    for path in (work / ".provision" / "runs" / run_id / "artifacts").rglob("job_events/*.json"):
        data = json.loads(path.read_text()).get("event_data", {})
        if data.get("host") and "base system" in str(data.get("play", "")) and data.get("task"):
            hosts.add(str(data["host"]))
    return hosts
