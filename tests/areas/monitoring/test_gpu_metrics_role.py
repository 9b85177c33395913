"""roles/gpu_metrics with DCGM: the packages it installs and holds, and how its exporter runs
(rendered as Ansible renders it; the real run needs a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "gpu_metrics"


def tasks(name: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = yaml.safe_load((ROLE / "tasks" / name).read_text())
    return data


def test_dcgm_brings_its_profiling_module_at_the_pinned_version_held() -> None:
    # without -proprietary the exporter's DCGM_FI_PROF_* counters (our field list has them)
    # stay empty on Ampere and older
    install = next(t for t in tasks("dcgm.yml") if t["name"] == "Install DCGM and its exporter at the pinned versions")
    assert install["ansible.builtin.apt"]["name"] == [
        "datacenter-gpu-manager-4-core={{ gpu_metrics_dcgm_version }}",
        "datacenter-gpu-manager-4-proprietary={{ gpu_metrics_dcgm_version }}",
        "datacenter-gpu-manager-exporter={{ gpu_metrics_dcgm_exporter_version }}",
    ]
    held = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__gpu_metrics_dcgm_packages"]
    assert held == ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-proprietary",
                    "datacenter-gpu-manager-exporter"]
    assert "DCGM_FI_PROF_" in (ROLE / "files" / "dcgm-counters.csv").read_text()


def test_the_exporter_connects_to_the_running_host_engine(renderer: Any) -> None:
    variables = {**yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
                 **yaml.safe_load((ROLE / "vars" / "main.yml").read_text())}
    text = renderer.template("gpu_metrics", "dcgm-exporter.conf.j2", variables)
    exec_start = [line for line in text.splitlines() if line.startswith("ExecStart=/")]
    assert len(exec_start) == 1 and " -r localhost:5555" in exec_start[0]  # not an embedded second engine
    assert "Wants=nvidia-dcgm.service" in text and "After=nvidia-dcgm.service" in text
    started = next(t for t in tasks("dcgm.yml") if t["name"].startswith("Start DCGM's host engine"))
    assert started["loop"] == ["{{ __gpu_metrics_hostengine_service }}", "{{ __gpu_metrics_dcgm_service }}"]
