"""Fixtures of the monitoring tests: the test manifest, the roles' templates rendered the way
Ansible's template module renders them (plain Jinja2, trim_blocks, a ``#jinja2:`` header
honoured), promtool/amtool, and the collectors loaded from roles/*/files.

promtool, amtool and prometheus come from tests/testbed/setup.sh (taken out of Debian's
prometheus packages into /usr/local/bin). Without them the tests that need them skip, unless
PROVISION_REQUIRE_PROMTOOL=1 (scripts/test.sh sets it), where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest
import yaml

from provisioner.areas.monitoring import rolevars
from provisioner.manifest import Manifest
from provisioner.platforms import PLATFORMS, OsName, os_vars_path
from provisioner.validate import load_manifest

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"
DATA = Path(__file__).parent / "data"
HEADER_RE = re.compile(r"^#jinja2:(?P<opts>.*)\n")


class Renderer:
    """Render a role's templates with role defaults < inventory variables < extra."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = files or {}  # paths a template may lookup('file', ...)

    def lookup(self, kind: str, path: str) -> str:
        assert kind == "ansible.builtin.file", kind
        return self.files[path] if path in self.files else Path(path).read_text().rstrip("\n")

    def template(self, role: str, name: str, variables: dict[str, Any]) -> str:
        text = (ROLES / role / "templates" / name).read_text()
        options: dict[str, Any] = {}
        header = HEADER_RE.match(text)
        if header:
            for item in header.group("opts").split(","):
                key, _, value = item.partition(":")
                options[key.strip()] = value.strip().strip("'\"")
            text = text[header.end():]
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True,
                                 **options)
        env.globals["lookup"] = self.lookup
        return env.from_string(text).render(**variables)


def role_defaults(role: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    return data


def role_os_vars(role: str, os_name: OsName = "debian-12") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in (ROLES / role / "vars" / "main.yml", os_vars_path(ROLES / role / "vars", PLATFORMS[os_name])):
        if path is not None and path.is_file():
            out.update(yaml.safe_load(path.read_text()) or {})
    return out


def role_vars(role: str, m: Manifest, node: str, **extra: Any) -> dict[str, Any]:
    """Variables as Ansible layers them for ``node``: defaults, group_vars/all, host_vars, OS vars."""
    merged = role_defaults(role)
    merged.update(rolevars.cluster_vars(m))
    merged.update(rolevars.node_vars(m, m.node(node)))
    merged.update(role_os_vars(role))
    merged["inventory_hostname"] = node
    merged["provision_state_dir"] = "/state"
    merged.update(extra)
    return merged


def tool(name: str) -> str:
    path = os.environ.get(name.upper()) or shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (tests/testbed/setup.sh puts it into /usr/local/bin)"
    if os.environ.get("PROVISION_REQUIRE_PROMTOOL") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def promtool() -> str:
    return tool("promtool")


@pytest.fixture
def amtool() -> str:
    return tool("amtool")


@pytest.fixture
def prometheus_binary() -> str:
    """Prometheus itself (the usage report's test against a real one; $PROMETHEUS or PATH)."""
    return tool("prometheus")


@pytest.fixture(scope="session")
def cluster() -> Manifest:
    """tests/areas/monitoring/data/cluster.yaml, validated."""
    return load_manifest(DATA / "cluster.yaml").manifest


@pytest.fixture
def renderer() -> Renderer:
    return Renderer()


@pytest.fixture
def render_rules(tmp_path: Path) -> Callable[..., Path]:
    """render_rules(manifest, **overrides) -> a folder holding the three rule files Prometheus
    loads (records, alerts with the role's defaults, the manifest's expectations)."""

    def render(m: Manifest, **overrides: Any) -> Path:
        folder = tmp_path / "rules"
        folder.mkdir(exist_ok=True)
        variables = role_vars("prometheus", m, m.head.name, **overrides)
        r = Renderer()
        shutil.copy(ROLES / "prometheus" / "files" / "provision-records.yml", folder / "provision-records.yml")
        (folder / "provision-alerts.yml").write_text(r.template("prometheus", "provision-alerts.yml.j2", variables))
        (folder / "provision-expected.yml").write_text(r.template("prometheus", "provision-expected.yml.j2", variables))
        return folder

    return render


def load_script(path: Path) -> ModuleType:
    """A collector script (roles/*/files/*.py, standard library only) as a module."""
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def slurm_collector() -> ModuleType:
    return load_script(ROLES / "slurm_metrics" / "files" / "provision_slurm_collector.py")


@pytest.fixture(scope="session")
def gpu_collector() -> ModuleType:
    return load_script(ROLES / "gpu_metrics" / "files" / "provision_gpu_collector.py")


@pytest.fixture(scope="session")
def zpool_collector() -> ModuleType:
    return load_script(ROLES / "node_exporter" / "files" / "provision_zpool_collector.py")


@pytest.fixture
def variables() -> Callable[..., dict[str, Any]]:
    """variables(role, manifest, node, **extra): a role's variables for ``node``."""
    return role_vars


@pytest.fixture
def renderer_with() -> Callable[[dict[str, str]], Renderer]:
    """renderer_with({path: content}): a renderer whose lookup('file', path) answers from the map."""
    return Renderer
