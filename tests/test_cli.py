"""provisioner.cli: exit codes, messages and files of `provision validate|inventory|plan|apply`."""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import apply as apply_mod
from provisioner import cli as cli_mod
from provisioner.areas import registry
from provisioner.bmc import BmcRow
from provisioner.cli import main
from provisioner.commands import bmc as bmc_cmd
from provisioner.commands import common
from provisioner.commands import validate as validate_cmd
from provisioner.plan import cluster_fingerprint, node_sections
from provisioner.runner import RunResult, Tracker
from provisioner.state import NodeState, RunRecord, State, StateDir
from provisioner.validate import load_manifest

Capsys = pytest.CaptureFixture[str]


def run(capsys: Capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def settle(path: Path, state_dir: Path | None = None) -> StateDir:
    """Record the manifest at ``path`` as fully applied."""
    m = load_manifest(path).manifest
    sd = StateDir.beside(path, state_dir)
    sd.save(
        State(
            cluster=m.cluster.name,
            nodes={n.name: NodeState(lifecycle="configured", fingerprints=node_sections(m, n)) for n in m.nodes},
            cluster_fingerprint=cluster_fingerprint(m),
        )
    )
    return sd


@pytest.fixture
def example(tmp_path: Path, kit: Any) -> Path:
    """A copy of the llm-200k example in a fresh folder (its state goes beside it)."""
    path = tmp_path / "cluster" / "llm-200k.yaml"
    path.parent.mkdir()
    path.write_text((kit.examples / "llm-200k.yaml").read_text())
    return path


@pytest.fixture
def no_ansible(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace the playbook run; the list collects the calls."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(apply_mod, "PREPARE_HOOKS", [])
    monkeypatch.setattr(apply_mod, "unreachable_now", lambda loaded, names: {})  # no probes off loopback

    def fake_run_playbook(**kwargs: Any) -> RunResult:
        calls.append(kwargs)
        tracker: Tracker = kwargs["tracker"]
        for host in kwargs["hosts"]:
            tracker.handle({"event": "runner_on_ok", "event_data": {"host": host, "res": {"changed": True}}})
        return RunResult(0, "successful", tracker.hosts, kwargs["state"].runs / kwargs["run_id"])

    monkeypatch.setattr(apply_mod, "run_playbook", fake_run_playbook)
    return calls


# --------------------------------------------------------------------------- validate
def test_validate_ok(capsys: Capsys, kit: Any) -> None:
    path = kit.examples / "music-lab.yaml"
    code, out, err = run(capsys, "validate", str(path))
    assert code == 0
    assert out.strip() == (
        f"{path}: OK: cluster musiclab, 6 nodes (1 head+services, 2 storage, 3 compute), 6 GPUs, "
        "2 ZFS pools, 2 NFS exports, 1 warnings"
    )
    # an Ubuntu-only site with its own mirror: its deploy ramdisk still comes from Debian's archive
    assert err.startswith(f"{path}:17:5: warning: cluster.mirrors.apt: image deploys boot a deploy ramdisk")


def test_validate_ok_with_a_warning(capsys: Capsys, example: Path) -> None:
    code, out, err = run(capsys, "validate", str(example))
    assert code == 0
    assert out.startswith(f"{example}: OK: cluster llm200k, 5 nodes")
    assert out.strip().endswith("3 warnings")
    lines = err.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{example}:") for line in lines)
    assert f"{example}:100:1: warning: monitoring: ubuntu-22.04's node_exporter (1.3.1)" in lines[2]
    assert ": warning: zfs.pools[0].log: " in lines[0]
    assert ": warning: slurm: " in lines[1]


def test_validate_errors_exit_1_with_positions(capsys: Capsys, write_manifest: Any, kit: Any) -> None:
    data = kit.base()
    data["nodes"][0]["hardware"]["memory_gb"] = "lots"
    data["cluster"]["colour"] = "blue"
    path = write_manifest(data)
    text = path.read_text()
    code, out, err = run(capsys, "validate", str(path))
    assert code == 1
    assert out == ""
    lines = err.splitlines()
    assert lines == [
        f"{path}:{kit.line_of(text, 'colour: blue')}:3: cluster.colour: unknown field; allowed: "
        "admin_users, allow_reboot, domain, images, install_media, install_method, mirrors, name, ntp_servers, "
        "ssh, timezone",
        f"{path}:{kit.line_of(text, 'memory_gb: lots')}:5: nodes[0].hardware.memory_gb: "
        "Input should be a valid integer, unable to parse string as an integer",
    ]


def test_validate_semantic_error(capsys: Capsys, write_manifest: Any, kit: Any) -> None:
    data = kit.base()
    data["docker"] = {"users": ["mallory"]}
    path = write_manifest(data)
    code, _, err = run(capsys, "validate", str(path))
    assert code == 1
    assert err.strip() == (
        f"{path}:{kit.line_of(path.read_text(), '- mallory')}:5: docker.users[0]: "
        "'mallory' is not one of cluster.admin_users"
    )


@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "no such file"), (b"", "empty"), (b"\x00\x01", "binary"), (b"a: 1\na: 2\n", "duplicate key")],
)
def test_validate_bad_files(capsys: Capsys, tmp_path: Path, content: bytes | None, needle: str) -> None:
    path = tmp_path / "m.yaml"
    if content is not None:
        path.write_bytes(content)
    code, _, err = run(capsys, "validate", str(path))
    assert code == 1
    assert err.startswith(str(path))
    assert needle in err


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every command line the parser runs (``image build``, ``report usage``, ...) and its parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser}
    return {leaf: p for name, sub in subs[0].choices.items() for leaf, p in leaf_commands(sub, (*path, name)).items()}


