"""Shared fixtures for the unit tests.

Test modules are imported with ``--import-mode=importlib`` (see pyproject.toml), so helpers
are handed out as fixtures rather than imported: ``kit`` builds, dumps and loads manifests
and finds the line a value sits on; ``write_manifest`` writes one to a temporary file;
``networkd`` has the real systemd-networkd read rendered .network/.netdev files, ``netplan``
netplan's own generator turn a netplan file into them.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import apply as apply_mod
from provisioner.errors import Diagnostic, ManifestError
from provisioner.validate import Loaded, load_text

ROOT = Path(__file__).resolve().parents[1]


def _signals_as_a_terminal_gives_them() -> None:
    """Commands keep a signal ignored that they were started ignoring (nohup, issue 27), so
    a suite started that way (a background job of a script ignores SIGINT, nohup SIGHUP)
    would hand the ignoring on to the commands whose signal handling it tests. Start every
    child as a terminal would: SIGINT raising KeyboardInterrupt here (SIG_DFL after exec),
    SIGTERM and SIGHUP at their defaults."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


_signals_as_a_terminal_gives_them()

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA ops@test"


def minimal_manifest() -> dict[str, Any]:
    """A small valid manifest without warnings: head01 (head, storage), node01..node02 (compute)."""
    return {
        "version": 1,
        "cluster": {
            "name": "testc",
            "domain": "test.internal",
            "ntp_servers": ["ntp1.example.org", "ntp2.example.org"],
            "admin_users": [{"name": "ops", "ssh_keys": [SSH_KEY]}],
        },
        "networks": {
            "management": {"cidr": "10.0.0.0/24", "gateway": "10.0.0.1"},
            "bmc": {"cidr": "10.0.1.0/24"},
            "data": {"cidr": "10.0.2.0/24", "mtu": 9000},
        },
        "nodes": [
            {
                "name": "head01",
                "roles": ["head", "storage"],
                "os": "ubuntu-24.04",
                "interfaces": {
                    "management": {"ip": "10.0.0.10", "mac": "52:54:00:00:00:10", "interface": "eno1"},
                    "data": {"ip": "10.0.2.10", "interface": "ens1"},
                },
                "bmc": {"type": "ipmi", "address": "10.0.1.10", "user": "admin", "password_env": "TEST_BMC_PASSWORD"},
                "hardware": {
                    "cpu": {"cores_per_socket": 8},
                    "memory_gb": 64,
                    "disks": [{"id": "ata-DISK_[1-4]", "kind": "hdd", "use": "zfs"}],
                },
            },
            {
                "name": "node[01-02]",
                "roles": ["compute"],
                "os": "ubuntu-24.04",
                "interfaces": {
                    "management": {"ip": "10.0.0.21", "mac": "52:54:00:00:00:21", "interface": "eno1"},
                    "data": {"ip": "10.0.2.21", "interface": "ens1"},
                },
                "bmc": {
                    "type": "redfish",
                    "address": "10.0.1.21",
                    "user": "admin",
                    "password_env": "TEST_BMC_PASSWORD",
                },
                "hardware": {
                    "cpu": {"cores_per_socket": 16, "threads_per_core": 2},
                    "memory_gb": 128,
                    "gpu": {"model": "RTX A6000", "count": 2},
                    "disks": [{"id": "nvme-SCRATCH", "kind": "nvme", "use": "scratch"}],
                },
            },
        ],
        "slurm": {"partitions": [{"name": "batch", "nodes": ["@compute"], "default": True}]},
        # Ubuntu 24.04 compute nodes: Slurm 23.11 fences GPUs with cgroup v2 (22.04 warns)
        "software": {"cuda": {"versions": ["12.6"]}},
    }


def storage_sections() -> dict[str, Any]:
    """zfs + nfs + mergerfs sections that fit :func:`minimal_manifest`."""
    return {
        "zfs": {
            "pools": [
                {
                    "name": "tank",
                    "node": "head01",
                    "vdevs": {"type": "mirror", "width": 2, "disks": ["ata-DISK_[1-4]"]},
                    "datasets": [{"name": "data", "properties": {"recordsize": "1M"}}],
                }
            ]
        },
        "nfs": {
            "exports": [{"name": "data", "node": "head01", "dataset": "tank/data", "clients": ["data"]}],
            "mounts": [{"export": "data", "path": "/data", "nodes": ["@compute"]}],
        },
        "mergerfs": [{"path": "/union", "branches": ["/data", "/scratch"], "nodes": ["node01"]}],
    }


