"""The Grafana dashboards (roles/grafana/files/dashboards): valid JSON that Grafana provisions,
every query valid PromQL (``promtool check rules`` on them as recording rules), and every
series of ours they or the alert rules use is one that a rule records or a collector writes."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from provisioner.areas.storage import replicate, snapshots
from provisioner.manifest import Manifest

ROOT = Path(__file__).resolve().parents[3]
DASHBOARDS = ROOT / "roles" / "grafana" / "files" / "dashboards"
NAMES = ["cluster.json", "gpus.json", "storage.json", "slurm.json"]
DATA = Path(__file__).parent / "data"


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return data


def test_the_role_installs_exactly_these_dashboards() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(NAMES)
    tasks = (ROOT / "roles/grafana/tasks/install.yml").read_text()
    assert f"loop: [{', '.join(NAMES)}]" in tasks


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_shape(name: str) -> None:
    d = load(name)
    assert d["uid"].startswith("provision-") and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "provision-prometheus"}
        assert panel["targets"] and {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_the_datasource_uid_matches(renderer: Any) -> None:
    text = renderer.template("grafana", "datasource.yml.j2", {"grafana_prometheus_url": "http://localhost:9090"})
    assert yaml.safe_load(text)["datasources"][0]["uid"] == "provision-prometheus"


def test_every_query_is_valid_promql(tmp_path: Path, promtool: str) -> None:
    rules = []
    for name in NAMES:
        for i, expr in enumerate(queries(load(name))):
            rules.append({"record": f"dashboard:{name.removesuffix('.json')}:{i}",
                          "expr": expr.replace("$node", ".*")})
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def written_by_collectors(gpu: ModuleType, slurm: ModuleType, zpool: ModuleType) -> set[str]:
    """Metric names in what the collectors write for the test data."""
    texts = [
        gpu.render(gpu.parse_query((DATA / "nvidia-smi/a6000-pair.csv").read_text()),
                   gpu.parse_xids((DATA / "nvidia-smi/kernel-xid.log").read_text()), {"0": ["1"]}, ok=True, now=1.0),
        slurm.render(slurm.parse_sinfo((DATA / "slurm/sinfo-drained-down.txt").read_text()),
                     slurm.parse_squeue((DATA / "slurm/squeue-pending.txt").read_text()), now=1.0),
        zpool.render(zpool.parse_status((DATA / "zpool/degraded-errors.txt").read_text()), now=1.0),
        # the zfs role's snapshot program (provisioner/areas/storage/snapshots.py)
        snapshots.metrics_text({"tank/a": 1}, {"tank/a": {"hourly": 2}}, {"hourly": (True, 1.0)}),
        # ... and its replication program (provisioner/areas/storage/replicate.py)
        replicate.metrics_text({("tank/a", "store2:backup/a"): {"success": 1, "last_success": 1, "newest": 1,
                                                               "max_age": 7200}}),
    ]
    return {m for t in texts for m in re.findall(r"^# TYPE (\S+)", t, re.M)}


def test_our_series_exist(cluster: Manifest, render_rules: Callable[..., Path], gpu_collector: ModuleType,
                          slurm_collector: ModuleType, zpool_collector: ModuleType) -> None:
    folder = render_rules(cluster)
    recorded = {r["record"] for f in folder.glob("*.yml") for g in yaml.safe_load(f.read_text())["groups"]
                for r in g["rules"] if "record" in r}
    written = written_by_collectors(gpu_collector, slurm_collector, zpool_collector)
    assert len(written) >= 25
    used = " ".join(q for n in NAMES for q in queries(load(n))) + (folder / "provision-alerts.yml").read_text()
    used += (folder / "provision-records.yml").read_text()
    for name in set(re.findall(r"\b(provision:[a-z_]+)", used)):
        assert name in recorded, name
    for name in {n for n in re.findall(r"\b(provision_[a-z_]+)\b", used) if not n.endswith("_")}:
        if name.endswith("_collector_success") or name.endswith("_collector_last_run_timestamp_seconds"):
            continue  # matched by a regular expression over all collectors
        assert name in written, name