def test_every_command_takes_json() -> None:
    """One output contract (issue 27, What to build 4): every command reports, so every one
    takes --json; a new command without it fails here."""
    leaves = leaf_commands(cli_mod._parser())
    assert len(leaves) >= 13  # validate .. report usage: the walk found them all
    assert [" ".join(path) for path, p in leaves.items() if "--json" not in p._option_string_actions] == []


def test_mitogen_is_the_default_strategy_and_linear_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35 item 1: apply and remove run Mitogen's strategy unless told otherwise, by the
    option or by PROVISION_STRATEGY."""
    monkeypatch.delenv("PROVISION_STRATEGY", raising=False)
    leaves = leaf_commands(cli_mod._parser())
    for verb, argv in (("apply", ["m.yaml"]), ("remove", ["m.yaml", "gpu03"])):
        assert leaves[(verb,)].parse_args(argv).strategy == "mitogen"
        assert leaves[(verb,)].parse_args([*argv, "--strategy", "linear"]).strategy == "linear"
    monkeypatch.setenv("PROVISION_STRATEGY", "linear")
    assert leaf_commands(cli_mod._parser())[("apply",)].parse_args(["m.yaml"]).strategy == "linear"


def test_validate_json(capsys: Capsys, kit: Any, tmp_path: Path) -> None:
    """--json on every verb that reports (issue 27 item 13), with null for what is unknown."""
    code, out, _ = run(capsys, "validate", str(kit.examples / "music-lab.yaml"), "--json")
    assert code == 0
    report = json.loads(out)
    # the example's one warning: its Ubuntu-only apt mirror serves no deploy ramdisk (Debian)
    warning, = report.pop("warnings")
    assert (warning["path"], warning["severity"], warning["line"]) == ("cluster.mirrors.apt", "warning", 17), warning
    assert report == {"ok": True, "errors": [], "cluster": "musiclab", "nodes": 6, "gpus": 6}
    bad = tmp_path / "m.yaml"
    bad.write_text("version: 1\nversion: 2\n")
    code, out, err = run(capsys, "validate", str(bad), "--json")
    assert code == 1 and err == ""
    data = json.loads(out)
    assert data["ok"] is False and data["cluster"] is None and data["warnings"] == []
    assert data["errors"] == [{"file": str(bad), "line": 2, "col": 1, "path": "version", "severity": "error",
                               "message": "duplicate key (first defined on line 1)"}]
    bad.write_text("")
    data = json.loads(run(capsys, "validate", str(bad), "--json")[1])
    assert data["errors"][0]["line"] is None and data["errors"][0]["path"] is None


def test_validate_directory(capsys: Capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "validate", str(tmp_path))
    assert code == 1
    assert err.strip() == f"{tmp_path}: is a directory, not a manifest file"


def test_usage_errors_exit_2(capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        main(["frobnicate", "m.yaml"])
    assert info.value.code == 2


def test_internal_errors_are_one_line_unless_debugging(
    capsys: Capsys, monkeypatch: pytest.MonkeyPatch, kit: Any
) -> None:
    def broken(*args: Any) -> int:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(validate_cmd, "run", broken)
    monkeypatch.delenv("PROVISION_DEBUG", raising=False)
    code, _, err = run(capsys, "validate", str(kit.examples / "music-lab.yaml"))
    assert code == 70
    assert err.strip() == "internal error: RuntimeError: kaboom (set PROVISION_DEBUG=1 for a traceback)"
    monkeypatch.setenv("PROVISION_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaboom"):
        main(["validate", str(kit.examples / "music-lab.yaml")])


# --------------------------------------------------------------------------- inventory
def test_inventory_out_writes_files(capsys: Capsys, example: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "inv"
    code, out, _ = run(capsys, "inventory", str(example), "--out", str(out_dir))
    assert code == 0
    written = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*.json"))
    assert out.strip() == f"wrote {len(written)} files to {out_dir}"
    assert "hosts.json" in written
    assert "host_vars/gpu04.json" in written
    hosts = json.loads((out_dir / "hosts.json").read_text())
    assert "gpu03" in hosts["all"]["children"]["gpu"]["hosts"]
    provision = json.loads((out_dir / "group_vars/all/provision.json").read_text())
    assert provision["provision_manifest"] == str(example)
    # the roles read the control machine's secrets there (a plain ansible-playbook run
    # failed on 'provision_state_dir' is undefined): the state directory apply uses
    assert provision["provision_state_dir"] == str(StateDir.beside(example).root)
    run(capsys, "inventory", str(example), "--out", str(out_dir), "--state-dir", str(tmp_path / "st"))
    provision = json.loads((out_dir / "group_vars/all/provision.json").read_text())
    assert provision["provision_state_dir"] == str(StateDir.beside(example, tmp_path / "st").root)


def test_inventory_default_folder_is_beside_the_manifest(
    capsys: Capsys, example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was the current folder's, while .provision/ sits beside the manifest (issue 27 item 13)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, _ = run(capsys, "inventory", str(example))
    assert code == 0
    assert (example.parent / "inventory" / "llm200k" / "hosts.json").is_file()
    assert str(example.parent / "inventory" / "llm200k") in out
    assert list(elsewhere.iterdir()) == []


def test_inventory_in_json_names_the_folder_and_its_files(
    capsys: Capsys, example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """inventory had no --json (issue 27 item 13); --out, as every path argument, is the
    current folder's: the JSON says where that is."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "inventory", str(example), "--out", "inv", "--json")
    assert code == 0 and all(": warning: " in line for line in err.splitlines())  # the manifest's, on stderr
    doc = json.loads(out)
    written = sorted(p.relative_to(tmp_path / "inv").as_posix() for p in (tmp_path / "inv").rglob("*.json"))
    assert doc == {"ok": True, "cluster": "llm200k", "out": str(tmp_path / "inv"), "files": written}


