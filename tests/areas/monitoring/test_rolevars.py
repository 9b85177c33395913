"""provisioner.areas.monitoring.rolevars and the monitoring roles' templates rendered with its
output: prometheus.yml accepted by ``promtool check config`` for both examples, alertmanager.yml
by ``amtool check-config``; every variable declared; adding a node is light on the servers."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.areas import registry
from provisioner.areas.monitoring import decide as mon
from provisioner.areas.monitoring import rolevars
from provisioner.inventory import groups
from provisioner.manifest import Manifest
from provisioner.plan import cluster_fingerprint, compute, load_plays, node_sections
from provisioner.state import NodeState, State

ROOT = Path(__file__).resolve().parents[3]
ROLES = ["node_exporter", "prometheus", "alertmanager", "gpu_metrics", "slurm_metrics", "grafana"]
EXAMPLES = ["llm-200k.yaml", "music-lab.yaml"]
DATA = Path(__file__).parent / "data"


def declared(role: str) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, Any] = {}
    for entry in spec["argument_specs"].values():
        options.update(entry["options"])
    return options


def example(kit: Any, name: str) -> Manifest:
    m: Manifest = kit.load((kit.examples / name).read_text(), name).manifest
    return m


def manifests(kit: Any) -> list[Manifest]:
    return [example(kit, n) for n in EXAMPLES] + [kit.load((DATA / "cluster.yaml").read_text()).manifest]


# --------------------------------------------------------------------------- declarations
@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_declared_with_that_default(role: str) -> None:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    spec = declared(role)
    assert sorted(set(defaults) - set(spec)) == []
    assert sorted(set(spec) - set(defaults)) == []
    for key, value in defaults.items():
        if isinstance(value, (bool, int, float)) or (isinstance(value, str) and "{{" not in value and len(value) < 60):
            assert spec[key].get("default") == value, key


def test_the_inventory_gets_only_declared_variables(kit: Any) -> None:
    known: dict[str, Any] = {}
    for role in ROLES:
        known.update(declared(role))
    for m in manifests(kit):
        emitted = dict(rolevars.cluster_vars(m))
        for node in m.nodes:
            emitted.update(rolevars.node_vars(m, node))
        assert sorted(set(emitted) - set(known)) == []
        assert set(rolevars.LIGHT_KEYS) <= set(rolevars.cluster_vars(m))


def test_without_a_section_nothing_is_emitted_and_no_group_has_members(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    assert rolevars.cluster_vars(m) == {}
    assert all(rolevars.node_vars(m, n) == {} for n in m.nodes)
    g = groups(m)
    assert g["monitoring_server"] == [] and g["monitoring_node"] == []


def test_groups(kit: Any) -> None:
    g = groups(example(kit, "music-lab.yaml"))
    assert g["monitoring_server"] == ["labhead"]
    assert g["monitoring_node"] == ["labhead", "store1", "store2", "gpu1", "gpu2", "gpu3"]
    assert groups(example(kit, "llm-200k.yaml"))["monitoring_server"] == ["head01"]


def test_node_vars(kit: Any) -> None:
    m = example(kit, "music-lab.yaml")
    assert rolevars.node_vars(m, m.node("store1")) == {"node_exporter_zpool_collector": True}
    assert rolevars.node_vars(m, m.node("gpu1")) == {"node_exporter_zpool_collector": False}
    assert rolevars.node_vars(m, m.node("labhead")) == {"node_exporter_zpool_collector": False,
                                                        "alertmanager_cluster_peers": []}


def test_the_admin_api_only_where_the_heads_backup_snapshots_prometheus(kit: Any) -> None:
    """It also lets anyone who reaches Prometheus' port delete series: off unless asked for."""
    data = kit.example("music-lab.yaml")
    data["backup"] = {"destination": {"path": "/srv/backup"}, "key_env": "K"}
    m = kit.load(data).manifest
    assert not mon.admin_api(m) and "prometheus_admin_api" not in rolevars.node_vars(m, m.node("labhead"))
    data["backup"]["prometheus"] = True
    m = kit.load(data).manifest
    assert rolevars.node_vars(m, m.node("labhead"))["prometheus_admin_api"] is True
    assert "prometheus_admin_api" not in rolevars.node_vars(m, m.node("gpu1"))


