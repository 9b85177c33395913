"""What the GPU roles' own expressions and templates render, per OS, with Ansible's filters.

The roles decide a few things on the node (the running kernel's flavour, the newest installed
kernel, the nvidia-persistenced drop-in, ...); these tests render those role variables and
templates with Jinja2 and Ansible's own filter and test plugins and compare them with
provisioner.areas.gpu.decide, so the Ubuntu paths (no Ubuntu archive here) are checked too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from ansible.plugins.filter.mathstuff import FilterModule as MathFilters
from ansible.plugins.filter.urlsplit import FilterModule as UrlFilters
from ansible.plugins.test.core import TestModule as CoreTests
from ansible_collections.community.general.plugins.filter.version_sort import version_sort

from provisioner.areas.gpu import decide as gpu
from provisioner.areas.gpu import rolevars as gpu_rolevars
from provisioner.platforms import PLATFORMS, os_vars_path

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True)
    env.filters.update(CoreFilters().filters())
    env.filters.update(MathFilters().filters())
    env.filters.update(UrlFilters().filters())
    env.filters["community.general.version_sort"] = version_sort
    env.tests.update(CoreTests().tests())
    return env


class RoleVars:
    """A role's vars/main.yml + vars/<OS>.yml + defaults, resolved lazily like Ansible's."""

    def __init__(self, role: str, os_name: str, **facts: Any) -> None:
        self.values: dict[str, Any] = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
        os_vars = os_vars_path(ROLES / role / "vars", PLATFORMS[os_name])  # what include_vars finds
        assert os_vars is not None, (role, os_name)
        for path in (ROLES / role / "vars" / "main.yml", os_vars):
            self.values.update(yaml.safe_load(path.read_text()))
        p = PLATFORMS[os_name]
        self.values["ansible_facts"] = {"distribution": p.distribution, "distribution_version": p.version,
                                        "distribution_major_version": p.major, **facts}
        self.values["ansible_managed"] = "Ansible managed"

    def __getitem__(self, name: str) -> Any:
        return self._render(self.values[name])

    def set(self, **values: Any) -> RoleVars:
        self.values.update(values)
        return self

    def _render(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._render(v) for v in value]
        if isinstance(value, dict):
            return {k: self._render(v) for k, v in value.items()}
        if isinstance(value, str) and "{{" in value:
            text = _render_lazily(_env().from_string(value.strip()), self)
            return yaml.safe_load(text) if text.startswith("[") else text
        return value

    def template(self, role: str, name: str) -> str:
        return _render_lazily(_env().from_string((ROLES / role / "templates" / name).read_text()), self)


class _Lazy(dict[str, Any]):
    """A template context whose variables render when read (Ansible's lazy variables)."""

    def __init__(self, role_vars: RoleVars) -> None:
        super().__init__({k: None for k in role_vars.values})
        self.role_vars = role_vars

    def __getitem__(self, name: str) -> Any:
        return self.role_vars[name]


def _render_lazily(template: jinja2.Template, role_vars: RoleVars) -> str:
    context = template.new_context(_Lazy(role_vars), shared=True)
    return "".join(template.root_render_func(context))


# --------------------------------------------------------------------------- nvidia_driver: kernel (item 3)
FLAVOURS = [
    ("ubuntu-22.04", "5.15.0-91-generic"),
    ("ubuntu-22.04", "6.8.0-50-generic"),
    ("ubuntu-24.04", "6.8.0-50-generic"),
    ("ubuntu-24.04", "6.11.0-29-generic"),
    ("ubuntu-22.04", "5.15.0-1050-aws"),
    ("debian-12", "6.1.0-18-amd64"),
    ("debian-12", "6.1.0-18-cloud-amd64"),
    ("debian-12", "6.12.12+bpo-amd64"),
]


@pytest.mark.parametrize(("os_name", "release"), FLAVOURS)
def test_role_kernel_flavour_agrees(os_name: str, release: str) -> None:
    role = RoleVars("nvidia_driver", os_name, kernel=release)
    assert role["__nvidia_driver_running_flavour"] == gpu.kernel_flavour(os_name, release)


def test_role_finds_the_newest_installed_kernel_of_the_running_flavour() -> None:
    packages = {name: [{"version": "1"}] for name in (
        "linux-image-6.8.0-9-generic", "linux-image-6.8.0-50-generic", "linux-image-unsigned-6.8.0-49-generic",
        "linux-image-6.8.0-51-lowlatency", "linux-image-generic-hwe-22.04", "linux-image-6.8.0-50-generic-dbgsym",
        "linux-modules-nvidia-580-server-6.8.0-50-generic")}
    role = RoleVars("nvidia_driver", "ubuntu-22.04", kernel="6.8.0-9-generic", packages=packages)
    releases = role["__nvidia_driver_kernel_releases"]
    assert releases == ["6.8.0-9-generic", "6.8.0-49-generic", "6.8.0-50-generic"]
    plan = gpu.resolve_driver("ubuntu-22.04", "580", open_kernel_modules=False, kernel_flavour="generic-hwe-22.04")
    assert plan.for_kernel(releases[-1]) == "linux-modules-nvidia-580-server-6.8.0-50-generic"


# --------------------------------------------------------------------------- nvidia_driver: persistence (item 4)
@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_persistenced_dropin_starts_the_daemon_with_persistence_mode_on(os_name: str) -> None:
    text = RoleVars("nvidia_driver", os_name).template("nvidia_driver", "persistenced-dropin.conf.j2")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    user = "nvpd" if os_name == "debian-12" else "nvidia-persistenced"
    assert lines[0] == "[Service]"
    assert lines[1] == "ExecStart="  # clears the packaged command (Ubuntu's has --no-persistence-mode)
    assert lines[2].startswith(f"ExecStart=/usr/bin/nvidia-persistenced --user {user}")
    assert "persistence-mode" not in " ".join(lines)


# --------------------------------------------------------------------------- nvidia_container_toolkit: CDI (item 8)
@pytest.mark.parametrize(("version", "refresh"), [("1.17.8-1", False), ("1.17.99-1", False), ("1.18.0-1", True),
                                                  ("1.18.2-1", True), ("1.19.0-1", True), ("1.20.1", True)])
def test_cdi_refresh_units_from_toolkit_1_18_and_never_two_specs(version: str, refresh: bool) -> None:
    role = RoleVars("nvidia_container_toolkit", "ubuntu-24.04").set(nvidia_container_toolkit_version=version)
    assert role["__nvidia_container_toolkit_cdi_refresh"] == str(refresh)
    wanted = "/var/run/cdi/nvidia.yaml" if refresh else "/etc/cdi/nvidia.yaml"
    assert role["__nvidia_container_toolkit_cdi_wanted_spec"] == wanted
    # the other mechanism's spec is removed: one spec only
    assert role["__nvidia_container_toolkit_stale_specs"] == (
        ["/etc/cdi/nvidia.yaml"] if refresh else ["/var/run/cdi/nvidia.yaml"])


def test_cdi_spec_at_the_refresh_path_is_not_removed() -> None:
    role = RoleVars("nvidia_container_toolkit", "debian-12").set(nvidia_container_toolkit_version="1.18.0-1",
                                                                 nvidia_container_toolkit_cdi_spec="/var/run/cdi/nvidia.yaml")
    assert role["__nvidia_container_toolkit_stale_specs"] == []


def test_cdi_stamp_changes_with_the_driver_and_the_toolkit() -> None:
    """The spec is regenerated when the stamp differs: a new driver or toolkit changes it."""
    def stamp(driver: str, toolkit: str) -> str:
        role = RoleVars("nvidia_container_toolkit", "debian-12").set(
            nvidia_container_toolkit_version=toolkit, __nvidia_container_toolkit_driver_version=driver)
        return str(role["__nvidia_container_toolkit_cdi_stamp_content"])

    first = stamp("580.95.05", "1.17.8-1")
    assert "driver 580.95.05" in first.splitlines() and "toolkit 1.17.8-1" in first.splitlines()
    assert first == stamp("580.95.05", "1.17.8-1")
    assert first != stamp("580.105.08", "1.17.8-1")
    assert first != stamp("580.95.05", "1.17.9-1")


# --------------------------------------------------------------------------- also: fabric manager, cuda-keyring
@pytest.mark.parametrize(("os_name", "source", "url", "pin"), [
    ("ubuntu-22.04", "ubuntu-signed", "", "release o=Ubuntu"),
    ("ubuntu-24.04", "cuda-repo", "", "origin developer.download.nvidia.com"),
    ("ubuntu-24.04", "cuda-repo", "http://mirror.cluster.test/cuda/ubuntu2404/x86_64/", "origin mirror.cluster.test"),
    ("debian-12", "cuda-repo", "", "origin developer.download.nvidia.com"),
])
def test_fabricmanager_pin_takes_the_drivers_repository(os_name: str, source: str, url: str, pin: str) -> None:
    role = RoleVars("nvidia_driver", os_name).set(
        nvidia_driver_cuda_repo_url=url, __nvidia_driver_src=source, __nvidia_driver_o="-open",
        __nvidia_driver_flavour="generic", __nvidia_driver_kernel_release="6.8.0-50-generic",
        __nvidia_driver_fm=["nvidia-fabricmanager-580", "libnvidia-nscq-580"])
    text = role.template("nvidia_driver", "fabricmanager-pin.j2")
    stanza = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert stanza == ["Package: nvidia-fabricmanager-580 libnvidia-nscq-580", f"Pin: {pin}", "Pin-Priority: 1001"]
    if not url:
        assert pin == gpu.resolve_driver(os_name, "580", source, nvswitch=True).fabricmanager_pin


# cuda-keyring's list (NVIDIA's network-repository setup) for the same repository, with its own Signed-By
KEYRING_LIST = ("deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                "https://developer.download.nvidia.com/compute/cuda/repos/{dist}/x86_64/ /")


@pytest.mark.parametrize(("role", "url_var"), [("nvidia_driver", "nvidia_driver_cuda_repo_url"),
                                               ("cuda", "cuda_repo_url"), ("nccl", "nccl_cuda_repo_url")])
@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_other_definitions_of_the_cuda_repository_are_found(role: str, url_var: str, os_name: str) -> None:
    """ansible.builtin.find matches `contains` at each line's start (re.match)."""
    dist = gpu.CUDA_REPO_DIST[os_name]
    pattern = re.compile(str(RoleVars(role, os_name)[f"__{role}_repo_other_re"]))
    assert pattern.match(KEYRING_LIST.format(dist=dist))
    assert pattern.match(f"URIs: http://developer.download.nvidia.com/compute/cuda/repos/{dist}/x86_64")
    assert not pattern.match("# " + KEYRING_LIST.format(dist=dist))  # commented out: harmless
    other = "debian12" if dist != "debian12" else "ubuntu2204"
    assert not pattern.match(KEYRING_LIST.format(dist=other))  # another repository
    assert not pattern.match("deb https://nvidia.github.io/libnvidia-container/stable/deb/amd64 /")
    mirrored = RoleVars(role, os_name).set(**{url_var: "https://mirror.cluster.test/cuda/x86_64/"})
    line = "deb [arch=amd64] https://mirror.cluster.test/cuda/x86_64/ /"
    assert re.match(str(mirrored[f"__{role}_repo_other_re"]), line)


def test_nccl_conf_carries_the_manifest_env(kit: Any) -> None:
    """/etc/nccl.conf (role nccl) from the rolevars of a RoCE GPU node: NAME=value lines."""
    data = kit.base()
    data["networks"]["roce"] = {"cidr": "10.0.4.0/24", "gid_index": 3, "traffic_class": 106}
    data["nodes"][1]["interfaces"]["roce"] = {"ip": "10.0.4.21", "interface": "ens2f0np0", "rdma_device": "mlx5_0"}
    m = kit.load(data).manifest
    env = gpu_rolevars.node_vars(m, m.node("node01"))["nccl_env"]
    text = _env().from_string((ROLES / "nccl" / "templates" / "nccl.conf.j2").read_text()).render(
        nccl_env=env, ansible_managed="Ansible managed")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["NCCL_IB_GID_INDEX=3", "NCCL_IB_HCA==mlx5_0", "NCCL_IB_TC=106"]