def test_inventory_of_a_bad_manifest_writes_nothing(capsys: Capsys, tmp_path: Path) -> None:
    bad = tmp_path / "m.yaml"
    bad.write_text("version: 1\n")
    code, _, err = run(capsys, "inventory", str(bad), "--out", str(tmp_path / "inv"))
    assert code == 1
    assert err.startswith(str(bad))
    assert not (tmp_path / "inv").exists()


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_inventory_out_that_cannot_be_a_folder_is_one_line(capsys: Capsys, example: Path, tmp_path: Path,
                                                           where: str) -> None:
    """`internal error: FileExistsError` (exit 70) before."""
    blocker = tmp_path / "taken"
    blocker.write_text("mine\n")
    out_dir = blocker if where == "file" else blocker / "inv"
    code, out, err = run(capsys, "inventory", str(example), "--out", str(out_dir))
    assert code == 1 and out == ""
    last = err.splitlines()[-1]
    assert last.startswith(f"error: cannot write the inventory in {out_dir}: {blocker}")
    assert "internal error" not in err
    assert blocker.read_text() == "mine\n"


# --------------------------------------------------------------------------- plan
def test_plan_json_on_a_fresh_cluster(capsys: Capsys, example: Path) -> None:
    code, out, _ = run(capsys, "plan", str(example), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["has_changes"] is True
    assert data["targets"] == ["head01", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert {n["status"] for n in data["nodes"]} == {"new"}
    assert not (example.parent / ".provision").exists()  # plan never writes state


def test_plan_detailed_exitcode_2_when_changes(capsys: Capsys, example: Path) -> None:
    code, out, _ = run(capsys, "plan", str(example), "--detailed-exitcode")
    assert code == 2
    assert "plan for cluster llm200k" in out
    assert "node-local plays on: head01, gpu01, gpu02, gpu03, gpu04" in out


def test_plan_detailed_exitcode_0_when_state_matches(capsys: Capsys, example: Path) -> None:
    settle(example)
    code, out, _ = run(capsys, "plan", str(example), "--detailed-exitcode", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["has_changes"] is False
    assert data["targets"] == []
    assert {n["status"] for n in data["nodes"]} == {"unchanged"}


def test_plan_with_state_dir_and_a_change(capsys: Capsys, example: Path, tmp_path: Path) -> None:
    state_dir = tmp_path / "elsewhere"
    settle(example, state_dir)
    example.write_text(example.read_text().replace("memory_gb: 256", "memory_gb: 512"))
    code, out, _ = run(capsys, "plan", str(example), "--state-dir", str(state_dir), "--json", "--detailed-exitcode")
    assert code == 2
    data = json.loads(out)
    assert data["targets"] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    changed = {n["name"]: n["sections"] for n in data["nodes"] if n["status"] == "changed"}
    assert set(changed) == {"gpu01", "gpu02", "gpu03", "gpu04"}
    assert all("node" in sections for sections in changed.values())
    # without --state-dir the plan looks beside the manifest, where nothing was recorded
    _, out, _ = run(capsys, "plan", str(example), "--json")
    assert {n["status"] for n in json.loads(out)["nodes"]} == {"new"}


def test_plan_limit_with_ranges_and_roles(capsys: Capsys, example: Path) -> None:
    code, out, _ = run(capsys, "plan", str(example), "--json", "--limit", "gpu[01-02], @head")
    assert code == 0
    data = json.loads(out)
    assert data["targets"] == ["head01", "gpu01", "gpu02"]
    plays = {n["name"]: n["plays"] for n in data["nodes"]}
    assert plays["gpu03"] == [] and plays["gpu04"] == []
    assert plays["gpu01"]


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ("ghost", "error: --limit: unknown node 'ghost'"),
        ("gpu01,gpu[05-06]", "error: --limit: unknown node 'gpu05' (and 1 more)"),
        ("@login", "error: --limit: '@login' matches no node (no node has role 'login')"),
        ("gpu[2-1]", "error: --limit: bad range 'gpu[2-1]': 1 is below 2"),
        ("", "error: --limit: no nodes given"),
        (" , ", "error: --limit: no nodes given"),
    ],
)
def test_limit_errors(capsys: Capsys, example: Path, limit: str, message: str) -> None:
    for argv in (["plan"], ["apply", "--yes"]):
        code, _, err = run(capsys, *argv, str(example), "--limit", limit)
        assert code == 1, argv
        assert err.splitlines()[-1] == message, argv
        assert not StateDir.beside(example).state_file.exists()


def test_apply_check_keeps_the_newest_scratch_folders_only(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path
) -> None:
    """Every `apply --check` left its /tmp/provision-check-* folder forever (issue 27 item 16)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    other = tmp / "provision-check-llm200k-big-x"  # another cluster whose name starts alike
    other.mkdir()
    (other / apply_mod.CHECK_MARK).write_text("llm200k-big")
    folders = []
    for _ in range(apply_mod.KEEP_CHECKS + 2):
        code, _, err = run(capsys, "apply", str(example), "--check")
        assert code == 0, err
        folders.append(no_ansible[-1]["state"].root)
        os.utime(folders[-1], (len(folders), len(folders)))  # their order, whatever the clock's resolution
    assert sorted(tmp.iterdir()) == sorted([other, *folders[-apply_mod.KEEP_CHECKS:]])
    assert (folders[-1] / "inventory" / "hosts.json").is_file()  # the newest check's inventory stays to read
    # one still running (its mark held) is never removed
    with (folders[-1] / apply_mod.CHECK_MARK).open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert apply_mod.prune_checks(tmp, "llm200k", keep=0) == [folders[-2], folders[-3]]  # newest first
    assert sorted(tmp.iterdir()) == sorted([other, folders[-1]])


def test_plan_with_a_broken_state_file(capsys: Capsys, example: Path) -> None:
    sd = StateDir.beside(example)
    sd.root.mkdir()
    sd.state_file.write_text("{ not json")
    code, _, err = run(capsys, "plan", str(example))
    assert code == 1
    assert err.splitlines()[-1].startswith(f"error: {sd.state_file}: unreadable state")


@pytest.mark.parametrize(("nodes", "message"), [
    ("nosuch", "error: --reinstall: unknown node 'nosuch'"),
    ("", "error: --reinstall: no nodes given"),
])
def test_reinstall_errors_name_reinstall(capsys: Capsys, example: Path, nodes: str, message: str) -> None:
    """`apply --reinstall nosuch` said `--limit: unknown node` (issue 27 item 8)."""
    code, _, err = run(capsys, "apply", str(example), "--yes", "--reinstall", nodes)
    assert code == 1
    assert err.splitlines()[-1] == message
    assert not StateDir.beside(example).state_file.exists()


def test_split_selectors() -> None:
    assert common.split_selectors("gpu[01-04],head01") == ["gpu[01-04]", "head01"]
    assert common.split_selectors("a,b[1-2],@compute") == ["a", "b[1-2]", "@compute"]
    assert common.split_selectors("") == [""]


# --------------------------------------------------------------------------- apply
def test_apply_refuses_without_yes_on_a_non_tty(
    capsys: Capsys, example: Path, monkeypatch: pytest.MonkeyPatch, no_ansible: list[dict[str, Any]]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    code, out, err = run(capsys, "apply", str(example))
    assert code == 1
    assert err.splitlines()[-1] == "error: refusing to apply without confirmation: stdin is not a terminal; pass --yes"
    assert "plan for cluster llm200k" in out  # the plan is shown first
    assert no_ansible == []
    sd = StateDir.beside(example)
    assert not sd.root.exists()  # not even empty folders stay (issue 27 item 16)
    with sd.lock("test"):  # the lock was released
        pass


def test_a_refused_apply_leaves_a_recorded_state_directory_as_it_was(
    capsys: Capsys, example: Path, monkeypatch: pytest.MonkeyPatch, no_ansible: list[dict[str, Any]]
) -> None:
    sd = settle(example)
    sd.ensure()
    before = tree(sd.root)
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    code, _, _ = run(capsys, "apply", str(example), "--full")
    assert code == 1 and no_ansible == []
    assert {k: v for k, v in tree(sd.root).items() if k != "lock"} == before and sd.runs.is_dir()


def test_apply_yes_records_state_and_then_plans_nothing(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]]
) -> None:
    code, out, err = run(capsys, "apply", str(example), "--yes")
    assert code == 0, err
    (call,) = no_ansible
    assert call["hosts"] == ["head01", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert call["limit"] is None
    assert call["extravars"] == {"provision_targets": "provision_targets"}
    assert call["secret_names"] == {"LLM_BMC_PASSWORD", "LLM_SMTP_PASSWORD"}  # BMCs, the e-mail receiver
    sd = StateDir.beside(example)
    targets = yaml.safe_load((sd.inventory / "targets.yml").read_text())
    assert sorted(targets["all"]["children"]["provision_targets"]["hosts"]) == sorted(call["hosts"])
    assert (sd.inventory / "hosts.json").is_file()
    st = sd.load()
    assert st.cluster == "llm200k"
    assert st.runs[-1].result == "ok"
    assert {ns.lifecycle for ns in st.nodes.values()} == {"configured"}
    assert "apply finished: 5 ok, 0 failed, 5 changed" in out
    code, _, _ = run(capsys, "plan", str(example), "--detailed-exitcode")
    assert code == 0
    # nothing to change: no playbook runs and no run is recorded; --full runs every play again
    code, out, err = run(capsys, "apply", str(example), "--yes")
    assert code == 0, err
    assert len(no_ansible) == 1 and len(sd.load().runs) == 1
    assert "nothing to change" in out and "apply --full" in out
    code, _, err = run(capsys, "apply", str(example), "--yes", "--full")
    assert code == 0, err
    assert len(no_ansible) == 2 and no_ansible[1]["hosts"] == call["hosts"] and len(sd.load().runs) == 2


def test_apply_with_limit_passes_it_on(capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]]) -> None:
    code, _, err = run(capsys, "apply", str(example), "--yes", "--limit", "gpu02")
    assert code == 0, err
    (call,) = no_ansible
    assert call["hosts"] == ["gpu02"]
    assert call["limit"] == ["gpu02"]
    assert set(StateDir.beside(example).load().nodes) == {"gpu02"}


def test_apply_refuses_another_clusters_state(capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]]) -> None:
    sd = StateDir.beside(example)
    sd.save(State(cluster="othercluster"))
    code, _, err = run(capsys, "apply", str(example), "--yes")
    assert code == 1
    assert "belongs to cluster 'othercluster', not 'llm200k'" in err
    assert no_ansible == []


def test_apply_deletes_artifacts_that_leak_a_secret(
    capsys: Capsys, example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apply_mod, "PREPARE_HOOKS", [])
    monkeypatch.setattr(apply_mod, "unreachable_now", lambda loaded, names: {})
    monkeypatch.setenv("LLM_BMC_PASSWORD", "Very-Secret-BMC-pw")
    leaked: list[Path] = []

    def leaky_run_playbook(**kwargs: Any) -> RunResult:
        folder = kwargs["state"].runs / kwargs["run_id"] / "artifacts"
        folder.mkdir(parents=True)
        (folder / "stdout").write_text("password=Very-Secret-BMC-pw\n")
        leaked.append(folder / "stdout")
        return RunResult(0, "successful", kwargs["tracker"].hosts, folder)

    monkeypatch.setattr(apply_mod, "run_playbook", leaky_run_playbook)
    code, _, err = run(capsys, "apply", str(example), "--yes")
    assert code == 1
    assert "a secret appeared in 1 run artifact file(s); they were deleted" in err
    assert not leaked[0].exists()
    assert StateDir.beside(example).load().runs[-1].result == "failed"


def test_version_names_ansible_core(capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out, err = capsys.readouterr()
    assert re.fullmatch(r"provision \S+ \(ansible-core 2\.\d+\.\S+, ansible \d+\.\S+, python 3\.\d+\.\d+\)\n", out), out
    assert err == ""


START_UP = """
import contextlib, io, sys
from provisioner.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(" ".join(sorted(sys.modules)))
"""


def imported_by(*argv: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", START_UP, *argv], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    return {name.split(".")[0] for name in out.split()} | set(out.split())


def test_start_up_imports_only_what_the_command_needs(kit: Any) -> None:
    # `provision --help` loads argparse, not the libraries; validate no SSH, BMC or Ansible code
    heavy = {"paramiko", "sushy", "pyghmi", "ansible_runner", "ansible", "jinja2", "requests"}
    helped = imported_by("--help")
    assert not helped & (heavy | {"rich", "pydantic", "yaml", "provisioner.manifest", "provisioner.commands"})
    validated = imported_by("validate", str(kit.examples / "llm-200k.yaml"))
    assert "provisioner.commands.validate" in validated and "pydantic" in validated
    assert not validated & (heavy | {"rich.table", "rich.live", "provisioner.apply", "provisioner.plan"})


# --------------------------------------------------------------------------- safe under mistakes (issue 18)
def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_apply_check_changes_nothing_on_disk(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 1: `apply --check` recorded nodes as installed, a run and a new munge key."""
    monkeypatch.setattr(apply_mod, "PREPARE_HOOKS", registry.prepare_hooks())  # the munge key, for real
    monkeypatch.setenv("LLM_SMTP_PASSWORD", "smtp-pw")  # the receivers' secrets are prepared too
    sd = StateDir.beside(example)
    code, out, err = run(capsys, "apply", str(example), "--check")
    assert code == 0, err
    assert not sd.root.exists()  # not even created
    (call,) = no_ansible
    assert call["check"] is True
    scratch = call["state"].root
    assert sd.root not in scratch.parents and scratch != sd.root
    assert not (scratch / "secrets").exists()  # the scratch copy's secrets are removed afterwards
    assert f"dry run: nothing under {sd.root} changed" in out
    # with a recorded state: every byte stays as it was
    settle(example)
    sd.ensure()
    (sd.secrets / "munge.key").write_bytes(os.urandom(1024))
    before = tree(sd.root)
    code, _, err = run(capsys, "apply", str(example), "--check", "--full")
    assert code == 0, err
    assert tree(sd.root) == before


def test_plan_refuses_another_clusters_state(capsys: Capsys, example: Path, kit: Any) -> None:
    """Item 11: with two manifests in one folder, plan showed the other cluster's nodes as
    removed (exit 2) while apply refused."""
    settle(example)
    other = example.with_name("music-lab.yaml")
    other.write_text((kit.examples / "music-lab.yaml").read_text())
    code, out, err = run(capsys, "plan", str(other), "--detailed-exitcode")
    assert code == 1
    assert "belongs to cluster 'llm200k', not 'musiclab'" in err and "--state-dir" in err
    assert "removed" not in out


def test_state_dir_that_is_a_file_is_a_clear_error(capsys: Capsys, example: Path, tmp_path: Path,
                                                   no_ansible: list[dict[str, Any]]) -> None:
    afile = tmp_path / "not-a-dir"
    afile.write_text("")
    for command in (["apply", "--yes"], ["plan"]):
        code, _, err = run(capsys, command[0], str(example), "--state-dir", str(afile), *command[1:])
        assert code == 1, err
        assert f"{afile} is not a directory" in err and "--state-dir" in err and "internal error" not in err


def test_a_refused_upgrade_stops_apply_before_any_change(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: plan shows a refused in-place upgrade (Slurm 22.05 -> 24.11), apply stops at it."""
    refusal = "node[01-02] run Slurm 22.05, which Slurm 24.11 cannot upgrade in place"
    monkeypatch.setattr(registry, "upgrades", lambda m, records: [("slurm", [], refusal)])
    code, out, _err = run(capsys, "plan", str(example))
    assert code == 0 and f"slurm upgrade refused: {refusal}" in " ".join(out.split())
    code, _out, err = run(capsys, "apply", str(example), "--yes")
    assert code == 1
    assert f"nothing was changed; upgrade refused: slurm: {refusal}" in " ".join(err.split())
    assert no_ansible == []


def pxe_example(example: Path) -> Path:
    """The example with its GPU nodes marked for a PXE install."""
    data = yaml.safe_load(example.read_text())
    data["nodes"][1]["install"] = "pxe"
    example.write_text(yaml.safe_dump(data, sort_keys=False))
    return example


def test_missing_bmc_password_stops_apply_before_any_change(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4: the PXE server was prepared first and every node failed afterwards."""
    monkeypatch.delenv("LLM_BMC_PASSWORD", raising=False)
    monkeypatch.setattr(apply_mod, "probe_installs",
                        lambda loaded, plan, opts: apply_mod.Installs(list(plan.installs)))
    code, _out, err = run(capsys, "apply", str(pxe_example(example)), "--yes")
    assert code == 1
    assert "nothing was changed; this run needs secrets that are not there" in err
    assert all(f"the BMC password for gpu0{i} is not set" in err for i in range(1, 5))
    assert no_ansible == []
    sd = StateDir.beside(example)
    assert not sd.root.exists()


def test_a_failed_preflight_stops_apply_before_any_change(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 3: no image in the cache (so no proof), one BMC that does not answer:
    apply names each failed check per node and changes nothing (no state, no playbook, no
    BMC action). The BMCs are asked through a stand-in: the example's addresses are a site's."""
    monkeypatch.setenv("LLM_BMC_PASSWORD", "secret")
    monkeypatch.setattr(apply_mod, "probe_installs",
                        lambda loaded, plan, opts: apply_mod.Installs(list(plan.installs)))
    asked: list[str] = []

    def bmc_answers(nodes: Any) -> dict[str, tuple[bool, str, None]]:
        asked.extend(n.name for n in nodes)
        return {n.name: (n.name != "gpu02", "power off" if n.name != "gpu02" else
                         f"BMC {n.bmc.address} of gpu02 is unreachable: timed out", None) for n in nodes}

    monkeypatch.setattr(apply_mod, "bmc_answers", bmc_answers)
    code, _out, err = run(capsys, "apply", str(pxe_example(example)), "--yes")
    assert code == 1
    assert "preflight of the PXE installs failed; nothing was changed, no node was armed or powered:" in err
    assert ("gpu01: image: FAILED: no ubuntu-22.04.tar.zst in the image cache: run provision image build MANIFEST "
            "--os ubuntu-22.04") in err
    assert "gpu01: deploy ramdisk: FAILED: no deploy ramdisk in the image cache" in err
    assert "gpu02: BMC: FAILED: BMC 10.10.1.22 of gpu02 is unreachable: timed out" in err
    assert "gpu01: BMC" not in err  # only what failed
    assert asked == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert no_ansible == []
    assert not StateDir.beside(example).root.exists()


def test_a_dry_run_shows_the_preflight_and_changes_nothing(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply --check prints every preflight check of the installs it would do (the BMCs
    asked through a stand-in: the example's addresses are a site's) and goes on."""
    monkeypatch.setenv("LLM_BMC_PASSWORD", "secret")
    monkeypatch.setattr(apply_mod, "probe_installs",
                        lambda loaded, plan, opts: apply_mod.Installs(list(plan.installs)))
    monkeypatch.setattr(apply_mod, "bmc_answers", lambda nodes: {n.name: (True, "power off", None) for n in nodes})
    code, out, _err = run(capsys, "apply", str(pxe_example(example)), "--check")
    assert "check: preflight: gpu01: image: FAILED: no ubuntu-22.04.tar.zst in the image cache" in out
    assert "check: preflight: gpu04: BMC: ok: ipmi 10.10.1.24 answers (power off)" in out
    assert "check: would install over PXE, wiping their install disks: gpu01, gpu02, gpu03, gpu04" in out
    assert not StateDir.beside(example).root.exists()
    assert code == 0 and no_ansible != []  # the other nodes were checked


def test_plan_shows_the_preflight_of_the_installs(capsys: Capsys, example: Path) -> None:
    code, out, _ = run(capsys, "plan", str(pxe_example(example)), "--json")
    assert code == 0
    checks = json.loads(out)["preflight"]
    assert {(c["node"], c["what"]) for c in checks} == {(f"gpu0{i}", w) for i in range(1, 5)
                                                        for w in ("image", "deploy ramdisk", "install disk")}
    disk = next(c for c in checks if (c["node"], c["what"]) == ("gpu01", "install disk"))
    assert disk == {"node": "gpu01", "what": "install disk", "ok": True,
                    "detail": "/dev/disk/by-id/nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W200001 (the agent refuses it "
                              "if absent)"}
    code, out, _ = run(capsys, "plan", str(example))
    assert "preflight: gpu01: image: FAILED: no ubuntu-22.04.tar.zst in the image cache" in out
    assert "preflight: apply asks each BMC too, and stops before any change if a check fails" in out


def test_plan_says_which_nodes_apply_will_wipe(capsys: Capsys, example: Path) -> None:
    """Issue 19 item 17 with issue 18 item 5: the plan shows the PXE installs per node."""
    code, out, _ = run(capsys, "plan", str(pxe_example(example)), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["installs"] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    gpu01 = next(n for n in data["nodes"] if n["name"] == "gpu01")
    assert gpu01["install"] == ("PXE install: wipes nvme-Samsung_SSD_990_PRO_2TB_S7HENJ0W200001, "
                                "writes the ubuntu-22.04 image (GPT: ESP + root)")
    code, out, _ = run(capsys, "plan", str(example))
    assert "PXE installs (they wipe the install disks): gpu01, gpu02, gpu03, gpu04" in out


def test_a_run_left_running_is_recorded_as_interrupted(
    capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]]
) -> None:
    """Item 9: a killed run stayed `result: running, finished: None` forever."""
    sd = StateDir.beside(example)
    sd.save(State(cluster="llm200k", runs=[RunRecord(id="old", started="2024-01-01T00:00:00+00:00")]))
    code, _, err = run(capsys, "apply", str(example), "--yes", "--limit", "gpu01")
    assert code == 0, err
    old = sd.load().runs[0]
    assert old.result == "interrupted" and "without recording its result" in old.note


def test_apply_verbose_hands_ansible_its_verbosity(capsys: Capsys, example: Path,
                                                   no_ansible: list[dict[str, Any]]) -> None:
    code, _, err = run(capsys, "apply", str(example), "--yes", "-vv", "--limit", "gpu01")
    assert code == 0, err
    assert no_ansible[0]["verbosity"] == 2


def test_apply_prints_where_the_log_is(capsys: Capsys, example: Path, no_ansible: list[dict[str, Any]]) -> None:
    code, out, _ = run(capsys, "apply", str(example), "--yes", "--limit", "gpu01")
    assert code == 0
    run_id = StateDir.beside(example).load().runs[-1].id
    assert f"(log: {StateDir.beside(example).runs / run_id / 'stdout'})" in out


# --------------------------------------------------------------------------- bmc needs intent (item 3)
@pytest.fixture
def fake_bmc(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    calls: list[tuple[str, list[str]]] = []

    def power(nodes: list[Any], action: str, wait: bool = True) -> list[BmcRow]:
        calls.append((action, [n.name for n in nodes]))
        return [BmcRow(n.name, "ipmi", "x", True, message="done") for n in nodes]

    def pxe(nodes: list[Any], target: str = "pxe") -> list[BmcRow]:
        calls.append((target, [n.name for n in nodes]))
        return [BmcRow(n.name, "ipmi", "x", True, message="done") for n in nodes]

    monkeypatch.setattr(bmc_cmd, "bmc_power", power)
    monkeypatch.setattr(bmc_cmd, "bmc_pxe", pxe)
    return calls


@pytest.mark.parametrize("action", ["off", "cycle", "pxe", "on", "disk"])
def test_bmc_changes_are_refused_without_a_terminal(capsys: Capsys, example: Path, action: str,
                                                    fake_bmc: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    code, out, err = run(capsys, "bmc", str(example), action)
    assert code == 1
    assert f"refusing bmc {action} without confirmation: stdin is not a terminal; pass --yes" in err
    assert fake_bmc == []
    assert "gpu04 (ipmi 10.10.1.24)" in out  # the nodes are listed first


def test_bmc_change_lists_nodes_and_asks(capsys: Capsys, example: Path, fake_bmc: list[Any],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["n", "y"])
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("rich.console.Console.input", lambda self, prompt="", **kw: next(answers))
    code, _, err = run(capsys, "bmc", str(example), "off", "--limit", "gpu[01-02]")
    assert code == 1 and "aborted: no BMC was touched" in err and fake_bmc == []
    code, out, _ = run(capsys, "bmc", str(example), "off", "--limit", "gpu[01-02]")
    assert code == 0 and fake_bmc == [("off", ["gpu01", "gpu02"])]
    assert "power OFF" in out


def test_bmc_yes_skips_the_question_and_status_needs_none(capsys: Capsys, example: Path, fake_bmc: list[Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = run(capsys, "bmc", str(example), "pxe", "--yes", "--limit", "gpu03")
    assert code == 0, err
    assert fake_bmc == [("pxe", ["gpu03"])]
    monkeypatch.setattr(bmc_cmd, "bmc_status", lambda nodes: [BmcRow(n.name, "ipmi", "x", True) for n in nodes])
    code, _, _ = run(capsys, "bmc", str(example), "status", "--limit", "gpu03")
    assert code == 0


def test_apply_check_shows_the_diff_per_node_and_the_log(
    capsys: Capsys, example: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 14: --check passed --diff but no diff was shown (it sat in the artifacts)."""
    monkeypatch.setattr(apply_mod, "PREPARE_HOOKS", [])
    monkeypatch.setattr(apply_mod, "unreachable_now", lambda loaded, names: {})

    def checking(**kwargs: Any) -> RunResult:
        tracker: Tracker = kwargs["tracker"]
        tracker.handle({"event": "runner_on_ok", "event_data": {
            "host": "gpu02", "task": "common : Render /etc/hosts",
            "res": {"changed": True, "diff": {"before": "a\n", "after": "a\nb\n", "before_header": "/etc/hosts",
                                              "after_header": "/etc/hosts"}}}})
        for host in kwargs["hosts"]:
            tracker.handle({"event": "runner_on_ok", "event_data": {"host": host, "res": {}}})
        return RunResult(0, "successful", tracker.hosts, kwargs["state"].runs / kwargs["run_id"] / "artifacts")

    monkeypatch.setattr(apply_mod, "run_playbook", checking)
    code, out, err = run(capsys, "apply", str(example), "--check")
    assert code == 0, err
    assert "--- gpu02: common : Render /etc/hosts\n--- /etc/hosts\n+++ /etc/hosts\n@@ -1 +1,2 @@\n a\n+b\n" in out
    assert re.search(r"check finished: 5 ok, 0 failed, 1 would change \(log: /\S+/provision-check-\S+/stdout\)",
                     out), out


def test_a_run_that_ends_in_an_error_is_recorded_failed_not_running(
    capsys: Capsys, example: Path, monkeypatch: pytest.MonkeyPatch, no_ansible: list[dict[str, Any]]
) -> None:
    def broken(**kwargs: Any) -> RunResult:
        raise common.ProvisionError("ansible-playbook failed (rc 250): ERROR! no such role")

    monkeypatch.setattr(apply_mod, "run_playbook", broken)
    code, _, err = run(capsys, "apply", str(example), "--yes", "--limit", "gpu01")
    assert code == 1 and "no such role" in err
    last = StateDir.beside(example).load().runs[-1]
    assert (last.result, last.note) == ("failed", "ansible-playbook failed (rc 250): ERROR! no such role")
    assert last.finished


def test_unreachable_nodes_fail_at_once_and_the_others_run(
    capsys: Capsys, example: Path, monkeypatch: pytest.MonkeyPatch, no_ansible: list[dict[str, Any]]
) -> None:
    """Item 13 (and 6): a node that refuses or has no route fails before Ansible starts, in
    words; the run goes on for the others, limited to them."""
    monkeypatch.setattr(apply_mod, "unreachable_now",
                        lambda loaded, names: {"gpu03": "no route to host (10.10.0.23:22)"})
    code, out, _ = run(capsys, "apply", str(example), "--yes")
    assert code == 1
    (call,) = no_ansible
    assert call["hosts"] == ["head01", "gpu01", "gpu02", "gpu04"] and call["limit"] == call["hosts"]
    assert "unreachable: no route to host (10.10.0.23:22)" in out
    nodes = StateDir.beside(example).load().nodes
    assert nodes["gpu03"].last_result == "unreachable" and nodes["gpu03"].applied_at is None
    assert nodes["gpu01"].last_result == "ok"
    monkeypatch.setattr(apply_mod, "unreachable_now", lambda loaded, names: dict.fromkeys(names, "refused"))
    code, out, _ = run(capsys, "apply", str(example), "--yes")
    assert code == 1 and len(no_ansible) == 1  # nobody reachable: Ansible is not started
    assert "Ansible did not run: no node was reachable" in out


@pytest.mark.parametrize(("args", "said"), [
    (["--batch", "2"], "error: --batch applies only with --rolling"),
    (["--drain-timeout", "60"], "error: --drain-timeout applies only with --rolling"),
    (["--batch", "2", "--drain-timeout", "60"], "error: --batch and --drain-timeout apply only with --rolling"),
])
def test_options_of_the_roll_without_it_are_refused(capsys: Capsys, example: Path, args: list[str], said: str,
                                                    no_ansible: list[dict[str, Any]]) -> None:
    """--batch without --rolling was silently ignored (issue 27 item 13)."""
    code, _, err = run(capsys, "apply", str(example), "--yes", *args)
    assert code == 1 and err == said + "\n" and no_ansible == []
    assert not StateDir.beside(example).root.exists()


@pytest.mark.parametrize(("args", "said"), [
    (["--install-timeout", "0"], "--install-timeout: must be at least 1: '0'"),
    (["--install-timeout", "1.5"], "--install-timeout: not a whole number of seconds: '1.5'"),
    (["--batch", "0"], "--batch: must be at least 1: '0'"),
    (["--batch", "two"], "--batch: not a whole number of nodes: 'two'"),
    (["--stall-timeout", "0"], "--stall-timeout: must be at least 1: '0'"),
    (["--drain-timeout", "1.5"], "--drain-timeout: not a whole number of seconds: '1.5'"),
])
def test_whole_number_options_name_their_unit(args: list[str], said: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["apply", "m.yaml", "--rolling", *args])
    assert e.value.code == 2
    assert said in capsys.readouterr().err
