"""The install phase of `provision apply`: who is installed, who is never touched, and that
nothing is changed before every secret is there.

BMC, PXE server and SSH are replaced by recording fakes; the decisions are real.
"""

from __future__ import annotations

import io
import signal
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from provisioner import apply as apply_mod
from provisioner.apply import (
    ApplyOptions,
    Installs,
    confirm,
    install_phase,
    missing_secrets,
    nothing_to_run,
    probe_installs,
)
from provisioner.areas.baremetal import install as baremetal
from provisioner.errors import ProvisionError
from provisioner.interrupts import Interrupted, Signals
from provisioner.live import PENDING_KINDS, LiveRead
from provisioner.plan import NodePlan, Plan, Upgrade, compute
from provisioner.runner import HostProgress, Reach, RunResult
from provisioner.state import State, StateDir

PLAYS: list[Any] = []


class Fakes:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: set[str] = frozenset()) -> None:
        self.installed: list[list[str]] = []
        self.pxe_runs: list[dict[str, Any]] = []
        self.fail = set(fail)
        monkeypatch.setattr(apply_mod, "run_playbook", self.run_playbook)
        monkeypatch.setattr(baremetal, "install_nodes", self.install_nodes)

    def run_playbook(self, **kwargs: Any) -> RunResult:
        self.pxe_runs.append(kwargs)
        hosts = {h: HostProgress(h, ok=1, events=1) for h in kwargs["hosts"]}
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
    data["nodes"][1]["install"] = "pxe"  # node01, node02 (a range); the head is installed by hand
    loaded = kit.load(data)
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    return loaded, state, State()


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def alive(*addresses: str) -> Any:
    """A probe that finds an SSH server at ``addresses`` only."""
    return lambda address, port: Reach(True, banner="SSH-2.0-OpenSSH_9.2") if address in addresses else \
        Reach(False, "connection refused")


def installs_of(loaded: Any, st: State, opts: ApplyOptions, probe: Any = None) -> Installs:
    plan = compute(loaded.manifest, st, PLAYS, limit=opts.limit, reinstall=opts.reinstall)
    return probe_installs(loaded, plan, opts, probe=probe or alive())


# --------------------------------------------------------------------------- who is installed
def test_only_new_nodes_marked_install_pxe_are_installed(setup: Any) -> None:
    loaded, _state, st = setup
    assert installs_of(loaded, st, ApplyOptions()).wipe == ["node01", "node02"]  # never head01 (manual)


def test_a_new_node_that_does_not_answer_is_not_installed_without_intent(setup: Any, kit: Any) -> None:
    """The issue: a hand-installed server, switched off at its first apply, was wiped."""
    _loaded, _state, st = setup
    data = kit.base()
    for node in data["nodes"]:
        node["install_disks"] = ["nvme-DISK_A"]  # everything an install needs, but no intent
    manual = kit.load(data)
    assert installs_of(manual, st, ApplyOptions(), probe=alive()).wipe == []


def test_a_node_marked_for_install_that_runs_ssh_is_spared_and_nothing_recorded(setup: Any) -> None:
    loaded, _state, st = setup
    ip = str(loaded.manifest.node("node01").ip)
    installs = installs_of(loaded, st, ApplyOptions(), probe=alive(ip))
    assert installs.wipe == ["node02"]
    assert "node01" in installs.spared and "--reinstall node01 wipes it" in installs.spared["node01"]
    assert "SSH-2.0-OpenSSH_9.2" in installs.spared["node01"]
    assert st.nodes == {}  # the lifecycle changes only once a run reached the node


def test_reinstall_is_not_probed(setup: Any) -> None:
    loaded, _state, st = setup
    for name in ("node01", "node02"):
        st.node(name).lifecycle = "configured"
    everyone = alive(*(str(n.ip) for n in loaded.manifest.nodes))
    installs = installs_of(loaded, st, ApplyOptions(reinstall=["node02"]), probe=everyone)
    assert installs.wipe == ["node02"] and installs.spared == {}


def test_installed_nodes_are_left_alone(setup: Any) -> None:
    loaded, _state, st = setup
    for name in ("node01", "node02"):
        st.node(name).lifecycle = "configured"
    assert installs_of(loaded, st, ApplyOptions()).wipe == []


