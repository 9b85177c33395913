"""The install phase of `provision apply`: who is installed, who is never touched.

BMC, PXE server and SSH are replaced by recording fakes; the decisions are real.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from provisioner import apply as apply_mod
from provisioner.apply import ApplyOptions, install_phase
from provisioner.areas.baremetal import install as baremetal
from provisioner.errors import ProvisionError
from provisioner.runner import HostProgress, RunResult
from provisioner.state import State, StateDir


class Fakes:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, alive: set[str], fail: set[str] = frozenset()) -> None:
        self.installed: list[list[str]] = []
        self.pxe_runs: list[dict[str, Any]] = []
        self.alive = alive
        self.fail = set(fail)
        monkeypatch.setattr(apply_mod, "answers_ssh", lambda address, port=22, timeout=3.0: address in alive)
        monkeypatch.setattr(apply_mod, "run_playbook", self.run_playbook)
        monkeypatch.setattr(baremetal, "install_nodes", self.install_nodes)

    def run_playbook(self, **kwargs: Any) -> RunResult:
        self.pxe_runs.append(kwargs)
        hosts = {h: HostProgress(h) for h in kwargs["hosts"]}
        return RunResult(0, "successful", hosts, Path("/nonexistent"))

    def install_nodes(self, m: Any, targets: list[str], **kwargs: Any) -> list[baremetal.InstallResult]:
        self.installed.append(list(targets))
        self.install_kwargs = kwargs
        return [
            baremetal.InstallResult(t, t not in self.fail, "ssh" if t in self.fail else "done",
                                    "no SSH after install" if t in self.fail else "installed")
            for t in targets
        ]


@pytest.fixture
def setup(kit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, StateDir, State]:
    monkeypatch.setenv("TEST_BMC_PASSWORD", "x")
    data = kit.base()
    for node in data["nodes"]:
        node.setdefault("install_disks", ["nvme-DISK_A"])
        node.setdefault(
            "bmc", {"type": "redfish", "address": "10.0.1.21", "user": "admin", "password_env": "TEST_BMC_PASSWORD"}
        )
    loaded = kit.load(data)
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    return loaded, state, State()


def _console() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_new_nodes_are_installed_and_reset(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch, alive=set())
    st.node("node01").fingerprints = {"common": "old"}
    failed = install_phase(loaded, state, st, ApplyOptions(yes=True), _console())
    assert failed == []
    assert fakes.installed == [["node01", "node02"]]  # the head is never PXE-installed
    arm = fakes.pxe_runs[0]["extravars"]["pxe_server_arm_nodes"]
    assert arm == ["node01", "node02"]
    assert fakes.pxe_runs[0]["limit"] == ["head01"]
    assert st.nodes["node01"].lifecycle == "installed" and st.nodes["node01"].fingerprints == {}


def test_install_timeout_reaches_the_installer(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch, alive=set())
    install_phase(loaded, state, st, ApplyOptions(yes=True), _console())
    assert fakes.install_kwargs["timeouts"].total == baremetal.Timeouts().total
    install_phase(loaded, state, State(), ApplyOptions(yes=True, install_timeout=240), _console())
    assert fakes.install_kwargs["timeouts"].total == 240
    assert fakes.install_kwargs["timeouts"].ssh == baremetal.Timeouts().ssh


def test_new_node_answering_ssh_is_taken_as_installed(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    ip = str(loaded.manifest.node("node01").ip)
    fakes = Fakes(monkeypatch, alive={ip})
    install_phase(loaded, state, st, ApplyOptions(yes=True), _console())
    assert fakes.installed == [["node02"]]
    assert st.nodes["node01"].lifecycle == "installed"


def test_installed_nodes_are_untouched_without_reinstall(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    for name in ("node01", "node02"):
        st.node(name).lifecycle = "configured"
    fakes = Fakes(monkeypatch, alive=set())
    assert install_phase(loaded, state, st, ApplyOptions(yes=True), _console()) == []
    assert fakes.installed == [] and fakes.pxe_runs == []


def test_reinstall_even_when_it_answers_ssh(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    for name in ("node01", "node02"):
        st.node(name).lifecycle = "configured"
    fakes = Fakes(monkeypatch, alive={str(n.ip) for n in loaded.manifest.nodes})
    install_phase(loaded, state, st, ApplyOptions(yes=True, reinstall=["node02"]), _console())
    assert fakes.installed == [["node02"]]


def test_reinstall_needs_confirmation_without_a_terminal(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    st.node("node01").lifecycle = "configured"
    st.node("node02").lifecycle = "configured"
    fakes = Fakes(monkeypatch, alive=set())
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(ProvisionError, match="wipes disks"):
        install_phase(loaded, state, st, ApplyOptions(reinstall=["node01"]), _console())
    assert fakes.installed == []


def test_failed_install_is_reported_and_kept_new(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    Fakes(monkeypatch, alive=set(), fail={"node02"})
    failed = install_phase(loaded, state, st, ApplyOptions(yes=True), _console())
    assert failed == ["node02"]
    assert st.nodes["node02"].lifecycle == "new"
    assert "no SSH after install" in str(st.nodes["node02"].last_result)


def test_check_mode_installs_nothing(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch, alive=set())
    assert install_phase(loaded, state, st, ApplyOptions(check=True), _console()) == []
    assert fakes.installed == [] and fakes.pxe_runs == []


def test_limit_restricts_installs(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch, alive=set())
    install_phase(loaded, state, st, ApplyOptions(yes=True, limit=["head01", "node02"]), _console())
    assert fakes.installed == [["node02"]]
