"""Variables for the monitoring roles (playbooks/monitoring.yml): prometheus, alertmanager,
node_exporter, gpu_metrics, slurm_metrics, grafana.

Cluster-wide values (group_vars/all) describe what the monitoring servers scrape and expect;
they come from the manifest alone (:mod:`provisioner.areas.monitoring.decide`), so adding a
node changes only light keys: the light play re-renders prometheus.yml and the expectation
rules on the servers and reloads Prometheus, and the heavy plays run on the new node only.
Secrets are never values here: receivers carry paths into the state directory.
"""

from __future__ import annotations

from typing import Any

from provisioner.areas.monitoring import decide as mon
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

# Consumed by the light config plays only (roles prometheus and alertmanager, tasks_from:
# config): scrape targets, expectations, retention and receivers render configuration files
# and reload the daemons. The others install something (which GPU exporter, Grafana).
LIGHT_KEYS = frozenset({
    "prometheus_cluster", "prometheus_servers", "prometheus_node_targets", "prometheus_dcgm_targets",
    "prometheus_expected", "prometheus_scrape_interval", "prometheus_retention",
    "prometheus_retention_size", "prometheus_alert_idle_gpu_percent", "prometheus_alert_idle_gpu_for",
    "alertmanager_receivers",
})


def groups(m: Manifest) -> dict[str, set[str]]:
    """The monitoring area's inventory groups -> members (empty without a ``monitoring:`` section)."""
    return {
        "monitoring_server": set(mon.server_names(m)) if mon.enabled(m) else set(),
        "monitoring_node": {n.name for n in mon.monitored_nodes(m)},
    }


def cluster_vars(m: Manifest) -> dict[str, Any]:
    if m.monitoring is None:
        return {}
    mon_cfg = m.monitoring
    return {
        "prometheus_cluster": m.cluster.name,
        "prometheus_servers": mon.servers(m),
        "prometheus_node_targets": mon.node_targets(m),
        "prometheus_dcgm_targets": mon.dcgm_targets(m),
        "prometheus_expected": mon.expectations(m),
        "prometheus_scrape_interval": mon_cfg.scrape_interval,
        "prometheus_retention": mon_cfg.retention,
        "prometheus_retention_size": mon_cfg.retention_size or "",
        "prometheus_alert_idle_gpu_percent": mon.idle_percent(m),
        "prometheus_alert_idle_gpu_for": mon_cfg.gpu_job_idle.idle_for,
        "alertmanager_receivers": mon.receiver_vars(m),
        "gpu_metrics_source": mon_cfg.gpu_metrics,
        "grafana_enabled": mon_cfg.grafana,
        "grafana_admin_password_file": mon.secret_file_var(mon.GRAFANA_PASSWORD_NAME),
    }


def is_server(m: Manifest, node: Node) -> bool:
    return mon.enabled(m) and node.name in mon.server_names(m)


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    if not mon.enabled(m):
        return {}
    out: dict[str, Any] = {
        "node_exporter_zpool_collector": any(p.node == node.name for p in m.zfs.pools),
    }
    off = mon.collectors_off(m, node)
    if off:
        out["node_exporter_collectors_off"] = off
    if is_server(m, node):
        out["alertmanager_cluster_peers"] = mon.alertmanager_peers(m, node)
        if mon.admin_api(m):  # only then: the fingerprints of clusters without it stay as recorded
            out["prometheus_admin_api"] = True
    return out