def test_limit_restricts_installs(setup: Any) -> None:
    loaded, _state, st = setup
    assert installs_of(loaded, st, ApplyOptions(limit=["head01", "node02"])).wipe == ["node02"]


# --------------------------------------------------------------------------- the install phase
def test_install_phase_installs_and_resets(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch)
    st.node("node01").fingerprints = {"common": "old"}
    console, _ = _console()
    with Signals() as signals:
        failed = install_phase(loaded, state, st, ["node01", "node02"], ApplyOptions(yes=True), console, signals)
    assert failed == []
    assert fakes.installed == [["node01", "node02"]]
    assert fakes.pxe_runs[0]["extravars"]["pxe_server_arm_nodes"] == ["node01", "node02"]
    assert fakes.pxe_runs[0]["limit"] == ["head01"]
    assert st.nodes["node01"].lifecycle == "installed" and st.nodes["node01"].fingerprints == {}


def test_the_pxe_log_folder_is_named_by_the_recorded_run(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PXE server's play logged under an id of its own, which no run in the state had
    (issue 27 item 12)."""
    loaded, state, st = setup
    fakes = Fakes(monkeypatch)
    console, _ = _console()
    with Signals() as signals:
        install_phase(loaded, state, st, ["node01"], ApplyOptions(yes=True), console, signals, "20261126T000000Z")
    assert fakes.pxe_runs[0]["run_id"] == "20261126T000000Z-pxe"


def test_install_timeout_reaches_the_installer(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch)
    console, _ = _console()
    with Signals() as signals:
        install_phase(loaded, state, st, ["node01"], ApplyOptions(yes=True), console, signals)
        assert fakes.install_kwargs["timeouts"].total == baremetal.Timeouts().total
        install_phase(loaded, state, State(), ["node01"], ApplyOptions(yes=True, install_timeout=240), console,
                      signals)
    assert fakes.install_kwargs["timeouts"].total == 240
    assert fakes.install_kwargs["timeouts"].ssh == baremetal.Timeouts().ssh


def test_failed_install_is_reported_and_kept_new(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    Fakes(monkeypatch, fail={"node02"})
    console, _ = _console()
    with Signals() as signals:
        failed = install_phase(loaded, state, st, ["node01", "node02"], ApplyOptions(yes=True), console, signals)
    assert failed == ["node02"]
    assert st.nodes["node02"].lifecycle == "new"
    assert "no SSH after install" in str(st.nodes["node02"].last_result)


def test_a_signal_stops_the_installs_at_their_next_wait(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, state, st = setup
    fakes = Fakes(monkeypatch)
    seen: list[str] = []

    def installing(m: Any, targets: list[str], **kwargs: Any) -> list[baremetal.InstallResult]:
        signal.raise_signal(signal.SIGTERM)  # arrives while the installs wait
        try:
            kwargs["sleep"](30)
        except baremetal.Stopped:
            seen.append("stopped")
        return [baremetal.InstallResult(t, False, "stopped", "interrupted") for t in targets]

    monkeypatch.setattr(baremetal, "install_nodes", installing)
    console, _ = _console()
    with Signals() as signals, pytest.raises(Interrupted) as info:
        install_phase(loaded, state, st, ["node01"], ApplyOptions(yes=True), console, signals)
    assert seen == ["stopped"] and info.value.exit_code == 128 + signal.SIGTERM
    assert fakes.pxe_runs and st.nodes["node01"].lifecycle == "new"
    assert state.load().nodes["node01"].last_result is not None  # recorded before raising


# --------------------------------------------------------------------------- secrets first
def test_every_missing_secret_is_named_before_any_change(setup: Any, monkeypatch: pytest.MonkeyPatch,
                                                          kit: Any) -> None:
    loaded, _state, _st = setup
    monkeypatch.delenv("TEST_BMC_PASSWORD")
    problems = missing_secrets(loaded, ["node01", "node02"])
    assert len(problems) == 2 and all("TEST_BMC_PASSWORD" in p for p in problems)
    assert missing_secrets(loaded, []) == []
    data = kit.base()
    data["cluster"]["ssh"] = {"private_key": "/nonexistent/id_ed25519"}
    assert missing_secrets(kit.load(data), []) == ["cluster.ssh.private_key /nonexistent/id_ed25519 is not a "
                                                   "readable file"]


# --------------------------------------------------------------------------- confirmation
def test_confirmation_shows_what_is_wiped_before_asking(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, _state, st = setup
    plan = compute(loaded.manifest, st, PLAYS)
    installs = Installs(["node02"], {"node01": "node01: marked install: pxe and new, but ..."})
    console, buf = _console()
    asked: list[str] = []

    def answer(prompt: str = "", **kwargs: Any) -> str:
        asked.append(buf.getvalue())  # what was on screen when the question came
        assert kwargs.get("markup") is False
        return "wipe"

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr(console, "input", answer)
    confirm(console, plan, installs, ApplyOptions())
    assert "node02: PXE install: wipes nvme-DISK_A" in asked[0]
    assert "marked install: pxe" in asked[0]
    monkeypatch.setattr(console, "input", lambda prompt="", **kw: "y")
    with pytest.raises(ProvisionError, match="aborted"):  # a plain yes does not wipe
        confirm(console, plan, installs, ApplyOptions())


def test_plain_confirmation_prompt_shows_its_choices(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, _state, st = setup
    plan = compute(loaded.manifest, st, PLAYS)
    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    with pytest.raises(ProvisionError, match="aborted: nothing was changed"):
        confirm(console, plan, Installs(), ApplyOptions())
    assert "Apply these changes? [y/N]" in out.getvalue()  # rich used to eat [y/N] as markup


def test_confirmation_is_refused_without_a_terminal(setup: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded, _state, st = setup
    plan = compute(loaded.manifest, st, PLAYS)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    console, _ = _console()
    with pytest.raises(ProvisionError, match=r"refusing to install over PXE \(wiping node02\)"):
        confirm(console, plan, Installs(["node02"]), ApplyOptions())
    confirm(console, plan, Installs(["node02"]), ApplyOptions(yes=True))


# --------------------------------------------------------------------------- nothing to run
def test_an_apply_without_a_change_runs_nothing_unless_told_or_a_service_drifted() -> None:
    """Issue 35: a no-op re-apply ran the light plays on every node (1.7 s of the controller's
    CPU per node, 56 s at 32 nodes). It runs nothing when the plan has no change and every
    service read live matches; --full, a change, an upgrade, a drift or an unread service runs."""
    settled = Plan([NodePlan("head01", "unchanged", [], "configured")], False, [])
    calls: list[int] = []

    def reads(*found: LiveRead) -> Any:
        def read() -> list[LiveRead]:
            calls.append(1)
            return list(found)
        return read

    clean = LiveRead("slurmdbd", "head01")
    drift = LiveRead("slurmdbd", "head01", [(sorted(PENDING_KINDS)[0], "account ml: missing")])
    unread = LiveRead("slurmdbd", "head01", error="sacctmgr on head01: timed out")
    assert nothing_to_run(settled, ApplyOptions(), reads(clean)) is True
    assert nothing_to_run(settled, ApplyOptions(), reads()) is True
    assert nothing_to_run(settled, ApplyOptions(), reads(clean, drift)) is False
    assert nothing_to_run(settled, ApplyOptions(), reads(unread)) is False
    assert len(calls) == 4
    assert nothing_to_run(settled, ApplyOptions(full=True), reads(clean)) is False
    assert nothing_to_run(settled, ApplyOptions(reinstall=["head01"]), reads(clean)) is False
    assert nothing_to_run(Plan(settled.nodes, True, []), ApplyOptions(), reads(clean)) is False
    new = Plan([NodePlan("gpu01", "new", ["node"], "new", heavy=True)], False, ["gpu01"])
    assert nothing_to_run(new, ApplyOptions(), reads(clean)) is False
    upgrade = Plan(settled.nodes, False, [], upgrades=[Upgrade("slurm", ["slurmdbd first"], "")])
    assert nothing_to_run(upgrade, ApplyOptions(), reads(clean)) is False
    assert len(calls) == 4  # the plan alone decided: nothing read
