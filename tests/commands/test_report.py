"""`provision report usage`: the command around the monitoring area's report (the SSH edge
replaced by a fake that answers sacct with the usage tests' data; Prometheus unreachable)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.commands import report as report_cmd
from provisioner.nodecheck.check import Output
from provisioner.runner import SshTarget
from provisioner.verify.run import Execute

DATA = Path(__file__).resolve().parents[1] / "areas" / "monitoring" / "data" / "usage"
SINCE, UNTIL = "2023-11-14T22:14:00+00:00", "2023-11-15T00:14:00+00:00"  # T0 .. T0 + 2 h of the data
Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    shutil.copy(DATA / "cluster.yaml", path)
    return path


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def executor(targets: dict[str, SshTarget], known_hosts: Path, grace: float = 0) -> Execute:
        assert list(targets) == ["head01"] and targets["head01"].address == "10.30.0.10"

        def execute(host: str, text: str, timeout: int) -> Output:
            calls.append((host, text))
            return Output(rc=0, stdout=(DATA / "sacct.txt").read_text())

        return execute

    monkeypatch.setattr(report_cmd, "ssh_executor", executor)
    return calls


def test_the_report_as_json_and_html(manifest: Path, sent: list[tuple[str, str]], capsys: Capsys) -> None:
    page = manifest.parent / "usage.html"
    rc = main(["report", "usage", str(manifest), "--since", SINCE, "--until", UNTIL, "--json", "--html", str(page),
               "--prometheus", "http://127.0.0.1:1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert [host for host, _ in sent] == ["head01"] and " sacct --allusers " in sent[0][1]
    data = json.loads(out)
    # held GPU-hours and prices as in test_usage.py; no energy measured: 4 + 4 x 1.00 + 0.33 + 0.67
    assert data["total"]["gpu_h_allocated"] == 6.5 and data["total"]["cost"] == 9.0
    assert data["unknown"][0].startswith("Prometheus at http://127.0.0.1:1 did not answer")
    assert data["sources"] == {"slurm": "sacct on head01", "prometheus": "http://127.0.0.1:1"}
    assert "<title>GPU usage of usagetest</title>" in page.read_text()
    # a second run replaces its own report, never another file
    assert main(["report", "usage", str(manifest), "--since", SINCE, "--until", UNTIL, "--csv", "--html",
                 str(page), "--prometheus", "http://127.0.0.1:1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("total,4,6.5,")
    assert main(["report", "usage", str(manifest), "--since", SINCE, "--html", str(manifest)]) == 1
    assert "is not a usage report; refusing to overwrite it" in capsys.readouterr().err


def test_a_bad_window_and_an_unknown_grouping_are_refused(manifest: Path, sent: list[tuple[str, str]],
                                                          capsys: Capsys) -> None:
    assert main(["report", "usage", str(manifest), "--since", "last week"]) == 1
    assert "--since 'last week': give a duration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "usage", str(manifest), "--by", "team"])
    with pytest.raises(SystemExit):
        main(["report", "usage", str(manifest), "--json", "--csv"])
    assert sent == []


def test_without_slurm_accounting_there_is_nothing_to_report(manifest: Path, sent: list[tuple[str, str]],
                                                             capsys: Capsys) -> None:
    manifest.write_text(manifest.read_text().replace("  accounting: true\n", ""))
    assert main(["report", "usage", str(manifest)]) == 1
    assert "slurm.accounting is false in the manifest" in capsys.readouterr().err
    assert sent == []
