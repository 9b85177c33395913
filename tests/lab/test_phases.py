"""pxe1's phases from power-on to its first job, from the logs the lab keeps (a unit test:
no VM; the lab prints the table from its own run)."""

from __future__ import annotations

import datetime as dt

import pytest

from lab import phases

NODE, ADDR, IMAGE = "pxe1", "10.213.9.20", "debian-12.tar.zst"
T0 = dt.datetime(2026, 11, 28, 1, 40, 0, tzinfo=dt.UTC).timestamp()


def line(addr: str, second: int, request: str, status: int, size: int) -> str:
    at = dt.datetime.fromtimestamp(T0 + second, dt.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
    return f'{addr} - - [{at}] "{request} HTTP/1.1" {status} {size} "-" "iPXE/1.21.1"'


LOG = "\n".join([
    line("10.213.9.11", 1, "GET /boot/store1.ipxe", 200, 10),  # another client
    line(ADDR, 20, f"GET /boot/{NODE}.ipxe", 200, 300),
    line(ADDR, 24, "GET /images/deploy-ramdisk/vmlinuz", 200, 8_000_000),
    line(ADDR, 44, "GET /images/deploy-ramdisk/initrd.img", 200, 122_000_000),
    line(ADDR, 70, f"GET /nodes/{NODE}/deploy.json", 200, 4000),
    line(ADDR, 82, f"GET /images/{IMAGE}", 200, 255_000_000),
    line(ADDR, 180, f"POST /api/installed/{NODE}", 200, 2),
    line(ADDR, 200, f"GET /boot/{NODE}.ipxe", 200, 120),
])
CONSOLE = """[  OK  ] Started provision-deploy.service
provision-deploy: download done in 12 s
provision-deploy: partition done in 4 s
[   80.1] EXT4-fs (vda3): mounted filesystem
provision-deploy: filesystem done in 1 s
provision-deploy: extract done in 30 s
provision-deploy: identity done in 1 s
provision-deploy: bootloader done in 33 s
provision-deploy: hostkeys done in 5 s
provision-deploy: pxe1 deployed in 110 s
"""


def test_requests_are_the_clients_own_with_their_times_and_bytes() -> None:
    found = phases.requests(LOG + "\nnot a log line", ADDR)
    assert [r.path for r in found][:2] == [f"/boot/{NODE}.ipxe", "/images/deploy-ramdisk/vmlinuz"]
    assert len(found) == 7 and found[0].at == T0 + 20 and found[4].bytes == 255_000_000
    assert found[5] == phases.Request(T0 + 180, "POST", f"/api/installed/{NODE}", 200, 2)


def test_deploy_steps_are_the_last_deploys() -> None:
    first = CONSOLE.replace("download done in 12", "download done in 99").replace("bootloader", "x")
    assert phases.deploy_steps(first + CONSOLE) == {"download": 12, "partition": 4, "filesystem": 1, "extract": 30,
                                                   "identity": 1, "bootloader": 33, "hostkeys": 5}


def test_the_phases_follow_each_other_and_add_up_to_the_whole() -> None:
    offset = 2.0  # head1's clock runs 2 s ahead of the host's
    found = phases.pxe_phases(phases.requests(LOG, ADDR), phases.deploy_steps(CONSOLE), node=NODE, image=IMAGE,
                              powered_on=T0 + 10 - offset, ssh_up=T0 + 260, applied=T0 + 400, first_job=T0 + 430,
                              offset=offset)
    assert [(p.name, p.seconds) for p in found] == [
        ("firmware, DHCP, iPXE", 10), ("deploy ramdisk transfer", 24), ("ramdisk boot to the agent", 26),
        ("deploy (agent)", 110), ("reboot to disk, first boot, SSH", 82), ("first converge", 140),
        ("Slurm registration, first srun", 30)]
    assert sum(p.seconds for p in found) == 430 - 10 + offset
    assert found[1].detail == "130 MB, 5 MB/s"
    assert found[3].detail == ("image 255 MB, 21 MB/s; steps (s): download 12, partition 4, filesystem 1, "
                               "extract 30, identity 1, bootloader 33, hostkeys 5")
    text = phases.table(found)
    assert text.splitlines()[0] == "[lab] pxe1 from BMC power-on to its first job, by phase:"
    assert "  deploy (agent)                     110 s   26 %  image 255 MB" in text
    assert text.splitlines()[-1].split() == ["total", "422", "s"]


def test_a_missing_request_is_named() -> None:
    log = "\n".join(ln for ln in LOG.splitlines() if "deploy.json" not in ln)
    with pytest.raises(ValueError, match=f"no GET /nodes/{NODE}/deploy.json in the PXE server's log"):
        phases.pxe_phases(phases.requests(log, ADDR), {}, node=NODE, image=IMAGE, powered_on=T0, ssh_up=T0,
                          applied=T0, first_job=T0, offset=0)
