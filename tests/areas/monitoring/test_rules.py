"""The alert rules under ``promtool test rules``: every alert fires where it should and stays
quiet where it should (tests/areas/monitoring/rules/*.test.yml), on the rule files the
prometheus role installs, rendered with its defaults and the test manifest's expectations."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.manifest import Manifest

HERE = Path(__file__).parent
TESTS = sorted((HERE / "rules").glob("*.test.yml"))


def alert_names(rules_dir: Path) -> list[str]:
    data = yaml.safe_load((rules_dir / "provision-alerts.yml").read_text())
    return [r["alert"] for g in data["groups"] for r in g["rules"] if "alert" in r]


def run_tests(promtool: str, rules_dir: Path, tests: list[Path]) -> subprocess.CompletedProcess[str]:
    for test in tests:
        shutil.copy(test, rules_dir / test.name)
    return subprocess.run([promtool, "test", "rules", *(str(rules_dir / t.name) for t in tests)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_rule_files_pass_promtool_check(promtool: str, cluster: Manifest,
                                            render_rules: Callable[..., Path]) -> None:
    folder = render_rules(cluster)
    files = sorted(folder.glob("provision-*.yml"))
    assert [f.name for f in files] == ["provision-alerts.yml", "provision-expected.yml", "provision-records.yml"]
    proc = subprocess.run([promtool, "check", "rules", *map(str, files)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_fires_and_stays_quiet_under_promtool(promtool: str, cluster: Manifest,
                                                          render_rules: Callable[..., Path]) -> None:
    proc = run_tests(promtool, render_rules(cluster), TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(TESTS), proc.stdout


def test_the_tests_cover_every_alert_both_ways(cluster: Manifest, render_rules: Callable[..., Path]) -> None:
    """Each alert has a case where it fires (exp_alerts non-empty) and one where it does not."""
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in TESTS:
        data: dict[str, Any] = yaml.safe_load(test.read_text())
        assert data["rule_files"] == ["provision-records.yml", "provision-alerts.yml", "provision-expected.yml"]
        for case in data["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = alert_names(render_rules(cluster))
    assert len(names) == len(set(names)) >= 20
    assert sorted(set(names) - fires) == [], "alerts never shown firing"
    assert sorted(set(names) - quiet) == [], "alerts never shown quiet"
    assert fires | quiet <= set(names), "tests name alerts that do not exist"


def test_the_issue_s_alerts_are_all_there(cluster: Manifest, render_rules: Callable[..., Path]) -> None:
    names = set(alert_names(render_rules(cluster)))
    wanted = {
        "NodeDown", "GpuMissing", "GpuXidCritical", "GpuXidError", "GpuEccUncorrectable",
        "GpuTemperatureHigh", "ZfsPoolDegraded", "ZfsScrubErrors", "DiskSmartFailing", "NfsMountMissing",
        "FilesystemNearlyFull", "InfinibandLinkDown", "RoceLinkDown", "RdmaLinkDegraded", "SlurmNodeDown",
        "SlurmNodeDrained", "ClockDrift",
    }
    assert wanted <= names


def test_every_alert_has_a_severity_and_says_what_and_where(cluster: Manifest,
                                                           render_rules: Callable[..., Path]) -> None:
    data = yaml.safe_load((render_rules(cluster) / "provision-alerts.yml").read_text())
    for group in data["groups"]:
        for rule in (r for r in group["rules"] if "alert" in r):  # a group's records feed its alerts
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
            assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
            assert "$labels.node" in rule["annotations"]["summary"], rule["alert"]


def test_the_tests_bite_a_longer_for_breaks_them(promtool: str, cluster: Manifest,
                                                  render_rules: Callable[..., Path]) -> None:
    """The same tests against rules rendered with other thresholds fail: they test the rules."""
    proc = run_tests(promtool, render_rules(cluster, prometheus_alert_node_down_for="10m",
                                            prometheus_alert_gpu_temperature_celsius=95),
                     [HERE / "rules" / "nodes.test.yml", HERE / "rules" / "gpu.test.yml"])
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "alertname: NodeDown" in out and "alertname: GpuTemperatureHigh" in out


@pytest.mark.parametrize("variable, value, needle", [
    ("prometheus_alert_node_down_for", "15s", "for: 15s"),
    ("prometheus_alert_filesystem_free_percent", 5, "< 5\n"),
    ("prometheus_alert_xid_critical", [79, 48], 'xid=~"79|48"'),
])
def test_thresholds_are_role_variables(cluster: Manifest, render_rules: Callable[..., Path],
                                       variable: str, value: Any, needle: str) -> None:
    text = (render_rules(cluster, **{variable: value}) / "provision-alerts.yml").read_text()
    assert needle in text


IDLE_CASE = """
rule_files: [provision-records.yml, provision-alerts.yml, provision-expected.yml]
evaluation_interval: 1m
tests:
  - name: GpuJobIdle at the manifest's 2.5% for 30m (job 30 at 2%, job 31 at 3%, idle at the default 5%)
    interval: 1m
    input_series:
      - series: 'provision_gpu_utilization_ratio{node="gpu01", gpu="0", uuid="GPU-a0", hpc_job="30"}'
        values: '0.02x40'
      - series: 'provision_gpu_utilization_ratio{node="gpu01", gpu="1", uuid="GPU-a1", hpc_job="31"}'
        values: '0.03x40'
    alert_rule_test:
      - eval_time: 29m
        alertname: GpuJobIdle
        exp_alerts: []
      - eval_time: 31m
        alertname: GpuJobIdle
        exp_alerts:
          - exp_labels: {severity: warning, node: gpu01, hpc_job: "30"}
            exp_annotations:
              description: "Slurm job 30 has kept every GPU it holds on gpu01 under 2.5% busy for 30m: GPUs paid
                for and idle. Ask its owner, or end it (scancel 30)."
              summary: "Job 30 holds GPUs on gpu01 and leaves them idle"
"""


def test_the_idle_threshold_and_time_come_from_the_manifest(tmp_path: Path, kit: Any, promtool: str,
                                                            render_rules: Callable[..., Path]) -> None:
    """monitoring.gpu_job_idle reaches the rule through the area's role variables."""
    data = yaml.safe_load((HERE / "data" / "cluster.yaml").read_text())
    data["monitoring"]["gpu_job_idle"] = {"utilization_below": 0.025, "idle_for": "30m"}
    folder = render_rules(kit.load(data).manifest)
    case = tmp_path / "idle.test.yml"
    case.write_text(IDLE_CASE)
    proc = run_tests(promtool, folder, [case])
    assert proc.returncode == 0, proc.stdout + proc.stderr
