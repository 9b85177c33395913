"""Verify the monitoring scenario: Prometheus really scrapes every node's node_exporter (every
target up == 1 through its HTTP API), our collectors' series arrive (Slurm nodes of this
scenario, the GPUs of gpu01), a stopped node_exporter makes NodeDown reach Alertmanager and the
webhook receiver, the unreachable repositories were skipped, not pretended, and no secret of
the monitoring area reached the converge's -vvv log, the inventory, the state directory
outside secrets/ or the nodes' journals.

Queries go to the head's Prometheus and Alertmanager on its loopback (curl inside the head).
Every wait is bounded.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import testinfra

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
HEAD = testinfra.get_host("ansible://monitoring-head", ansible_inventory=INVENTORY)
NODES = ["monitoring-head", "monitoring-gpu01", "monitoring-gpu02"]


def api(path: str, **params: str) -> Any:
    url = path + ("?" + urllib.parse.urlencode(params) if params else "")
    out = HEAD.check_output(f"curl -fsS --max-time 10 '{url}'")
    return json.loads(out)


def query(expr: str) -> list[dict[str, Any]]:
    data = api("http://127.0.0.1:9090/api/v1/query", query=expr)
    assert data["status"] == "success", data
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 90, step: float = 3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (AssertionError, RuntimeError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(step)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def test_every_target_is_scraped_and_up() -> None:
    def all_up() -> list[dict[str, Any]] | None:
        targets = api("http://127.0.0.1:9090/api/v1/targets", state="active")["data"]["activeTargets"]
        return targets if len(targets) == 5 and all(t["health"] == "up" for t in targets) else None

    targets = wait_for("5 healthy targets", all_up)
    by_job = sorted((t["labels"]["job"], t["labels"]["node"], t["scrapeUrl"]) for t in targets)
    assert by_job == [
        ("alertmanager", "monitoring-head", "http://10.213.47.10:9093/metrics"),
        ("node", "monitoring-gpu01", "http://10.213.47.21:9100/metrics"),
        ("node", "monitoring-gpu02", "http://10.213.47.22:9100/metrics"),
        ("node", "monitoring-head", "http://10.213.47.10:9100/metrics"),
        ("prometheus", "monitoring-head", "http://localhost:9090/metrics"),
    ]
    up = {r["metric"]["node"]: r["value"][1] for r in query('up{job="node"}')}
    assert up == {n: "1" for n in NODES}


def test_the_collectors_named_in_the_issue_are_on() -> None:
    # zfs, nfs, nfsd, mountstats, infiniband, systemd, textfile answer (no ZFS/NFS/IB kernel here:
    # the VM lab shows their series for a real pool)
    ok = query('node_scrape_collector_success{node="monitoring-gpu01"}')
    collectors = {r["metric"]["collector"] for r in ok}
    assert {"zfs", "nfs", "nfsd", "mountstats", "infiniband", "systemd", "textfile", "timex"} <= collectors
    units = query('node_systemd_unit_state{node="monitoring-head", name="prometheus.service", state="active"}')
    assert [r["value"][1] for r in units] == ["1"]


def test_slurm_metrics_show_this_scenario_s_nodes() -> None:
    def nodes() -> dict[str, str] | None:
        got = {r["metric"]["node"]: r["metric"]["state"] for r in query("provision:slurm_node_state")}
        return got or None

    assert wait_for("Slurm node states", nodes) == {"monitoring-gpu01": "mixed", "monitoring-gpu02": "drained"}
    pending = {r["metric"]["reason"]: r["value"][1] for r in query('provision_slurm_jobs_pending{partition="gpu"}')}
    assert pending["Priority"] == "4"
    gpus = query("sum(provision_slurm_node_gpus)")
    assert gpus[0]["value"][1] == "4"
    owners = {r["metric"]["hpc_job"]: r["metric"]["user"] for r in query("provision:slurm_job_info")}
    assert owners == {"12": "alice", "14": "bob"}  # keyed like the GPU job map, for GpuJobIdle


def test_gpu_metrics_from_the_collector() -> None:
    found = wait_for("GPUs of gpu01", lambda: query('provision:gpus_found{node="monitoring-gpu01"}'))
    assert found[0]["value"][1] == "2"
    temps = {r["metric"]["gpu"]: r["value"][1]
             for r in query('provision:gpu_temperature_celsius{node="monitoring-gpu01"}')}
    assert temps == {"0": "45", "1": "38"}
    # gpu02 has no nvidia-smi: its collector says so instead of inventing GPUs
    failing = query('provision_gpu_collector_success{node="monitoring-gpu02"}')
    assert [r["value"][1] for r in failing] == ["0"]


def test_unreachable_repositories_were_skipped_not_pretended() -> None:
    gpu02 = testinfra.get_host("ansible://monitoring-gpu02", ansible_inventory=INVENTORY)
    assert not gpu02.file("/etc/apt/sources.list.d/cuda.sources").exists
    assert not gpu02.package("datacenter-gpu-manager-exporter").is_installed
    assert gpu02.service("provision-gpu-collector.timer").is_running  # the fallback
    assert not HEAD.file("/etc/apt/sources.list.d/grafana.sources").exists
    assert not HEAD.package("grafana").is_installed


def test_alertmanager_holds_the_receiver_from_the_environment() -> None:
    config = HEAD.file("/etc/prometheus/alertmanager.yml")
    assert config.mode == 0o640 and config.user == "root" and config.group == "prometheus"
    assert "url: \"http://127.0.0.1:9099/alerts\"" in config.content_string
    status = api("http://127.0.0.1:9093/api/v2/status")
    assert "receiver: sink" in status["config"]["original"]


def test_a_stopped_node_exporter_makes_node_down_reach_alertmanager_and_the_receiver() -> None:
    gpu02 = testinfra.get_host("ansible://monitoring-gpu02", ansible_inventory=INVENTORY)
    gpu02.check_output("systemctl stop prometheus-node-exporter")
    try:
        def node_down() -> list[dict[str, Any]]:
            alerts = api("http://127.0.0.1:9093/api/v2/alerts", filter="alertname=NodeDown")
            return [a for a in alerts
                    if a["labels"].get("node") == "monitoring-gpu02" and a["status"]["state"] == "active"]

        (alert,) = wait_for("NodeDown in Alertmanager", node_down, timeout=120)
        assert alert["labels"]["severity"] == "critical" and alert["labels"]["cluster"] == "montest"
        assert alert["annotations"]["summary"] == "monitoring-gpu02 is down: its node_exporter does not answer"

        def delivered() -> list[dict[str, Any]]:
            text = HEAD.run("cat /var/log/webhook-sink.jsonl").stdout
            posts = [json.loads(line) for line in text.splitlines() if line.strip()]
            return [p for p in posts for a in p["alerts"]
                    if a["labels"]["alertname"] == "NodeDown" and a["labels"]["node"] == "monitoring-gpu02"]

        (post, *_) = wait_for("NodeDown at the webhook receiver", delivered, timeout=60)
        assert post["receiver"] == "sink" and post["status"] == "firing"
        # the other nodes stay quiet
        others = [a for a in api("http://127.0.0.1:9093/api/v2/alerts", filter="alertname=NodeDown")
                  if a["labels"].get("node") != "monitoring-gpu02"]
        assert others == []
    finally:
        gpu02.run("systemctl start prometheus-node-exporter")


def test_an_idle_job_is_mailed_to_its_user_with_the_receivers_login() -> None:
    """alice's job 12 holds gpu01's GPU 1, 0% busy (prepare.yml): GpuJobIdle fires after the
    manifest's 15s with her name from the Slurm collector, and Alertmanager mails it to her
    address through the receiver `mail`'s server and login (the SMTP sink records both)."""
    def idle() -> list[dict[str, Any]]:
        alerts = api("http://127.0.0.1:9093/api/v2/alerts", filter="alertname=GpuJobIdle")
        return [a for a in alerts if a["status"]["state"] == "active"]

    (alert,) = wait_for("GpuJobIdle in Alertmanager", idle, timeout=90)
    assert {k: alert["labels"].get(k) for k in ("node", "hpc_job", "user", "account")} == {
        "node": "monitoring-gpu01", "hpc_job": "12", "user": "alice", "account": "research"}
    assert sorted(r["name"] for r in alert["receivers"]) == ["_user-alice", "sink"]

    def mailed() -> list[dict[str, Any]]:
        text = HEAD.run("cat /var/log/smtp-sink.jsonl").stdout
        mails = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [m for m in mails if "GpuJobIdle" in m["data"]]

    (mail, *more) = wait_for("GpuJobIdle mailed", mailed, timeout=60)
    assert [m["to"] for m in (mail, *more)] == [["alice@cluster.test"]] * (1 + len(more))  # never to ops
    assert mail["from"] == "alertmanager@cluster.test"
    assert mail["auth"] == ["alertmanager", os.environ["MONITORING_TEST_SMTP_PASSWORD"]]
    assert "To: alice@cluster.test" in mail["data"]