# Driver/CUDA each OS can install (the manifest checks of the gpu area insist on them).
SOFTWARE_FOR_OS = {
    "debian-12": {"nvidia_driver": {"branch": "535", "source": "debian"},
                  "cuda": {"versions": ["11.8"], "source": "debian"}},
    "ubuntu-24.04": {"nvidia_driver": {"branch": "580"}, "cuda": {"versions": ["12.8"]}},
}


class Kit:
    """Manifest helpers for tests."""

    @staticmethod
    def on_os(data: dict[str, Any], os_name: str, nodes: tuple[int, ...] | None = None) -> dict[str, Any]:
        """Put the manifest's nodes (all, or those indexes) on ``os_name`` with fitting software."""
        for i, node in enumerate(data["nodes"]):
            if nodes is None or i in nodes:
                node["os"] = os_name
        data["software"] = SOFTWARE_FOR_OS[os_name]
        return data

    root = ROOT
    examples = ROOT / "examples"
    ssh_key = SSH_KEY

    @staticmethod
    def base(storage: bool = False) -> dict[str, Any]:
        data = minimal_manifest()
        if storage:
            data.update(storage_sections())
        return copy.deepcopy(data)

    @staticmethod
    def add_backup_store(data: dict[str, Any]) -> dict[str, Any]:
        """``data`` (a ``base(storage=True)``) with a second storage node, store01, cloned from
        its first node, with two HDDs (``ata-BACKUP_1``, ``_2``) for a pool of its own."""
        store = copy.deepcopy(data["nodes"][0])
        store.update(name="store01", roles=["storage"])
        store["interfaces"]["management"].update(ip="10.0.0.11", mac="52:54:00:00:00:11")
        store["interfaces"]["data"]["ip"] = "10.0.2.11"
        store["bmc"]["address"] = "10.0.1.11"
        store["hardware"]["disks"] = [{"id": "ata-BACKUP_[1-2]", "kind": "hdd", "use": "zfs"}]
        data["nodes"].append(store)
        return data

    @staticmethod
    def example(name: str) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / name).read_text())
        return data

    @staticmethod
    def dump(data: Any) -> str:
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)

    def text(self, data: dict[str, Any] | str) -> str:
        return data if isinstance(data, str) else self.dump(data)

    def load(self, data: dict[str, Any] | str, file: str = "m.yaml") -> Loaded:
        return load_text(self.text(data), file)

    def errors(self, data: dict[str, Any] | str, file: str = "m.yaml") -> list[Diagnostic]:
        with pytest.raises(ManifestError) as info:
            load_text(self.text(data), file)
        return info.value.diagnostics

    def error(self, data: dict[str, Any] | str, contains: str, file: str = "m.yaml") -> Diagnostic:
        """The one diagnostic whose message contains ``contains``."""
        diags = self.errors(data, file)
        hits = [d for d in diags if contains in d.message]
        assert len(hits) == 1, f"expected one diagnostic with {contains!r}, got {[d.format() for d in diags]}"
        return hits[0]

    @staticmethod
    def pos_of(text: str, needle: str, nth: int = 1) -> tuple[int, int]:
        """(line, col), 1-based, of the ``nth`` occurrence of ``needle`` in ``text``."""
        seen = 0
        for number, line in enumerate(text.splitlines(), start=1):
            col = line.find(needle)
            if col >= 0:
                seen += 1
                if seen == nth:
                    return number, col + 1
        raise AssertionError(f"{needle!r} (#{nth}) not found in the text")

    def line_of(self, text: str, needle: str, nth: int = 1) -> int:
        return self.pos_of(text, needle, nth)[0]


def _processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (not this test process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry.name))
    return found