# --------------------------------------------------------------------------- prometheus.yml
def render_prometheus(tmp_path: Path, m: Manifest, variables: Callable[..., dict[str, Any]],
                      renderer: Any) -> tuple[Path, dict[str, Any]]:
    conf = tmp_path / "etc-prometheus"
    (conf / "rules").mkdir(parents=True)
    v = variables("prometheus", m, mon.server_names(m)[0], __prometheus_config_dir=str(conf))
    shutil.copy(ROOT / "roles/prometheus/files/provision-records.yml", conf / "rules")
    (conf / "rules/provision-alerts.yml").write_text(renderer.template("prometheus", "provision-alerts.yml.j2", v))
    (conf / "rules/provision-expected.yml").write_text(renderer.template("prometheus", "provision-expected.yml.j2", v))
    (conf / "prometheus.yml").write_text(renderer.template("prometheus", "prometheus.yml.j2", v))
    return conf, yaml.safe_load((conf / "prometheus.yml").read_text())


@pytest.mark.parametrize("name", EXAMPLES)
def test_promtool_accepts_the_examples_configuration(tmp_path: Path, kit: Any, name: str, promtool: str,
                                                     variables: Callable[..., dict[str, Any]],
                                                     renderer: Any) -> None:
    m = example(kit, name)
    conf, config = render_prometheus(tmp_path, m, variables, renderer)
    proc = subprocess.run([promtool, "check", "config", str(conf / "prometheus.yml")], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 3 rule files found" in proc.stdout
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == ["alertmanager", "dcgm", "node", "prometheus"]
    node_targets = [(sc["labels"]["node"], sc["targets"]) for sc in jobs["node"]["static_configs"]]
    assert node_targets == [(n.name, [f"{n.ip}:9100"]) for n in m.nodes]
    gpu_nodes = [n for n in m.nodes if n.hardware.gpu is not None]
    assert [sc["targets"] for sc in jobs["dcgm"]["static_configs"]] == [[f"{n.ip}:9400"] for n in gpu_nodes]
    server = m.node(mon.server_names(m)[0])
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [f"{server.ip}:9093"]
    assert config["global"]["external_labels"] == {"cluster": m.cluster.name}


def test_no_dcgm_job_with_the_nvidia_smi_collector(tmp_path: Path, cluster: Manifest,
                                                  variables: Callable[..., dict[str, Any]], renderer: Any) -> None:
    _, config = render_prometheus(tmp_path, cluster, variables, renderer)
    assert [j["job_name"] for j in config["scrape_configs"]] == ["prometheus", "alertmanager", "node"]
    assert config["global"]["scrape_interval"] == "15s" == config["global"]["evaluation_interval"]


def test_prometheus_arguments(cluster: Manifest, variables: Callable[..., dict[str, Any]], renderer: Any) -> None:
    v = variables("prometheus", cluster, "head01", prometheus_retention_size="200GB")
    text = renderer.template("prometheus", "prometheus.default.j2", v)
    assert ('ARGS="--config.file=/etc/prometheus/prometheus.yml --web.listen-address=0.0.0.0:9090 '
            '--storage.tsdb.retention.time=30d --storage.tsdb.retention.size=200GB"') in text
    v = variables("prometheus", cluster, "head01", prometheus_admin_api=True)
    text = renderer.template("prometheus", "prometheus.default.j2", v)
    assert '--storage.tsdb.retention.time=30d --web.enable-admin-api"' in text


# --------------------------------------------------------------------------- alertmanager.yml
def fake_secret(key: str) -> str:
    """What `provision apply` would have put into the state directory for ``key``."""
    return f"https://hooks.test/T0KEN-{key}" if key.endswith(".url") else f"s3cret-{key}"


def render_alertmanager(tmp_path: Path, m: Manifest, variables: Callable[..., dict[str, Any]],
                        renderer_with: Callable[[dict[str, str]], Any]) -> Path:
    """alertmanager.yml with the secrets read where the role reads them (the state directory)."""
    r = renderer_with({mon.secret_file_var(ref.key): fake_secret(ref.key) for ref in mon.secret_refs(m)})
    path = tmp_path / "alertmanager.yml"
    path.write_text(r.template("alertmanager", "alertmanager.yml.j2", variables("alertmanager", m, m.head.name)))
    return path


def test_alertmanager_configuration_with_the_receivers_secrets(
    tmp_path: Path, cluster: Manifest, amtool: str, variables: Callable[..., dict[str, Any]],
    renderer_with: Callable[[dict[str, str]], Any],
) -> None:
    path = render_alertmanager(tmp_path, cluster, variables, renderer_with)
    proc = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " - 3 receivers" in proc.stdout and " - 1 inhibit rules" in proc.stdout
    config = yaml.safe_load(path.read_text())
    routes = config["route"]["routes"]
    assert routes == [
        {"receiver": "chat", "matchers": ['severity=~"critical"'], "continue": True},
        {"receiver": "ops", "matchers": ['severity=~"critical|warning"'], "continue": True},
    ]
    receivers = {r["name"]: r for r in config["receivers"]}
    assert receivers["_unrouted"] == {"name": "_unrouted"}
    assert receivers["chat"]["webhook_configs"] == [{
        "url": fake_secret("chat.url"), "send_resolved": True,
        "http_config": {"authorization": {"type": "Bearer", "credentials": fake_secret("chat.bearer_token")}},
    }]
    assert receivers["ops"]["email_configs"] == [{
        "to": "ops@mon.test, oncall@mon.test", "from": "alerts@mon.test", "smarthost": "mail.mon.test:587",
        "require_tls": True, "send_resolved": True, "auth_username": "alerts",
        "auth_password": fake_secret("ops.auth_password"),
    }]
    assert config["inhibit_rules"] == [{"source_matchers": ['alertname="NodeDown"'],
                                        "target_matchers": ['alertname!="NodeDown"'], "equal": ["node"]}]


@pytest.mark.parametrize("name", EXAMPLES)
def test_amtool_accepts_the_examples_configuration(
    tmp_path: Path, kit: Any, name: str, amtool: str, variables: Callable[..., dict[str, Any]],
    renderer_with: Callable[[dict[str, str]], Any],
) -> None:
    path = render_alertmanager(tmp_path, example(kit, name), variables, renderer_with)
    proc = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def idle_settings(kit: Any, **idle: Any) -> Manifest:
    """The test manifest with these monitoring.gpu_job_idle settings."""
    data = yaml.safe_load((DATA / "cluster.yaml").read_text())
    data["monitoring"]["gpu_job_idle"] = idle
    m: Manifest = kit.load(data).manifest
    return m


def idle_mail(kit: Any) -> Manifest:
    """The test manifest whose GpuJobIdle also mails the users through the receiver ops:
    alice and carol have an address, bob has none."""
    data = yaml.safe_load((DATA / "cluster.yaml").read_text())
    data["monitoring"]["gpu_job_idle"] = {"notify_users": "ops"}
    data["users"] = [{"name": "alice", "uid": 2001, "email": "alice@lab.mon.test"}, {"name": "bob", "uid": 2002},
                     {"name": "carol", "uid": 2003, "email": "carol@lab.mon.test"}]
    m: Manifest = kit.load(data).manifest
    return m


def routes(amtool: str, path: Path, *labels: str) -> list[str]:
    """The receivers Alertmanager's routing tree sends an alert with ``labels`` to (amtool's
    own answer from the rendered file, no Alertmanager running)."""
    proc = subprocess.run([amtool, "config", "routes", "test", f"--config.file={path}", *labels],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().split(",")


def test_idle_jobs_are_mailed_to_their_user_too(
    tmp_path: Path, kit: Any, amtool: str, variables: Callable[..., dict[str, Any]],
    renderer_with: Callable[[dict[str, str]], Any],
) -> None:
    m = idle_mail(kit)
    path = render_alertmanager(tmp_path, m, variables, renderer_with)
    proc = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " - 5 receivers" in proc.stdout  # _unrouted, chat, ops, and one per user with an address
    idle = ["alertname=GpuJobIdle", "severity=warning", "node=gpu01", "hpc_job=12"]
    assert routes(amtool, path, *idle, "user=alice") == ["ops", "_user-alice"]
    assert routes(amtool, path, *idle, "user=carol") == ["ops", "_user-carol"]
    assert routes(amtool, path, *idle, "user=bob") == ["ops"]  # no address: the operators only
    assert routes(amtool, path, *idle) == ["ops"]  # no Slurm collector: no user label
    assert routes(amtool, path, "alertname=GpuXidError", "severity=warning", "user=alice") == ["ops"]
    assert routes(amtool, path, "alertname=NodeDown", "severity=critical", "node=gpu01") == ["chat", "ops"]

    config = yaml.safe_load(path.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    ops = receivers["ops"]["email_configs"][0]
    assert receivers["_user-alice"]["email_configs"] == [{**ops, "to": "alice@lab.mon.test"}]
    assert receivers["_user-carol"]["email_configs"] == [{**ops, "to": "carol@lab.mon.test"}]
    # the users' mail holds the one SMTP password the operators' receiver already has, from
    # the same file in the state directory: no other secret, and nothing new to prepare
    assert [ref.key for ref in mon.secret_refs(m)] == ["chat.url", "chat.bearer_token", "ops.auth_password"]
    entries = {r["name"]: r for r in rolevars.cluster_vars(m)["alertmanager_receivers"]}
    assert entries["_user-alice"]["email"]["auth_password_file"] == mon.secret_file_var("ops.auth_password")
    assert entries["_user-alice"]["matchers"] == ['alertname="GpuJobIdle"', 'user="alice"']


def test_without_notify_users_no_user_is_mailed(kit: Any) -> None:
    m = idle_mail(kit)
    assert m.monitoring is not None
    m.monitoring.gpu_job_idle.notify_users = None
    assert [r["name"] for r in mon.receiver_vars(m)] == ["chat", "ops"]


@pytest.mark.parametrize("ratio, duration, percent", [(0.05, "60m", 5), (0.07, "90m", 7), (0.025, "2h", 2.5),
                                                      (1, "5m", 100)])
def test_idle_thresholds_come_from_the_manifest(kit: Any, ratio: float, duration: str, percent: float) -> None:
    v = rolevars.cluster_vars(idle_settings(kit, utilization_below=ratio, idle_for=duration))
    assert (v["prometheus_alert_idle_gpu_percent"], v["prometheus_alert_idle_gpu_for"]) == (percent, duration)
    assert type(v["prometheus_alert_idle_gpu_percent"]) is type(percent)  # 5, not 5.0, in the alert's text


def test_the_idle_defaults_are_the_roles(cluster: Manifest) -> None:
    v = rolevars.cluster_vars(cluster)
    defaults = yaml.safe_load((ROOT / "roles/prometheus/defaults/main.yml").read_text())
    for key in ("prometheus_alert_idle_gpu_percent", "prometheus_alert_idle_gpu_for"):
        assert v[key] == defaults[key], key


def test_alertmanager_arguments(kit: Any, variables: Callable[..., dict[str, Any]], renderer: Any) -> None:
    data = kit.base()
    data["monitoring"] = {"nodes": ["head01", "node02"]}
    m = kit.load(data).manifest
    two = renderer.template("alertmanager", "alertmanager.default.j2", variables("alertmanager", m, "head01"))
    assert "--cluster.listen-address=0.0.0.0:9094 --cluster.peer=10.0.0.22:9094\"" in two
    data["monitoring"] = {}
    one = renderer.template("alertmanager", "alertmanager.default.j2",
                            variables("alertmanager", kit.load(data).manifest, "head01"))
    assert one.rstrip().endswith('--cluster.listen-address="')  # clustering off


# --------------------------------------------------------------------------- node_exporter
def test_node_exporter_collectors(cluster: Manifest, variables: Callable[..., dict[str, Any]],
                                  renderer: Any) -> None:
    text = renderer.template("node_exporter", "prometheus-node-exporter.default.j2",
                             variables("node_exporter", cluster, "head01"))
    args = text.splitlines()[-1].removeprefix('ARGS="').removesuffix('"').split(" ")
    assert args[:2] == ["--web.listen-address=:9100",
                        "--collector.textfile.directory=/var/lib/prometheus/node-exporter"]
    for collector in ("zfs", "nfs", "nfsd", "mountstats", "infiniband", "systemd", "textfile", "timex"):
        assert f"--collector.{collector}" in args
    include = [a for a in args if a.startswith("--collector.systemd.unit-include=")]
    assert len(include) == 1 and "\\" not in include[0] and "slurmd" in include[0]
    assert not [a for a in args if a.startswith("--no-collector.")]
    # Debian's build hides /mnt and /media from the filesystem collector: the role passes its own
    (exclude,) = [a.split("=", 1)[1] for a in args if a.startswith("--collector.filesystem.mount-points-exclude=")]
    assert "\\" not in exclude
    for hidden in ("/proc", "/sys/fs/cgroup", "/run", "/run/user/0", "/dev/shm", "/var/lib/docker/overlay2/x/merged"):
        assert re.match(exclude, hidden), hidden
    for shown in ("/", "/mnt/a", "/mnt", "/media/usb", "/data", "/checkpoints", "/union", "/tank/a", "/runs"):
        assert not re.match(exclude, shown), shown


def test_node_exporter_without_mountstats_where_it_cannot_read_rdma(
        kit: Any, variables: Callable[..., dict[str, Any]], renderer: Any) -> None:
    m = example(kit, "llm-200k.yaml")  # Ubuntu 22.04 GPU nodes mounting NFS over RDMA
    assert rolevars.node_vars(m, m.node("gpu01"))["node_exporter_collectors_off"] == ["mountstats"]
    assert "node_exporter_collectors_off" not in rolevars.node_vars(m, m.node("head01"))  # mounts nothing
    text = renderer.template("node_exporter", "prometheus-node-exporter.default.j2",
                             variables("node_exporter", m, "gpu01"))
    args = text.splitlines()[-1].removeprefix('ARGS="').removesuffix('"').split(" ")
    assert "--no-collector.mountstats" in args and "--collector.mountstats" not in args
    assert {"--collector.nfs", "--collector.systemd"} <= set(args)


# --------------------------------------------------------------------------- plan: adding a node
def settled(m: Manifest) -> State:
    return State(cluster=m.cluster.name,
                 nodes={n.name: NodeState(lifecycle="configured", fingerprints=node_sections(m, n)) for n in m.nodes},
                 cluster_fingerprint=cluster_fingerprint(m))


def test_adding_a_node_is_one_light_play_on_the_server(kit: Any) -> None:
    text = (DATA / "cluster.yaml").read_text()
    m = kit.load(text).manifest
    bigger = kit.load(text.replace("name: gpu[01-02]", "name: gpu[01-03]")).manifest
    plays = load_plays(ROOT / "playbooks" / "site.yml")
    plan = compute(bigger, settled(m), plays)
    assert plan.targets == ["gpu03"]
    assert plan.cluster_files_change
    head = {n.name: n for n in plan.nodes}["head01"]
    assert head.status == "unchanged"
    assert {"prometheus (files)", "alertmanager (files)"} <= set(head.plays)
    assert not {"prometheus", "alertmanager", "grafana", "node_exporter"} & set(head.plays)
    new = {n.name: n for n in plan.nodes}["gpu03"]
    assert {"node_exporter", "gpu_metrics"} <= set(new.plays)
    # the new node's target and expectations are light keys: only the light play renders them
    area = next(a for a in registry.AREAS if a.name == "monitoring")
    before, after = area.cluster_vars(m), area.cluster_vars(bigger)
    assert {k for k in after if after[k] != before[k]} == {"prometheus_node_targets", "prometheus_expected"}
    assert {"prometheus_node_targets", "prometheus_expected"} <= area.light_keys


def test_monitoring_plays_run_nowhere_without_the_section(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    plan = compute(m, State(), load_plays(ROOT / "playbooks" / "site.yml"))
    labels = {label for n in plan.nodes for label in n.plays}
    assert not labels & {"node_exporter", "prometheus", "prometheus (files)", "gpu_metrics", "slurm_metrics"}
