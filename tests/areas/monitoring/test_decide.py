"""provisioner.areas.monitoring.decide: servers, targets and expectations from the manifest, and
the receivers' secrets prepared into the state directory (never into the inventory)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import apply
from provisioner.areas.monitoring import decide as mon
from provisioner.errors import ProvisionError
from provisioner.manifest import Manifest
from provisioner.manifest.select import SelectorError, select_nodes
from provisioner.state import StateDir
from provisioner.validate import load_manifest

HERE = Path(__file__).parent
SMTP = "smtp-Pa55word-for-tests"
HOOK = "https://chat.mon.test/hooks/T0KEN-in-the-url"


def with_monitoring(kit: Any, section: dict[str, Any] | None = None, **data: Any) -> dict[str, Any]:
    base: dict[str, Any] = kit.base(storage=True)
    base.update(data)
    base["monitoring"] = section if section is not None else {}
    return base


# --------------------------------------------------------------------------- servers
def test_servers_default_to_services_nodes(cluster: Manifest) -> None:
    assert mon.server_names(cluster) == ["head01"]  # head01 has role services
    assert mon.servers(cluster) == [{"name": "head01", "address": "10.20.0.10"}]


def test_servers_default_to_the_head_without_services_nodes(kit: Any) -> None:
    m = kit.load(with_monitoring(kit)).manifest
    assert not m.with_role("services")
    assert mon.server_names(m) == ["head01"]


def test_servers_by_selector(kit: Any) -> None:
    m = kit.load(with_monitoring(kit, {"nodes": ["node02", "head01"]})).manifest
    assert mon.server_names(m) == ["head01", "node02"]  # manifest order
    m2 = m.model_copy(update={"monitoring": m.monitoring.model_copy(update={"nodes": ["nodex"]})})  # type: ignore[union-attr]
    with pytest.raises(SelectorError, match="unknown node 'nodex'"):
        mon.server_names(m2)


def test_alertmanager_peers_cluster_two_servers_and_not_one(kit: Any) -> None:
    two = kit.load(with_monitoring(kit, {"nodes": ["head01", "node02"]})).manifest
    assert mon.alertmanager_peers(two, two.node("head01")) == ["10.0.0.22:9094"]
    assert mon.alertmanager_peers(two, two.node("node02")) == ["10.0.0.10:9094"]
    assert mon.alertmanager_peers(two, two.node("node01")) == []
    one = kit.load(with_monitoring(kit)).manifest
    assert mon.alertmanager_peers(one, one.node("head01")) == []


# --------------------------------------------------------------------------- targets, expectations
def test_every_node_is_a_target_at_its_management_address(cluster: Manifest) -> None:
    assert mon.node_targets(cluster) == [
        {"name": "head01", "address": "10.20.0.10"},
        {"name": "gpu01", "address": "10.20.0.21"},
        {"name": "gpu02", "address": "10.20.0.22"},
    ]


def test_dcgm_targets_only_with_dcgm(cluster: Manifest, kit: Any) -> None:
    assert cluster.monitoring is not None and cluster.monitoring.gpu_metrics == "nvidia-smi"
    assert mon.dcgm_targets(cluster) == []
    m = kit.load(with_monitoring(kit, {"gpu_metrics": "dcgm"})).manifest
    assert [t["name"] for t in mon.dcgm_targets(m)] == ["node01", "node02"]


def test_expectations(cluster: Manifest) -> None:
    assert mon.expectations(cluster) == {
        "gpus": [{"node": "gpu01", "count": 2}, {"node": "gpu02", "count": 2}],
        # /home/shared is an automount: mounted on first access, not expected at boot
        "nfs_mounts": [{"node": "gpu01", "mountpoint": "/data"}, {"node": "gpu02", "mountpoint": "/data"}],
        "zpools": [{"node": "head01", "zpool": "tank"}],
        "rdma_ports": [{"node": "head01", "fabric": "infiniband", "device": ""},
                       {"node": "gpu01", "fabric": "infiniband", "device": "mlx5_0"},
                       {"node": "gpu01", "fabric": "roce", "device": "mlx5_2"},
                       {"node": "gpu02", "fabric": "infiniband", "device": "mlx5_0"},
                       {"node": "gpu02", "fabric": "roce", "device": "mlx5_2"}],
    }


def test_rdma_ports_per_nic_and_fabric(kit: Any) -> None:
    """Every NIC with its device; NICs without one once per node and fabric; a RoCE network
    without RDMA has no port to watch."""
    data = with_monitoring(kit)
    data["networks"]["roce"] = {"cidr": "10.20.3.0/24", "mtu": 9000}
    data["nodes"][1]["interfaces"]["roce"] = [
        {"ip": "10.20.3.21", "interface": "ens2f0", "rdma_device": "mlx5_2"},
        {"ip": "10.20.3.121", "interface": "ens2f1", "rdma_device": "mlx5_3"},
        {"ip": "10.20.3.221", "interface": "ens3f0"}, {"ip": "10.20.3.231", "interface": "ens3f1"}]
    m = kit.load(data).manifest
    assert [p for p in mon.rdma_ports(m) if p["node"] == "node01"] == [
        {"node": "node01", "fabric": "roce", "device": d} for d in ("mlx5_2", "mlx5_3", "")]
    data["networks"]["roce"]["rdma"] = False
    assert mon.rdma_ports(kit.load(data).manifest) == []


def test_nothing_without_a_monitoring_section(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    assert not mon.enabled(m)
    assert mon.monitored_nodes(m) == [] and mon.node_targets(m) == [] and mon.dcgm_targets(m) == []
    assert mon.expectations(m) == {"gpus": [], "nfs_mounts": [], "zpools": [], "rdma_ports": []}
    assert mon.secret_refs(m) == [] and mon.receiver_vars(m) == []


# --------------------------------------------------------------------------- receivers and secrets
def test_receivers_carry_paths_never_values(cluster: Manifest) -> None:
    assert mon.receiver_vars(cluster) == [
        {"name": "chat", "severities": ["critical"],
         "webhook": {"url_file": "{{ provision_state_dir }}/secrets/monitoring/chat.url",
                     "bearer_token_file": "{{ provision_state_dir }}/secrets/monitoring/chat.bearer_token"}},
        {"name": "ops", "severities": ["critical", "warning"],
         "email": {"to": ["ops@mon.test", "oncall@mon.test"], "sender": "alerts@mon.test",
                   "smarthost": "mail.mon.test:587", "require_tls": True, "auth_username": "alerts",
                   "auth_password_file": "{{ provision_state_dir }}/secrets/monitoring/ops.auth_password"}},
    ]
    assert mon.secret_env_names(cluster) == {"MONTEST_WEBHOOK_URL", "MONTEST_SMTP_PASSWORD"}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "chat.token"
    path.write_text("bearer-T0KEN\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def loaded(tmp_path: Path, token_file: Path) -> Any:
    text = (HERE / "data" / "cluster.yaml").read_text().replace("/etc/provision/chat.token", str(token_file))
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_manifest(path)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONTEST_WEBHOOK_URL", HOOK)
    monkeypatch.setenv("MONTEST_SMTP_PASSWORD", SMTP)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_prepare_secrets_writes_private_files(tmp_path: Path, loaded: Any, secret_env: None) -> None:
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    mon.prepare_secrets(loaded, state)
    folder = state.secrets / "monitoring"
    assert mode(folder) == 0o700
    files = {p.name: p for p in folder.iterdir()}
    assert sorted(files) == ["chat.bearer_token", "chat.url", "grafana-admin-password", "ops.auth_password"]
    assert files["chat.url"].read_text() == HOOK
    assert files["ops.auth_password"].read_text() == SMTP
    assert files["chat.bearer_token"].read_text() == "bearer-T0KEN"  # one trailing newline dropped
    assert all(mode(p) == 0o600 for p in files.values())
    assert len(files["grafana-admin-password"].read_text()) >= 32
    assert sorted(mon.secret_values(state)) == sorted(p.read_text() for p in files.values())


def test_prepare_keeps_the_grafana_password_and_drops_old_receivers(tmp_path: Path, loaded: Any,
                                                                    secret_env: None) -> None:
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    mon.prepare_secrets(loaded, state)
    folder = state.secrets / "monitoring"
    password = (folder / "grafana-admin-password").read_text()
    (folder / "gone.url").write_text("old")
    os.chmod(folder / "chat.url", 0o644)
    mon.prepare_secrets(loaded, state)
    assert (folder / "grafana-admin-password").read_text() == password
    assert not (folder / "gone.url").exists()
    assert mode(folder / "chat.url") == 0o600


def test_a_missing_variable_is_named_and_nothing_is_written(tmp_path: Path, loaded: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONTEST_WEBHOOK_URL", HOOK)
    monkeypatch.delenv("MONTEST_SMTP_PASSWORD", raising=False)
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    with pytest.raises(ProvisionError) as info:
        mon.prepare_secrets(loaded, state)
    assert str(info.value) == ("monitoring.receivers.1.email: receiver 'ops' needs its auth_password: "
                               "environment variable MONTEST_SMTP_PASSWORD is empty or unset")
    assert not (state.secrets / "monitoring").exists()


@pytest.mark.parametrize("problem, message", [
    ("world-readable", "(the bearer_token of receiver 'chat'): readable by everyone; run chmod o-r"),
    ("directory", "(the bearer_token of receiver 'chat'): not a regular file"),
    ("missing", "No such file or directory"),
    ("two lines", "must hold one non-empty line"),
    ("empty", "must hold one non-empty line"),
])
def test_a_bad_secret_file_is_refused_without_showing_it(tmp_path: Path, loaded: Any, secret_env: None,
                                                          token_file: Path, problem: str, message: str) -> None:
    if problem == "world-readable":
        token_file.chmod(0o644)
    elif problem == "directory":
        token_file.unlink()
        token_file.mkdir()
    elif problem == "missing":
        token_file.unlink()
    elif problem == "two lines":
        token_file.write_text("bearer-T0KEN\nsecond\n")
    else:
        token_file.write_text("")
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    with pytest.raises(ProvisionError) as info:
        mon.prepare_secrets(loaded, state)
    assert message in str(info.value)
    assert str(info.value).startswith("monitoring.receivers.0.webhook: ")
    assert "T0KEN" not in str(info.value)


def test_apply_scans_artifacts_for_the_monitoring_secrets(tmp_path: Path, loaded: Any, secret_env: None) -> None:
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    mon.prepare_secrets(loaded, state)
    values = apply.known_secret_values(loaded, state)
    assert {HOOK, SMTP, "bearer-T0KEN"} <= set(values)
    assert {"MONTEST_WEBHOOK_URL", "MONTEST_SMTP_PASSWORD"} <= apply.declared_secret_envs(loaded)


def test_no_monitoring_no_secrets(tmp_path: Path, kit: Any, write_manifest: Any) -> None:
    loaded = load_manifest(write_manifest(kit.base()))
    state = StateDir(tmp_path / ".provision")
    state.ensure()
    mon.prepare_secrets(loaded, state)
    assert not (state.secrets / "monitoring").exists()
    assert mon.secret_values(state) == []


# --------------------------------------------------------------------------- node images
@pytest.mark.parametrize("os_vars", sorted((HERE.parents[2] / "roles" / "node_exporter" / "vars").glob("*.yml")),
                         ids=lambda p: p.stem)
def test_image_packages_are_what_the_node_exporter_role_installs(os_vars: Path) -> None:
    role_vars = yaml.safe_load(os_vars.read_text())
    installs = [*role_vars["__node_exporter_packages"], *role_vars["__node_exporter_smart_packages"]]
    assert sorted(mon.NODE_AGENT_PACKAGES) == sorted(installs)


def test_images_carry_the_agent_only_for_a_monitored_cluster(cluster: Manifest, kit: Any) -> None:
    assert mon.image_packages(cluster) == mon.NODE_AGENT_PACKAGES
    assert mon.image_packages(kit.load(kit.base(storage=True)).manifest) == ()


# --------------------------------------------------------------------------- mountstats over RDMA
def rdma_cluster(kit: Any, os_name: str, proto: str = "rdma") -> Manifest:
    data = with_monitoring(kit)
    data["networks"]["infiniband"] = {"cidr": "10.20.2.0/24", "rdma": True}
    if os_name == "ubuntu-22.04":  # the base manifest's software fits it
        for node in data["nodes"]:
            node["os"] = os_name
    else:
        kit.on_os(data, os_name)
    for node in data["nodes"]:
        last = node["interfaces"]["management"]["ip"].rsplit(".", 1)[1]
        node["interfaces"]["infiniband"] = {"ip": f"10.20.2.{last}", "interface": "ib0"}
    data["nfs"]["exports"] = [{**data["nfs"]["exports"][0], "clients": ["infiniband"]}]
    data["nfs"]["mounts"] = [{**data["nfs"]["mounts"][0], "proto": proto}]
    manifest: Manifest = kit.load(data).manifest
    return manifest


@pytest.mark.parametrize(("os_name", "proto", "off"), [
    ("debian-12", "rdma", ["mountstats"]),      # node_exporter 1.5.0
    ("ubuntu-22.04", "rdma", ["mountstats"]),   # 1.3.1
    ("ubuntu-24.04", "rdma", []),               # 1.7.0 parses the RDMA transport
    ("debian-12", "tcp", []),
])
def test_mountstats_off_where_node_exporter_cannot_parse_rdma(kit: Any, os_name: str, proto: str,
                                                              off: list[str]) -> None:
    m = rdma_cluster(kit, os_name, proto)
    clients = [n for n in m.nodes if n.name in {c for mnt in m.nfs.mounts for c in select_nodes(m, mnt.nodes)}]
    assert clients
    for node in m.nodes:
        assert mon.collectors_off(m, node) == (off if node in clients else [])


def test_no_collector_is_off_without_monitoring(kit: Any) -> None:
    m = rdma_cluster(kit, "debian-12")
    unmonitored = m.model_copy(update={"monitoring": None})
    assert all(mon.collectors_off(unmonitored, n) == [] for n in m.nodes)
