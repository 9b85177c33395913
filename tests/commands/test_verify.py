"""`provision verify`: exit codes, --limit, --json, --junit (the SSH edge replaced by a fake)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import verify as verify_cmd
from provisioner.nodecheck import parsers
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget
from provisioner.verify.run import Execute

Capsys = pytest.CaptureFixture[str]
HOSTS = ("10.0.0.10 head01.test.internal head01\n10.0.0.21 node01.test.internal node01\n"
         "10.0.0.22 node02.test.internal node02\n")
TRACKING = "System time     : 0.000100000 seconds slow of NTP time\nLeap status     : Normal\n"


@pytest.fixture
def manifest(write_manifest: Any, kit: Any) -> Path:
    data = kit.base()
    data["slurm"] = {"enabled": False}
    data["docker"] = {"enabled": False}
    path: Path = write_manifest(data)
    return path


def fake_cluster(monkeypatch: pytest.MonkeyPatch, broken: dict[str, Output] | None = None) -> list[str]:
    """Every node a container without GPUs answering hosts and clock; ``broken``: per node,
    the answer to chronyc instead. Returns the hosts commands were sent to."""
    sent: list[str] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path) -> Execute:
        assert known_hosts.name == "known_hosts"

        def execute(host: str, text: str, timeout: int) -> Output:
            sent.append(host)
            assert host in targets
            if text == parsers.CONTEXT_COMMAND:
                return Output(stdout="container=podman\ngpu_devices=0\n")
            if text.startswith("cat /etc/hosts"):
                return Output(stdout=HOSTS)
            if text.startswith("chronyc"):
                return (broken or {}).get(host, Output(stdout=TRACKING))
            return Output(rc=127, stderr=f"{text.split()[0]}: not found")
        return execute

    monkeypatch.setattr(verify_cmd, "ssh_executor", executor)
    return sent


def test_all_pass_or_skip_exits_0(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    fake_cluster(monkeypatch)
    code = main(["verify", str(manifest), "--limit", "head01"])
    out = capsys.readouterr().out
    assert code == 0, out
    # reach, hosts, clock pass; mtu.management and mtu.data SKIP (kernel, in a container)
    assert "verify: 3 passed, 0 failed, 2 skipped on 1 nodes" in out


def test_a_failure_exits_1_and_json_junit(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys,
                                          tmp_path: Path) -> None:
    sent = fake_cluster(monkeypatch, {"node02": Output(rc=1, stderr="506 Cannot talk to daemon\n")})
    junit = tmp_path / "out" / "verify.xml"
    junit.parent.mkdir()
    code = main(["verify", str(manifest), "--json", "--junit", str(junit)])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["passed"] is False
    clock = [r for r in data["results"] if r["node"] == "node02" and r["check"] == "clock"]
    assert clock[0]["status"] == "FAIL" and "Cannot talk to daemon" in clock[0]["detail"]
    gpu = [r for r in data["results"] if r["node"] == "node01" and r["check"] == "gpu.count"]
    assert gpu[0]["status"] == "SKIP" and gpu[0]["detail"] == "no GPU device in this podman container"
    assert set(sent) == {"head01", "node01", "node02"}
    root = ET.parse(junit).getroot()
    assert root.get("failures") == str(data["counts"]["FAIL"]) and root.get("tests") == str(len(data["results"]))


def test_another_clusters_state_is_refused(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    fake_cluster(monkeypatch)
    state = manifest.parent / ".provision"
    state.mkdir()
    (state / "state.json").write_text(json.dumps({"version": 1, "cluster": "other", "nodes": {}, "runs": []}))
    assert main(["verify", str(manifest)]) == 1
    assert "belongs to cluster 'other'" in capsys.readouterr().err


def test_unknown_limit_is_an_error(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    fake_cluster(monkeypatch)
    assert main(["verify", str(manifest), "--limit", "nope"]) == 1
    assert "--limit" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["manifest", "other file", "no folder", "a folder"])
def test_junit_never_overwrites_what_is_not_a_report_nor_makes_folders(
        manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys, tmp_path: Path, target: str) -> None:
    """`verify --junit llm.yaml` replaced the manifest with the report, and a missing folder
    anywhere was created (issue 27 item 14). Refused before any node is contacted."""
    sent = fake_cluster(monkeypatch)
    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    path = {"manifest": manifest, "other file": other, "no folder": tmp_path / "new" / "deep" / "r.xml",
            "a folder": tmp_path}[target]
    before = {p: p.read_text() for p in (manifest, other)}
    assert main(["verify", str(manifest), "--junit", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --junit {path}: ") and err.count("\n") == 1, err
    assert sent == []
    assert {p: p.read_text() for p in (manifest, other)} == before
    assert not (tmp_path / "new").exists()


def test_junit_replaces_an_earlier_report(manifest: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys,
                                          tmp_path: Path) -> None:
    fake_cluster(monkeypatch)
    junit = tmp_path / "verify.xml"
    for _ in range(2):
        assert main(["verify", str(manifest), "--limit", "head01", "--junit", str(junit)]) == 0
        assert ET.parse(junit).getroot().get("tests") == "5"


def test_burn_in_flag_adds_the_burn_check_with_its_bound(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: Capsys) -> None:
    sent: list[tuple[str, int]] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            if text == parsers.CONTEXT_COMMAND:
                return Output(stdout="container=\ngpu_devices=2\n")
            if "gpu_burn" in text or '"$d/burn" ' in text:
                sent.append((host, timeout))
                return Output(stdout=("gpu 0 seconds=30.0 iterations=9 errors=0 cpu_mismatch=0 gflops=100 "
                                      "max_temp_c=50 max_power_w=200.0 slowdown=none watch=nvml\n"
                                      "gpu 1 error=out of memory\nburn-in done gpus=2\n"))
            return Output(rc=127, stderr="not found")
        return execute

    monkeypatch.setattr(verify_cmd, "ssh_executor", executor)
    code = main(["verify", str(manifest), "--limit", "node01", "--burn-in", "30", "--json"])
    data = json.loads(capsys.readouterr().out)
    (burn,) = [r for r in data["results"] if r["check"] == "gpu.burn"]
    assert (burn["status"], burn["detail"]) == ("FAIL", "GPU 1 could not run: out of memory")
    assert code == 1 and sent == [("node01", 30 + 240)]


def test_no_burn_in_without_the_flag_or_the_manifest(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: Capsys) -> None:
    fake_cluster(monkeypatch)
    main(["verify", str(manifest), "--limit", "node01", "--json"])
    assert "gpu.burn" not in {r["check"] for r in json.loads(capsys.readouterr().out)["results"]}


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_burn_in_takes_whole_positive_seconds(manifest: Path, capsys: Capsys, value: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(manifest), "--burn-in", value])
    assert exc.value.code == 2 and "--burn-in" in capsys.readouterr().err


def test_level_flag_runs_dcgmi_at_that_level_with_its_bound(manifest: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: Capsys) -> None:
    sent: list[tuple[str, int]] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path) -> Execute:
        def execute(host: str, text: str, timeout: int) -> Output:
            if text == parsers.CONTEXT_COMMAND:
                return Output(stdout="container=\ngpu_devices=2\n")
            if "dcgmi diag" in text:
                sent.append((text[text.index("dcgmi diag"):].split(";")[0], timeout))
                return Output(stdout="provision-skip: DCGM is not installed (no dcgmi)\n")
            return Output(rc=127, stderr="not found")
        return execute

    monkeypatch.setattr(verify_cmd, "ssh_executor", executor)
    main(["verify", str(manifest), "--limit", "node01", "--level", "3", "--json"])
    (row,) = [r for r in json.loads(capsys.readouterr().out)["results"] if r["check"] == "gpu.dcgm"]
    assert (row["status"], row["detail"]) == ("SKIP", "DCGM is not installed (no dcgmi)")
    assert sent == [("dcgmi diag -r 3 -j", 2700)]
    with pytest.raises(SystemExit) as exc:
        main(["verify", str(manifest), "--level", "5"])
    assert exc.value.code == 2 and "--level" in capsys.readouterr().err