def test_no_monitoring_secret_in_the_converge_log_inventory_state_or_journals() -> None:
    """Issue 27: the receivers' SMTP password and webhook URL (from the environment) and every
    secret apply's prepare step wrote (secrets/monitoring/: those two, Grafana's password) are
    in none of: converge's and idempotence's -vvv output (ANSIBLE_LOG_PATH, molecule.yml:
    every module's arguments and results), the inventory, the state directory outside
    secrets/, and the lines in which the nodes' journals log Ansible modules' arguments; raw,
    base64 or hex."""
    ephemeral = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
    state = ephemeral / "state"
    values = {os.environ["MONITORING_TEST_SMTP_PASSWORD"], os.environ["MONITORING_TEST_WEBHOOK_URL"]}
    prepared = {p.read_text().strip() for p in (state / "secrets" / "monitoring").iterdir() if p.is_file()}
    assert values <= prepared and len(prepared) >= 3, prepared  # the needles are the real ones
    needles = {f"{v[:6]}... {form}": blob for v in prepared for form, blob in (
        ("raw", v.encode()), ("base64", base64.b64encode(v.encode())), ("hex", v.encode().hex().encode()))}
    log = (ephemeral / "ansible.log").read_bytes()
    assert b"Render alertmanager.yml" in log and b"module_args" in log  # the converge, at -vvv
    found = [f"{form} in the converge log" for form, blob in needles.items() if blob in log]
    inventory_dir = Path(INVENTORY).parent
    files = [p for p in inventory_dir.rglob("*") if p.is_file()]
    files += [p for p in state.rglob("*") if p.is_file() and "secrets" not in p.relative_to(state).parts]
    found += [f"{form} in {p}" for p in files for form, blob in needles.items() if blob in p.read_bytes()]
    invocations = 0
    for node in NODES:
        host = testinfra.get_host(f"ansible://{node}", ansible_inventory=INVENTORY)
        journal = host.check_output("journalctl --no-pager -o cat | grep -F 'Invoked with' || true").encode()
        invocations += journal.count(b"Invoked with")
        found += [f"{form} in {node}'s journal" for form, blob in needles.items() if blob in journal]
    assert invocations > 0  # Ansible's modules logged their arguments there: the scan read them
    assert found == [], found
