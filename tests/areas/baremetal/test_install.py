"""The bare-metal install lifecycle (provisioner.areas.baremetal.install) and the PXE server's
install-state service (roles/pxe_server/files/pxe_state_server.py), end to end against
emulated BMCs: a Redfish BMC (sushy-tools), an IPMI BMC (pyghmi), fake nodes that
"install" when they PXE boot, and the real pxe-state service on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[2]
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators.creds import IPMI_PASSWORD, REDFISH_PASSWORD  # noqa: E402
from emulators.ipmi import IpmiEmulator  # noqa: E402
from emulators.manifests import ipmi_bmc, manifest, node_dict, redfish_bmc  # noqa: E402
from emulators.node import FakeNode  # noqa: E402
from emulators.redfish import RedfishEmulator, RedfishPxeBootWatch, fake_system  # noqa: E402
from emulators.ssh import FakeSshServer, new_host_key, public_line  # noqa: E402

from provisioner.areas.baremetal import install as bm  # noqa: E402
from provisioner.bmc import BootConfirmation, BootOverride, make_bmc  # noqa: E402
from provisioner.manifest.model import Manifest  # noqa: E402
from provisioner.manifest.nodes import Node  # noqa: E402

ROOT = TESTS.parent
STATE_SERVER = ROOT / "roles/pxe_server/files/pxe_state_server.py"
ENV = {"TEST_BMC_PASSWORD": REDFISH_PASSWORD, "TEST_IPMI_PASSWORD": IPMI_PASSWORD, "WRONG_PASSWORD": "nope"}
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def load_state_server() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pxe_state_server", STATE_SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pxe_state_server"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


pxs = load_state_server()


# --------------------------------------------------------------------------- pxe-state
@dataclass
class StateService:
    cfg: Any
    url: str

    def arm(self, *nodes: str) -> None:
        for node in nodes:
            pxs.write_state(self.cfg, node, {"state": "armed"})

    def state(self, node: str) -> dict[str, Any]:
        return dict(pxs.read_state(self.cfg, node))


def state_config(tmp: Path, nodes: dict[str, str | None], check_source: bool = True) -> Any:
    http_root = tmp / "http"
    for node in nodes:
        (http_root / "nodes" / node).mkdir(parents=True, exist_ok=True)
        (http_root / "nodes" / node / "install.ipxe").write_text(f"#!ipxe\nkernel http://head/{node}/vmlinuz\nboot\n")
    return pxs.Config(nodes=nodes, state_dir=tmp / "state", http_root=http_root, check_source=check_source)


@pytest.fixture
def state_service(tmp_path: Path) -> Iterator[StateService]:
    cfg = state_config(tmp_path, {f"gpu0{i}": "127.0.0.1" for i in range(1, 5)})
    server = pxs.make_server(cfg, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield StateService(cfg, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_boot_script_follows_the_state(tmp_path: Path) -> None:
    cfg = state_config(tmp_path, {"gpu01": "10.0.0.21"})
    status, _, body = pxs.route(cfg, "GET", "/boot/gpu01.ipxe", "10.0.0.21", "")
    assert status == 200 and "sanboot --no-describe --drive 0x80" in body and "kernel" not in body
    pxs.write_state(cfg, "gpu01", {"state": "armed"})
    assert pxs.route(cfg, "GET", "/boot/gpu01.ipxe", "10.0.0.21", "")[2].startswith("#!ipxe\nkernel http://head/")
    assert pxs.route(cfg, "GET", "/boot/gpu09.ipxe", "10.0.0.21", "")[0] == 404
    assert pxs.route(cfg, "GET", "/boot/../etc/passwd.ipxe", "10.0.0.21", "")[0] == 404


def test_report_flips_only_that_node_and_only_from_its_address(tmp_path: Path) -> None:
    cfg = state_config(tmp_path, {"gpu01": "10.0.0.21", "gpu02": "10.0.0.22"})
    pxs.write_state(cfg, "gpu01", {"state": "armed"})
    pxs.write_state(cfg, "gpu02", {"state": "armed"})
    assert pxs.route(cfg, "POST", "/api/installed/gpu02", "10.0.0.21", KEY_A)[0] == 403
    assert pxs.route(cfg, "POST", "/api/installed/gpu01", "10.0.0.21", "rm -rf /")[0] == 400
    status, _, body = pxs.route(cfg, "POST", "/api/installed/gpu01", "10.0.0.21", KEY_A + " root@gpu01\n")
    assert status == 200
    assert json.loads(body)["host_keys"] == [KEY_A]
    assert pxs.read_state(cfg, "gpu01")["state"] == "installed"
    assert pxs.read_state(cfg, "gpu02")["state"] == "armed"
    # the installer may retry its report: still installed, nothing else changes
    assert pxs.route(cfg, "POST", "/api/installed/gpu01", "10.0.0.21", KEY_A)[0] == 200
    # a node that is not armed cannot be flipped
    assert pxs.route(cfg, "POST", "/api/installed/gpu09", "10.0.0.29", KEY_A)[0] == 404


def test_a_failed_deploy_is_recorded_with_its_step_and_boots_the_disk(tmp_path: Path) -> None:
    cfg = state_config(tmp_path, {"gpu01": "10.0.0.21", "gpu02": "10.0.0.22"})
    pxs.write_state(cfg, "gpu01", {"state": "armed"})
    failure = "download: image checksum mismatch: expected 00, got ff; no disk was touched\n"
    assert pxs.route(cfg, "POST", "/api/failed/gpu01", "10.0.0.22", failure)[0] == 403
    assert pxs.route(cfg, "POST", "/api/failed/gpu01", "10.0.0.21", "two\nlines: x")[0] == 400
    assert pxs.route(cfg, "POST", "/api/failed/gpu02", "10.0.0.22", failure)[0] == 409  # not armed
    status, _, body = pxs.route(cfg, "POST", "/api/failed/gpu01", "10.0.0.21", failure)
    assert status == 200 and json.loads(body)["step"] == "download"
    state = pxs.read_state(cfg, "gpu01")
    assert state["state"] == "failed" and state["message"].startswith("image checksum mismatch")
    assert "sanboot" in pxs.route(cfg, "GET", "/boot/gpu01.ipxe", "10.0.0.21", "")[2]  # no deploy loop
    report = bm.parse_report(json.loads(pxs.route(cfg, "GET", "/api/status/gpu01", "127.0.0.1", "")[2]))
    assert report.failure == "download: image checksum mismatch: expected 00, got ff; no disk was touched"


def test_unarmed_node_cannot_report(tmp_path: Path) -> None:
    cfg = state_config(tmp_path, {"gpu01": "10.0.0.21"})
    assert pxs.route(cfg, "POST", "/api/installed/gpu01", "10.0.0.21", KEY_A)[0] == 409
    assert pxs.read_state(cfg, "gpu01") == {"state": "local"}


def test_arming_expires(tmp_path: Path) -> None:
    cfg = state_config(tmp_path, {"gpu01": "10.0.0.21", "gpu02": "10.0.0.22"})
    pxs.write_state(cfg, "gpu01", {"state": "armed", "expires": time.time() - 1})
    pxs.write_state(cfg, "gpu02", {"state": "armed", "expires": time.time() + 3600})
    assert pxs.read_state(cfg, "gpu01")["state"] == "local"
    assert "sanboot" in pxs.route(cfg, "GET", "/boot/gpu01.ipxe", "10.0.0.21", "")[2]
    assert pxs.route(cfg, "POST", "/api/installed/gpu01", "10.0.0.21", KEY_A)[0] == 409
    assert pxs.route(cfg, "GET", "/boot/gpu02.ipxe", "10.0.0.22", "")[2].startswith("#!ipxe\nkernel")


def test_source_check_can_be_turned_off_for_proxy_dhcp(tmp_path: Path) -> None:
    cfg = state_config(tmp_path, {"gpu01": "10.0.0.21"}, check_source=False)
    pxs.write_state(cfg, "gpu01", {"state": "armed"})
    assert pxs.route(cfg, "POST", "/api/installed/gpu01", "10.0.0.99", KEY_A)[0] == 200


def test_key_parsing() -> None:
    assert pxs.parse_keys(f"{KEY_A} c\n\n{KEY_A}\n") == [KEY_A]
    assert pxs.parse_keys("") == []
    assert pxs.parse_keys("not a key") is None
    assert pxs.parse_keys("\n".join(f"ssh-rsa AAAA{i}" for i in range(9))) is None


def test_state_service_over_http(state_service: StateService) -> None:
    state_service.arm("gpu01")

    def call(path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(state_service.url + path, data=body, headers=headers or {},
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert call("/api/status/gpu01") == (200, json.dumps({"node": "gpu01", "state": "armed"}, sort_keys=True) + "\n")
    # behind nginx, X-Real-IP names the client; only a local peer may set it
    assert call("/api/installed/gpu01", KEY_A.encode(), {"X-Real-IP": "10.9.9.9"})[0] == 403
    assert call("/api/installed/gpu01", b"x" * 20000)[0] == 413
    assert call("/api/installed/gpu01", KEY_A.encode())[0] == 200
    status, body = call("/api/status")
    assert status == 200 and json.loads(body)["nodes"]["gpu01"]["state"] == "installed"
    assert "sanboot" in call("/boot/gpu01.ipxe")[1]
    assert call("/nope")[0] == 404


# --------------------------------------------------------------------------- known_hosts
def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def test_known_hosts_replaces_plain_and_hashed_entries() -> None:
    old = "\n".join([
        "# comment",
        "gpu01,10.0.0.21 ssh-ed25519 AAAAold",
        f"{hashed('gpu01.lab.test')} ssh-rsa AAAAold",
        "gpu02 ssh-ed25519 AAAAkeep",
        "@cert-authority gpu01 ssh-ed25519 AAAAca",
    ])
    new = bm.updated_known_hosts(old, ["gpu01", "gpu01.lab.test", "10.0.0.21"], [KEY_A])
    assert new.splitlines() == ["# comment", "gpu02 ssh-ed25519 AAAAkeep", f"gpu01,gpu01.lab.test,10.0.0.21 {KEY_A}"]


def test_known_hosts_names_carry_a_non_default_port() -> None:
    assert bm.known_hosts_names(["gpu01", "10.0.0.21"], 22) == ["gpu01", "10.0.0.21"]
    assert bm.known_hosts_names(["gpu01"], 2222) == ["[gpu01]:2222"]


def test_record_host_keys_keeps_the_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("other ssh-ed25519 AAAA\n")
    path.chmod(0o600)
    bm.record_host_keys(path, ["gpu01"], [KEY_A])
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == f"other ssh-ed25519 AAAA\ngpu01 {KEY_A}\n"


def test_scan_host_keys_reads_the_server_key() -> None:
    key = new_host_key()
    with FakeSshServer(key) as sshd:
        assert bm.scan_host_keys("127.0.0.1", sshd.port, timeout=5) == [public_line(key)]
    with pytest.raises(OSError, match="no SSH server"):
        bm.scan_host_keys("127.0.0.1", sshd.port, timeout=1)


# --------------------------------------------------------------------------- planning
def lab_manifest(redfish_port: int = 1, redfish_ids: dict[str, str] | None = None, ipmi_port: int = 2) -> Manifest:
    ids = redfish_ids or {}
    return manifest([
        node_dict("gpu01", 1, bmc=redfish_bmc(redfish_port, system_id=ids.get("gpu01"))),
        node_dict("gpu02", 2, bmc=ipmi_bmc(ipmi_port)),
        node_dict("gpu03", 3, bmc=redfish_bmc(redfish_port, env="WRONG_PASSWORD", system_id=ids.get("gpu03"))),
        node_dict("gpu04", 4, bmc=redfish_bmc(redfish_port, system_id=ids.get("gpu04"))),
        node_dict("gpu05", 5),  # no BMC: installed by hand
    ])


def test_plan_installs_only_new_nodes_marked_for_it_and_named_reinstalls() -> None:
    m = lab_manifest()
    states = {"head": "configured", "gpu03": "installed", "gpu04": "configured", "gpu05": "new"}
    targets, left = bm.plan_installs(m, states)
    assert targets == ["gpu01", "gpu02"]
    by_node = {r.node: r for r in left}
    assert by_node["gpu03"].stage == "skipped" and "--reinstall" in by_node["gpu03"].reason
    assert by_node["gpu04"].ok and by_node["gpu04"].stage == "skipped"
    assert by_node["head"].ok and "install: manual" in by_node["head"].reason
    assert by_node["gpu05"].ok and "install: manual" in by_node["gpu05"].reason
    targets, left = bm.plan_installs(m, states, reinstall=["gpu04"])
    assert targets == ["gpu01", "gpu02", "gpu04"]
    _, left = bm.plan_installs(m, states, reinstall=["head", "gpu05"])
    reasons = {r.node: (r.ok, r.reason) for r in left if r.node in ("head", "gpu05")}
    assert reasons["head"][0] is False and "head node" in reasons["head"][1]
    assert reasons["gpu05"][0] is False and "no bmc section" in reasons["gpu05"][1]
    with pytest.raises(KeyError, match="gpu99"):
        bm.plan_installs(m, states, reinstall=["gpu99"])


def test_a_new_node_with_a_bmc_is_never_installed_without_intent() -> None:
    """Installing wipes disks: a new node that could be installed (BMC, MAC, disks) but is
    not marked install: pxe is configured as it is, whatever state it is in."""
    m = manifest([node_dict("gpu01", 1, bmc=redfish_bmc(1), install="manual"),
                  node_dict("gpu02", 2, bmc=redfish_bmc(2), install="pxe")])
    targets, left = bm.plan_installs(m, {})
    assert targets == ["gpu02"]
    gpu01 = next(r for r in left if r.node == "gpu01")
    assert gpu01.ok and gpu01.stage == "skipped" and "install: manual" in gpu01.reason
    assert bm.plan_installs(m, {}, reinstall=["gpu01"])[0] == ["gpu01", "gpu02"]  # --reinstall is intent too


# --------------------------------------------------------------------------- lifecycle, faked
class RecordingBmc:
    def __init__(self, node: str) -> None:
        self.node, self.address, self.calls = node, "127.0.0.1", []

    def power_state(self) -> str:
        return "on"

    def power_on(self) -> None:
        self.calls.append("on")

    def power_off(self) -> None:
        self.calls.append("off")

    def power_cycle(self) -> None:
        self.calls.append("cycle")

    def boot_override(self) -> BootOverride:
        return BootOverride("pxe", True, "uefi")

    def set_boot_once(self, target: str, mode: str) -> BootConfirmation:
        self.calls.append(f"pxe-{mode}")
        return BootConfirmation(BootOverride(target, True, mode), BootOverride(target, True, mode))  # type: ignore[arg-type]

    def close(self) -> None:
        self.calls.append("close")


def armed_then(report: bm.InstallReport) -> bm.ReportProbe:
    """A PXE server that has the node armed until the first poll after the power cycle."""
    calls: list[str] = []

    def probe(node: str) -> bm.InstallReport:
        calls.append(node)
        return bm.InstallReport("armed") if len(calls) == 1 else report

    return probe


FAST = bm.Timeouts(total=2, power_on=2, ssh=2, poll=0.05, ssh_handshake=1)


def run_one(m: Manifest, probe: bm.ReportProbe, tmp: Path, port: int = 1) -> tuple[bm.InstallResult, RecordingBmc]:
    bmcs: dict[str, RecordingBmc] = {}

    def factory(node: Node) -> RecordingBmc:
        return bmcs.setdefault(node.name, RecordingBmc(node.name))

    result = bm.install_nodes(m, ["gpu01"], known_hosts=tmp / "known_hosts", report_probe=probe,
                              bmc_factory=factory, ssh_endpoint=lambda n: ("127.0.0.1", port),  # type: ignore[arg-type]
                              timeouts=FAST)[0]
    return result, bmcs.get("gpu01", RecordingBmc("gpu01"))


def test_node_not_armed_is_not_touched(tmp_path: Path) -> None:
    result, bmc = run_one(lab_manifest(), lambda node: bm.InstallReport("installed"), tmp_path)
    assert not result.ok and result.stage == "pxe"
    assert "not armed" in result.reason and "pxe_server_arm_nodes=[gpu01]" in result.reason
    assert bmc.calls == []


def test_missing_install_report_times_out(tmp_path: Path) -> None:
    result, bmc = run_one(lab_manifest(), lambda node: bm.InstallReport("armed"), tmp_path)
    assert not result.ok and result.stage == "install"
    assert "no install report" in result.reason
    assert bmc.calls == ["pxe-uefi", "cycle", "close"]


def test_a_failed_deploy_ends_the_wait_with_its_step(tmp_path: Path) -> None:
    failed = bm.InstallReport("failed", failure="bootloader: grub-install failed (exit 1)")
    result, bmc = run_one(lab_manifest(), armed_then(failed), tmp_path)
    assert not result.ok and result.stage == "install"
    assert result.reason == ("gpu01: the image deploy failed at bootloader: grub-install failed (exit 1); the node "
                             "stays new (it boots its disk until it is armed again)")
    assert bmc.calls == ["pxe-uefi", "cycle", "close"]


def test_ssh_with_unreported_keys_is_not_trusted(tmp_path: Path) -> None:
    with FakeSshServer(new_host_key()) as sshd:
        result, _ = run_one(lab_manifest(), armed_then(bm.InstallReport("installed", (KEY_A,))), tmp_path,
                            sshd.port)
    assert not result.ok and result.stage == "ssh"
    assert "did not list" in result.reason
    assert not (tmp_path / "known_hosts").exists()


def test_report_without_keys_falls_back_to_first_use(tmp_path: Path) -> None:
    key = new_host_key()
    with FakeSshServer(key) as sshd:
        result, _ = run_one(lab_manifest(), armed_then(bm.InstallReport("installed")), tmp_path, sshd.port)
    assert result.ok, result.reason
    assert any("first use" in w for w in result.warnings)
    assert public_line(key) in (tmp_path / "known_hosts").read_text()


# --------------------------------------------------------------------------- lifecycle, emulated
def wait_until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_new_nodes_are_installed_and_an_installed_node_is_left_alone(tmp_path: Path,
                                                                      state_service: StateService) -> None:
    systems = [fake_system("gpu01", power="Off"), fake_system("gpu03", power="On"),
               fake_system("gpu04", power="Off")]
    with RedfishEmulator(tmp_path / "redfish", systems, {"admin": REDFISH_PASSWORD}) as redfish, \
            IpmiEmulator(tmp_path / "ipmi", "admin", IPMI_PASSWORD, boot_delay=0.5) as ipmi:
        ids = {name: redfish.uuid(name) for name in ("gpu01", "gpu03", "gpu04")}
        m = lab_manifest(redfish.port, ids, ipmi.port)
        state_service.arm("gpu01", "gpu02", "gpu03")
        nodes = {
            "gpu01": FakeNode("gpu01", RedfishPxeBootWatch(redfish, "gpu01"),
                              f"{state_service.url}/api/installed/gpu01"),
            "gpu02": FakeNode("gpu02", lambda: sum(b["device"] == "network" for b in ipmi.boots()),
                              f"{state_service.url}/api/installed/gpu02"),
        }
        ports = {name: node.ssh_port for name, node in nodes.items()}
        targets, _left = bm.plan_installs(m, {"head": "configured", "gpu04": "installed", "gpu05": "configured"})
        assert targets == ["gpu01", "gpu02", "gpu03"]
        events: list[tuple[str, str]] = []
        for node in nodes.values():
            node.start()
        try:
            results = bm.install_nodes(
                m, targets, known_hosts=tmp_path / "known_hosts",
                report_probe=bm.http_report_probe(state_service.url),
                bmc_factory=lambda n: make_bmc(n, timeout=15, retries=1, environ=ENV),
                ssh_endpoint=lambda n: ("127.0.0.1", ports.get(n.name, 1)),
                timeouts=bm.Timeouts(total=120, power_on=40, ssh=40, poll=0.3, ssh_handshake=3),
                on_event=lambda node, msg: events.append((node, msg)),
            )
        finally:
            for node in nodes.values():
                node.stop()

        by_node = {r.node: r for r in results}
        assert [r.node for r in results] == ["gpu01", "gpu02", "gpu03"]
        assert by_node["gpu01"].ok, by_node["gpu01"]
        assert by_node["gpu02"].ok, by_node["gpu02"]
        # one node's bad BMC password fails that node only, with our message
        assert not by_node["gpu03"].ok and by_node["gpu03"].stage == "bmc"
        assert by_node["gpu03"].reason.startswith("BMC 127.0.0.1 rejected the credentials for gpu03")
        assert "nope" not in by_node["gpu03"].reason
        # sushy-tools reads the one-time override back as Continuous: a warning, not hidden
        assert any("persistent" in w for w in by_node["gpu01"].warnings)
        assert by_node["gpu02"].warnings == ()

        # each new node booted the installer exactly once, then reported
        assert nodes["gpu01"].installs == 1 and nodes["gpu02"].installs == 1
        assert [b for b in ipmi.boots() if b["device"] == "network"] == [{"device": "network", "uefi": True}]
        assert state_service.state("gpu01")["state"] == "installed"
        assert state_service.state("gpu02")["state"] == "installed"
        assert state_service.state("gpu03")["state"] == "armed"

        # known_hosts has the installed systems' keys, not the installers'
        known = (tmp_path / "known_hosts").read_text()
        for name, node in nodes.items():
            assert public_line(node.system_key) in known
            assert public_line(node.installer_key) not in known
            port = ports[name]
            assert f"[{name}]:{port},[{name}.lab.test]:{port},[{m.node(name).ip}]:{port}," in known
        assert by_node["gpu01"].host_keys == (public_line(nodes["gpu01"].system_key),)

        # the installed node was not touched: still off, still booting from disk
        assert redfish.power("gpu04") == "Off"
        assert redfish.boot_target("gpu04") == "Hdd"
        # and the failed node was not power cycled
        assert redfish.power("gpu03") == "On" and redfish.boot_target("gpu03") == "Hdd"
        assert ("gpu01", "installed and reachable") in events