@pytest.fixture(autouse=True)
def _no_ssh_from_in_process_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Mitogen, the default strategy, apply first records new nodes' host keys by an SSH
    login (runner.first_contact). The nodes of an apply run in-process here are fakes, the
    examples' site addresses among them, and tests send traffic to loopback only: that login
    is left out (each one waited out its 20 s connect timeout). first_contact itself is tested
    in test_runner.py, and for real by every apply of the end-to-end tests and the VM lab."""
    monkeypatch.setattr(apply_mod, "first_contact", lambda known_hosts, targets, timeout=20: {})


@pytest.fixture(autouse=True)
def _no_live_reads_from_in_process_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """An apply whose plan has no change reads the live services (slurmdbd's accounts) over
    SSH before it decides that nothing is to run; for the same reason as above, in-process
    applies read nothing (their fakes match the manifest). The read itself is tested with
    plan's (tests/commands/test_plan.py), the decision in tests/test_apply.py."""
    monkeypatch.setattr(apply_mod, "live_reads", lambda loaded, st, state: [])


@pytest.fixture(autouse=True)
def _no_disk_reads_from_in_process_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """An apply reads the disks of new pools and scratch volumes over SSH before it runs
    anything; for the same reason as above, in-process applies read none (their fakes have
    blank disks). The read is tested in tests/test_live.py, the judgement in
    tests/areas/storage/test_precheck.py, the refusal in tests/commands/test_apply.py, real
    disks in the VM lab."""
    monkeypatch.setattr(apply_mod, "disk_reads", lambda loaded, st, state, names: [])


@pytest.fixture
def processes_with() -> Callable[[str], list[int]]:
    """Finds processes by a marker in their command line (a stand-in's unique argument), to
    show that a stopped command left none behind."""
    return _processes_with


@pytest.fixture
def kit() -> Kit:
    return Kit()


@pytest.fixture
def write_manifest(tmp_path: Path, kit: Kit) -> Callable[..., Path]:
    """write_manifest(data_or_text, name="manifest.yaml") -> path of the written file."""

    def write(data: dict[str, Any] | str, name: str = "manifest.yaml") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(kit.text(data))
        return path

    return write


NETWORKD = Path("/lib/systemd/systemd-networkd")


def networkd_diagnostics(units: dict[str, str]) -> list[str]:
    """What systemd-networkd (the real one, in a network and mount namespace of its own, its
    /run/systemd a tmpfs, /run/systemd/network holding ``units`` by file name) says about those files while
    it loads them: every line naming one of them (an unknown key, a value it cannot parse).
    It runs 2 s; a bond it cannot create (no bonding module) does not matter here."""
    script = ("set -e; mount -t tmpfs none /run/systemd; mount -t tmpfs none /etc/systemd/network; "
              'mkdir /run/systemd/network /run/systemd/netif; cp "$0"/* /run/systemd/network/; '
              f"SYSTEMD_LOG_LEVEL=debug SYSTEMD_LOG_TARGET=console timeout 2 {NETWORKD} || true")
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in units.items():
            (Path(tmp) / name).write_text(text)
        run = subprocess.run(["unshare", "--mount", "--net", "sh", "-c", script, tmp], capture_output=True,
                             text=True, timeout=30, check=False)
    out = run.stdout + run.stderr
    assert "Creating" in out or "loaded" in out or "Enumeration completed" in out, out[-2000:]
    return [line for line in out.splitlines() if any(f"/run/systemd/network/{name}:" in line for name in units)]


@pytest.fixture
def networkd() -> Callable[[dict[str, str]], list[str]]:
    """networkd(units) -> systemd-networkd's diagnostics about them (:func:`networkd_diagnostics`);
    skipped without systemd-networkd, unshare or root."""
    if not NETWORKD.exists() or shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("systemd-networkd, unshare and root are needed")
    return networkd_diagnostics


def netplan_generate(tool: str, config: dict[str, Any]) -> dict[str, str]:
    """netplan's generator (``generate --root-dir``) over ``config`` written as
    /etc/netplan/50-provision.yaml of a temporary root: the networkd units it writes, by
    file name. A file it refuses fails the test with its words."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "etc/netplan").mkdir(parents=True)
        path = root / "etc/netplan/50-provision.yaml"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        run = subprocess.run([tool, "--root-dir", tmp], capture_output=True, text=True, timeout=30, check=False)
        assert run.returncode == 0 and not run.stderr.strip(), run.stderr
        return {p.name: p.read_text() for p in (root / "run/systemd/network").iterdir()}


@pytest.fixture
def netplan() -> Callable[[dict[str, Any]], dict[str, str]]:
    """netplan(config) -> the networkd units netplan's generator makes of it
    (:func:`netplan_generate`); $NETPLAN_GENERATE, netplan-generate (tests/testbed/setup.sh)
    or the installed package's; skipped without one."""
    tool = os.environ.get("NETPLAN_GENERATE") or shutil.which("netplan-generate") or next(
        (p for p in ("/usr/libexec/netplan/generate", "/lib/netplan/generate") if os.access(p, os.X_OK)), None)
    if tool is None:
        pytest.skip("netplan's generator is not installed (tests/testbed/setup.sh: netplan-generate)")
    return lambda config: netplan_generate(tool, config)
