"""The deployed node's way from BMC power-on to its first job, split by phase (pure).

Read from what the lab has anyway: the PXE server's nginx log (each request's end, in head1's
clock, and its bytes), the deploy agent's step lines on pxe1's console, and the host's clock at
power-on, at SSH, when apply ended and when the first ``srun`` came back. The two clocks meet
through ``offset`` (head1's clock minus the host's, read once).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from provisioner.image import agent

# nginx's "combined" format: addr - user [time_local] "request" status bytes ...
_NGINX = re.compile(r'^(?P<addr>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<path>\S+) [^"]*" '
                    r"(?P<status>\d{3}) (?P<bytes>\d+)")
_STEP = re.compile(r"provision-deploy: (?P<step>[a-z]+) done in (?P<s>\d+) s")
# the agent's steps from the image download on (those before it take no time worth a row)
DEPLOY_STEPS = agent.STEPS[agent.STEPS.index("download"):]


@dataclass(frozen=True)
class Request:
    at: float  # when nginx finished it (epoch seconds, head1's clock)
    method: str
    path: str
    status: int
    bytes: int


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    detail: str = ""


def requests(log: str, client: str) -> list[Request]:
    """The requests ``client`` made, in the log's order."""
    found = []
    for line in log.splitlines():
        m = _NGINX.match(line)
        if m and m["addr"] == client:
            at = dt.datetime.strptime(m["time"], "%d/%b/%Y:%H:%M:%S %z").timestamp()
            found.append(Request(at, m["method"], m["path"], int(m["status"]), int(m["bytes"])))
    return found


def deploy_steps(console: str) -> dict[str, float]:
    """The agent's seconds per step, from its last deploy on the console."""
    steps: dict[str, float] = {}
    for m in _STEP.finditer(console):
        if m["step"] == DEPLOY_STEPS[0]:
            steps = {}  # a later deploy: its steps alone
        steps[m["step"]] = float(m["s"])
    return steps


def _first(reqs: Sequence[Request], path: str, method: str = "GET") -> Request:
    found = next((r for r in reqs if r.path == path and r.method == method and r.status < 400), None)
    if found is None:
        raise ValueError(f"no {method} {path} in the PXE server's log")
    return found


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def pxe_phases(reqs: Sequence[Request], steps: Mapping[str, float], *, node: str, image: str, powered_on: float,
               ssh_up: float, applied: float, first_job: float, offset: float) -> list[Phase]:
    """From power-on to the first job, one phase after the other (host clock, seconds; the
    server's log times moved by ``offset``): their sum is the whole."""
    def host(r: Request) -> float:
        return r.at - offset

    script, kernel = _first(reqs, f"/boot/{node}.ipxe"), _first(reqs, "/images/deploy-ramdisk/vmlinuz")
    initrd, plan = _first(reqs, "/images/deploy-ramdisk/initrd.img"), _first(reqs, f"/nodes/{node}/deploy.json")
    tarball, report = _first(reqs, f"/images/{image}"), _first(reqs, f"/api/installed/{node}", "POST")
    deploy = host(report) - host(plan)
    download = steps.get("download", 0.0)
    rate = f", {tarball.bytes / 1e6 / download:.0f} MB/s" if download else ""
    shown = ", ".join(f"{s} {steps[s]:.0f}" for s in DEPLOY_STEPS if s in steps)
    ramdisk = kernel.bytes + initrd.bytes
    took = host(initrd) - host(script)
    return [
        Phase("firmware, DHCP, iPXE", host(script) - powered_on, "power-on to the boot script"),
        Phase("deploy ramdisk transfer", took, f"{_mb(ramdisk)}, {ramdisk / 1e6 / max(took, 1.0):.0f} MB/s"),
        Phase("ramdisk boot to the agent", host(plan) - host(initrd), "kernel and systemd of the ramdisk"),
        Phase("deploy (agent)", deploy, f"image {_mb(tarball.bytes)}{rate}; steps (s): {shown}"),
        Phase("reboot to disk, first boot, SSH", ssh_up - host(report), "second iPXE, boot loader, kernel"),
        Phase("first converge", applied - ssh_up, "apply's roles on the node"),
        Phase("Slurm registration, first srun", first_job - applied, "sinfo idle, srun hostname"),
    ]


def table(phases: Sequence[Phase]) -> str:
    total = sum(p.seconds for p in phases)
    width = max(len(p.name) for p in phases)
    lines = [f"  {p.name:<{width}} {p.seconds:6.0f} s {100 * p.seconds / total:4.0f} %  {p.detail}".rstrip()
             for p in phases]
    return "\n".join(["[lab] pxe1 from BMC power-on to its first job, by phase:", *lines,
                      f"  {'total':<{width}} {total:6.0f} s"])
