"""provisioner.areas.gpu.decide: per-OS package/version resolution, and its agreement with the roles.

The roles compute package names from roles/<role>/vars/*.yml on their own; the drift tests
render those files with Jinja2 and compare them with provisioner.areas.gpu.decide for every OS/source.
The nvidia_driver role's fact module (PCI detection, reboot reasons) is tested on a fake
sysfs tree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.plugins.filter.urlsplit import split_url

from provisioner.areas.gpu import decide as gpu
from provisioner.areas.gpu.decide import GpuStackError
from provisioner.manifest.software import NvidiaDriver
from provisioner.platforms import PLATFORMS, os_vars_path
from tests.areas.roletemplates import role_module

ROOT = Path(__file__).resolve().parents[3]
ROLES = ROOT / "roles"


# --------------------------------------------------------------------------- driver
def test_ubuntu_signed_default_is_canonical_precompiled_modules() -> None:
    plan = gpu.resolve_driver("ubuntu-22.04", "580", open_kernel_modules=False)
    assert plan.source == "ubuntu-signed"
    assert not plan.open_kernel_modules
    assert plan.packages == (
        "linux-modules-nvidia-580-server-generic",
        "nvidia-headless-no-dkms-580-server",
        "nvidia-utils-580-server",
    )
    assert plan.userspace_packages == (
        "nvidia-utils-580-server", "libnvidia-compute-580-server", "nvidia-compute-utils-580-server")
    assert plan.fabricmanager_packages == ()
    assert plan.pin_packages == ()
    assert not plan.uses_cuda_repo
    assert plan.install(kernel=True) == (*plan.packages, "libnvidia-compute-580-server",
                                         "nvidia-compute-utils-580-server")
    assert plan.holds(kernel=False) == plan.userspace_packages


@pytest.mark.parametrize("flavour", ["generic", "generic-hwe-22.04"])
def test_precompiled_modules_hold_the_kernel_of_their_flavour(flavour: str) -> None:
    """Held alone, the module meta lets a new kernel ABI in without a module (item 3)."""
    plan = gpu.resolve_driver("ubuntu-22.04", "580", kernel_flavour=flavour)
    assert plan.packages[0].endswith(f"-{flavour}")
    metas = (f"linux-{flavour}", f"linux-image-{flavour}", f"linux-headers-{flavour}")
    assert plan.kernel_packages == metas
    assert set(metas) <= set(plan.holds(kernel=True)) and plan.packages[0] in plan.holds(kernel=True)
    assert not set(metas) & set(plan.holds(kernel=False))  # no module, nothing to keep in step
    assert gpu.resolve_driver("ubuntu-22.04", "580", "cuda-repo").kernel_packages == ()  # DKMS rebuilds
    assert gpu.resolve_driver("debian-12", "535").kernel_packages == ()


@pytest.mark.parametrize(("os_name", "source", "flavour"), [("ubuntu-24.04", "cuda-repo", "generic-hwe-24.04"),
                                                            ("debian-12", "debian", "cloud-amd64"),
                                                            ("debian-12", "cuda-repo", "amd64")])
def test_dkms_sources_install_the_headers_meta_of_the_kernel_flavour_unheld(os_name: str, source: str,
                                                                           flavour: str) -> None:
    """DKMS builds for a new kernel only when its headers come with it (item 3)."""
    branch = "535" if source == "debian" else "580"
    plan = gpu.resolve_driver(os_name, branch, source, kernel_flavour=flavour)
    assert f"linux-headers-{flavour}" in plan.install(kernel=True)
    assert f"linux-headers-{flavour}" not in plan.holds(kernel=True)
    assert plan.for_kernel("6.8.0-50-generic") == "linux-headers-6.8.0-50-generic"


def test_the_newest_kernel_gets_the_module_build_of_its_abi() -> None:
    plan = gpu.resolve_driver("ubuntu-24.04", "580", open_kernel_modules=True)
    assert plan.for_kernel("6.8.0-50-generic") == "linux-modules-nvidia-580-server-open-6.8.0-50-generic"
    closed = gpu.resolve_driver("ubuntu-22.04", "470")
    assert closed.for_kernel("5.15.0-91-generic") == "linux-modules-nvidia-470-server-5.15.0-91-generic"


@pytest.mark.parametrize(("os_name", "release", "flavour"), [
    ("ubuntu-22.04", "5.15.0-91-generic", "generic"),
    ("ubuntu-22.04", "6.8.0-50-generic", "generic-hwe-22.04"),
    ("ubuntu-24.04", "6.8.0-50-generic", "generic"),
    ("ubuntu-24.04", "6.11.0-29-generic", "generic-hwe-24.04"),
    ("ubuntu-22.04", "5.15.0-1050-aws", "aws"),
    ("debian-12", "6.1.0-18-amd64", "amd64"),
    ("debian-12", "6.1.0-18-cloud-amd64", "cloud-amd64"),
    ("debian-12", "6.12.12+bpo-amd64", "amd64"),  # backports: the same metas, no HWE suffix
])
def test_kernel_flavour(os_name: str, release: str, flavour: str) -> None:
    assert gpu.kernel_flavour(os_name, release) == flavour


def test_ubuntu_signed_open_modules_and_hwe_flavour() -> None:
    plan = gpu.resolve_driver("ubuntu-24.04", "595", "ubuntu-signed", True, kernel_flavour="generic-hwe-24.04")
    assert plan.packages[0] == "linux-modules-nvidia-595-server-open-generic-hwe-24.04"
    assert plan.packages[1] == "nvidia-headless-no-dkms-595-server-open"


def test_open_modules_default_from_560() -> None:
    assert not gpu.resolve_driver("ubuntu-22.04", "470").open_kernel_modules
    assert gpu.resolve_driver("ubuntu-22.04", "580").open_kernel_modules
    assert not gpu.resolve_driver("ubuntu-22.04", "580", open_kernel_modules=False).open_kernel_modules


def test_nvswitch_adds_fabricmanager_of_the_same_branch() -> None:
    plan = gpu.resolve_driver("ubuntu-22.04", "580", nvswitch=True)
    assert plan.fabricmanager_packages == ("nvidia-fabricmanager-580", "libnvidia-nscq-580")
    assert "nvidia-fabricmanager-580" in plan.holds(kernel=True)
    assert plan.install(kernel=False)[-2:] == ("nvidia-fabricmanager-580", "libnvidia-nscq-580")


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04"])
@pytest.mark.parametrize(("branch", "target"), [("535", "580"), ("550", "580"), ("565", "580"), ("570", "580"),
                                                ("575", "580"), ("590", "595")])
def test_transitional_ubuntu_branches_are_refused_with_the_branch_to_use(os_name: str, branch: str,
                                                                        target: str) -> None:
    with pytest.raises(GpuStackError, match=re.escape(f'transitional: they install branch {target}')) as err:
        gpu.resolve_driver(os_name, branch)
    assert f'set nvidia_driver.branch: "{target}"' in str(err.value)
    assert target in gpu.UBUNTU_SERVER_BRANCHES  # the branch named is a current one


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04"])
@pytest.mark.parametrize("branch", ["470", "580", "595", "615"])
def test_current_ubuntu_branches_resolve(os_name: str, branch: str) -> None:
    plan = gpu.resolve_driver(os_name, branch)
    assert plan.packages[0].startswith(f"linux-modules-nvidia-{branch}-server")


def test_model_default_branch_is_current_for_every_driver_source() -> None:
    branch = NvidiaDriver().branch
    assert branch in gpu.UBUNTU_SERVER_BRANCHES and branch in gpu.CUDA_REPO_BRANCHES
    assert branch not in gpu.UBUNTU_TRANSITIONAL


def test_driver_problems_are_all_reported() -> None:
    problems = gpu.driver_problems("ubuntu-22.04", "550", "ubuntu-signed", False, gpu_model="GeForce RTX 5090")
    assert len(problems) == 3, problems
    assert any("transitional" in p for p in problems)
    assert any("needs driver branch 570" in p for p in problems)
    assert any("only with the open kernel modules" in p for p in problems)


@pytest.mark.parametrize("os_name", ["ubuntu-22.04", "ubuntu-24.04"])
def test_cuda_repo_on_ubuntu(os_name: str) -> None:
    closed = gpu.resolve_driver(os_name, "550", "cuda-repo", False)
    assert closed.packages == ("cuda-drivers-550", "linux-headers-generic")
    assert closed.uses_cuda_repo
    opened = gpu.resolve_driver(os_name, "550", "cuda-repo", True)
    assert opened.packages == ("nvidia-kernel-open-550", "cuda-drivers-550", "linux-headers-generic")
    assert opened.userspace_packages == ("nvidia-utils-550", "libnvidia-compute-550", "nvidia-compute-utils-550")


def test_debian_driver_is_535_from_non_free() -> None:
    plan = gpu.resolve_driver("debian-12", "535")
    assert plan.source == "debian"
    assert plan.packages == ("nvidia-driver", "nvidia-kernel-dkms", "firmware-misc-nonfree", "linux-headers-amd64",
                             "nvidia-smi", "nvidia-persistenced")
    assert plan.userspace_packages == ("nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
    assert "nvidia-smi" in plan.pin_packages and "firmware-misc-nonfree" not in plan.pin_packages
    assert "linux-headers-amd64" in plan.install(kernel=True)
    assert "linux-headers-amd64" not in plan.holds(kernel=True)
    assert plan.holds(kernel=False) == ("nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-persistenced")
    assert gpu.resolve_driver("debian-12", "535", "debian", True).packages[1] == "nvidia-open-kernel-dkms"


def test_debian_cuda_repo_uses_debian_names_pinned_to_the_branch() -> None:
    plan = gpu.resolve_driver("debian-12", "570", "cuda-repo", nvswitch=True)
    assert plan.open_kernel_modules
    assert plan.packages == ("nvidia-kernel-open-dkms", "cuda-drivers-570", "linux-headers-amd64")
    assert plan.unheld_packages == ("linux-headers-amd64",)
    assert plan.pin_packages == ("nvidia-kernel-open-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1",
                                 "nvidia-persistenced")
    assert plan.fabricmanager_packages == ("nvidia-fabricmanager-570", "libnvidia-nscq-570")


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("ubuntu-22.04", "999"), {}, "unknown NVIDIA driver branch '999'"),
        (("ubuntu-22.04", "551"), {}, "known branches: 470, 535"),
        (("debian-12", "535", "ubuntu-signed"), {}, "exists only on Ubuntu"),
        (("ubuntu-24.04", "535", "debian"), {}, "for Debian nodes"),
        (("debian-12", "550", "debian"), {}, "Debian 12 ships driver branch 535 only"),
        (("debian-12", "535", "debian"), {"nvswitch": True}, "does not package nvidia-fabricmanager"),
        (("ubuntu-22.04", "560", "ubuntu-signed"), {}, "no signed '-server' modules for branch 560"),
        (("ubuntu-24.04", "610"), {}, "for newer releases only"),
        (("ubuntu-24.04", "615", "auto", False), {}, "no proprietary kernel modules for the 615-server"),
        (("ubuntu-24.04", "595", "cuda-repo"), {}, "names its driver packages without the branch"),
        (("ubuntu-22.04", "470", "auto", True), {}, "open kernel modules need branch 515"),
        (("ubuntu-22.04", "550"), {"gpu_model": "NVIDIA B200"}, "needs driver branch 570"),
        (("ubuntu-22.04", "570", "auto", False), {"gpu_model": "GeForce RTX 5090"}, "only with the open kernel"),
        (("centos-7", "550"), {}, "unsupported OS 'centos-7'"),
        (("ubuntu-22.04", "550", "nouveau"), {}, "unknown driver source"),
    ],
)
def test_driver_errors(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(GpuStackError, match=re.escape(message)):
        gpu.resolve_driver(*args, **kwargs)


def test_gpu_stack_error_is_a_value_error() -> None:
    assert issubclass(GpuStackError, ValueError)


@pytest.mark.parametrize(
    ("model", "count", "flag", "expected"),
    [
        ("H100 SXM5 80GB", 8, False, True),
        ("HGX A100-80GB", 8, False, True),
        ("A100 SXM4", 4, False, False),
        ("H100 PCIe", 8, False, False),
        ("RTX A6000", 2, True, True),
    ],
)
def test_has_nvswitch(model: str, count: int, flag: bool, expected: bool) -> None:
    assert gpu.has_nvswitch(model, count, flag) is expected


# --------------------------------------------------------------------------- CUDA
def test_cuda_repo_versions_side_by_side() -> None:
    plan = gpu.resolve_cuda("ubuntu-22.04", ["12.1", "12.4"], source="auto", cudnn=True, driver_branch="550")
    assert plan.source == "cuda-repo"
    assert plan.default == "12.4"
    # gcc/g++ with the toolkits: nvcc compiles the smoke program with them (NVIDIA's packages lack the dependency)
    assert plan.packages == ("cuda-toolkit-12-1", "cuda-toolkit-12-4", "gcc", "g++")
    assert plan.cudnn_packages == ("cudnn9-cuda-12",)
    assert plan.prefixes == {"12.1": "/usr/local/cuda-12.1", "12.4": "/usr/local/cuda-12.4"}
    assert gpu.resolve_cuda("ubuntu-22.04", ["11.8", "12.4"], "11.8", cudnn=True).cudnn_packages == (
        "cudnn9-cuda-11", "cudnn9-cuda-12")


def test_debian_cuda_is_11_8_with_compilers() -> None:
    plan = gpu.resolve_cuda("debian-12", ["11.8"])
    assert plan.source == "debian"
    assert plan.packages == ("nvidia-cuda-toolkit", "gcc", "g++")
    assert not plan.uses_cuda_repo


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("debian-12", ["12.8"]), {}, "CUDA 12.8 from Debian: Debian 12 ships CUDA 11.8 only"),
        (("debian-12", ["11.8"], None, "debian", True), {}, "cuDNN with CUDA source 'debian'"),
        (("ubuntu-22.04", ["11.8"], None, "debian"), {}, "for Debian nodes"),
        (("ubuntu-24.04", ["12.4"]), {}, "CUDA 12.4 is not in NVIDIA's ubuntu2404 repository"),
        (("ubuntu-22.04", ["12.7"]), {}, "CUDA 12.7 is not in NVIDIA's ubuntu2204"),
        (("ubuntu-22.04", ["12.4"]), {"driver_branch": "470"}, "CUDA 12.4 needs driver branch 525"),
        (("ubuntu-22.04", ["13.0"]), {"driver_branch": "570"}, "CUDA 13.0 needs driver branch 580"),
        (("ubuntu-22.04", ["12.4"], "12.8"), {}, "default CUDA 12.8 is not one of"),
        (("ubuntu-22.04", ["12.4", "12.4"]), {}, "listed twice"),
        (("ubuntu-22.04", []), {}, "empty"),
    ],
)
def test_cuda_errors(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(GpuStackError, match=re.escape(message)):
        gpu.resolve_cuda(*args, **kwargs)


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_default_toolkit_is_valid_on_every_os_and_source(os_name: str) -> None:
    for source in gpu.CUDA_SOURCES:
        if source not in gpu.CUDA_DEFAULTS[os_name]:
            continue
        plan = gpu.resolve_cuda(os_name, None, source=source, driver_branch=NvidiaDriver().branch)
        assert plan.versions == gpu.default_cuda_versions(os_name, source)
        nccl = gpu.resolve_nccl(os_name, "2.21.5", cuda_version=plan.default)  # the manifest's default NCCL
        assert nccl.version == "2.21.5"
    assert gpu.resolve_cuda(os_name, None).versions  # auto


def test_cuda_auto_follows_a_cuda_repo_driver_on_debian() -> None:
    assert gpu.resolve_cuda("debian-12", None).source == "debian"
    plan = gpu.resolve_cuda("debian-12", ["12.8"], driver_source="cuda-repo")
    assert plan.source == "cuda-repo" and plan.packages == ("cuda-toolkit-12-8", "gcc", "g++")
    with pytest.raises(GpuStackError, match=re.escape("cuda.source auto follows nvidia_driver.source: cuda-repo only")):
        gpu.resolve_cuda("debian-12", ["12.8"], driver_source="debian")


def test_cuda_repo_on_debian_12() -> None:
    plan = gpu.resolve_cuda("debian-12", ["12.8"], source="cuda-repo")
    assert plan.packages == ("cuda-toolkit-12-8", "gcc", "g++")
    assert plan.uses_cuda_repo


# --------------------------------------------------------------------------- NCCL
def test_nccl_apt_pins_the_build_of_the_toolkit() -> None:
    plan = gpu.resolve_nccl("ubuntu-22.04", "2.21.5", cuda_version="12.4")
    assert plan.source == "apt"
    assert plan.packages == ("libnccl2=2.21.5-1+cuda12.4", "libnccl-dev=2.21.5-1+cuda12.4")
    assert plan.prefix == "/usr"
    assert plan.uses_cuda_repo


@pytest.mark.parametrize(
    ("os_name", "version", "cuda", "build"),
    [
        ("ubuntu-22.04", "2.21.5", "12.6", "12.5"),  # newest build not newer than the toolkit
        ("ubuntu-22.04", "2.21.5", "12.1", "12.2"),  # else the oldest newer one of the same major
        ("ubuntu-22.04", "2.21.5", "11.8", "11.0"),
        ("ubuntu-22.04", "2.26.2", "12.8", "12.8"),
        ("ubuntu-22.04", "2.27.7", "13.0", "13.0"),
        ("ubuntu-24.04", "2.21.5", "12.8", "12.5"),  # ubuntu2404 has no 12.2/12.4 builds
        ("ubuntu-24.04", "2.26.2", "12.9", "12.8"),
        ("debian-12", "2.21.5", "12.8", "12.5"),
    ],
)
def test_pick_nccl_build(os_name: str, version: str, cuda: str, build: str) -> None:
    assert gpu.pick_nccl_build(os_name, version, cuda) == build


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_nccl_builds_exist_only_for_toolkits_of_that_repository(os_name: str) -> None:
    first = min(gpu.CUDA_REPO_VERSIONS[os_name], key=gpu.version_tuple)
    for version, builds in gpu.NCCL_APT_BUILDS[os_name].items():
        assert builds, version
        if os_name != "ubuntu-22.04":  # ubuntu2204 also carries the 11.0/12.0 builds of old toolkits
            assert all(gpu.version_tuple(b) >= gpu.version_tuple(first) for b in builds), (os_name, version)


def test_nccl_revision_is_kept() -> None:
    assert gpu.nccl_apt_version("2.21.5-2", "12.4") == "2.21.5-2+cuda12.4"
    assert gpu.nccl_base_version("2.21.5-2") == "2.21.5"


def test_nccl_pypi_wheel_and_prefix() -> None:
    plan = gpu.resolve_nccl("debian-12", "2.21.5", cuda_version="12.4")
    assert plan.source == "pypi"
    assert plan.wheel == "nvidia-nccl-cu12==2.21.5"
    assert plan.prefix == "/opt/nccl/2.21.5-cuda12"
    assert plan.packages == ()
    assert gpu.resolve_nccl("debian-12", "2.21.5", cuda_version="11.8").wheel == "nvidia-nccl-cu11==2.21.5"
    assert gpu.resolve_nccl("ubuntu-24.04", "2.28.3", "pypi", cuda_version="13.0").wheel == "nvidia-nccl-cu13==2.28.3"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("ubuntu-22.04", "2.26.2"), {"cuda_version": "11.8"}, "NCCL 2.26.2 has no build for CUDA 11"),
        (("ubuntu-22.04", "2.21.5"), {"cuda_version": "13.0"}, "has no build for CUDA 13"),
        (("ubuntu-22.04", "2.99.1"), {"cuda_version": "12.4"}, "not in the table of NVIDIA apt builds"),
        (("ubuntu-24.04", "2.20.5"), {"cuda_version": "12.5"}, "not in the table of NVIDIA apt builds for ubuntu2404"),
        (("debian-12", "2.26.2"), {"cuda_version": "11.8"}, "NCCL 2.26.2 has no PyPI wheel for CUDA 11"),
        (("debian-12", "2.16.5"), {"cuda_version": "13.0"}, "no PyPI wheel for CUDA 13"),
        (("debian-12", "2.21.5"), {"cuda_version": "10.2"}, "no nvidia-nccl wheel for CUDA 10"),
        (("debian-12", "2.21"), {"cuda_version": "12.4"}, "not an NCCL version"),
    ],
)
def test_nccl_errors(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(GpuStackError, match=re.escape(message)):
        gpu.resolve_nccl(*args, **kwargs)


# --------------------------------------------------------------------------- docker
def test_docker_sources() -> None:
    ce = gpu.resolve_docker("ubuntu-24.04")
    assert ce.source == "docker-ce"
    assert ce.packages[0] == "docker-ce" and "containerd.io" in ce.packages
    assert (ce.repo_url, ce.repo_suite) == ("https://download.docker.com/linux/ubuntu", "noble")
    distro = gpu.resolve_docker("debian-12")
    assert distro.packages == ("docker.io",) and distro.repo_url is None
    assert gpu.resolve_docker("debian-12", "docker-ce").repo_suite == "bookworm"
    with pytest.raises(GpuStackError, match="unknown docker source"):
        gpu.resolve_docker("debian-12", "podman")


# --------------------------------------------------------------------------- drift: roles vs resolver
def _regex_replace(value: str, pattern: str = "", replacement: str = "") -> str:
    return re.sub(pattern, replacement, value)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["regex_replace"] = _regex_replace
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None
    env.filters["urlsplit"] = split_url
    return env


def _render(value: Any, context: dict[str, Any]) -> Any:
    """Render role variable templates like Ansible does (strings that are one expression
    may become lists)."""
    if isinstance(value, list):
        return [_render(v, context) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, context) for k, v in value.items()}
    if isinstance(value, str) and "{{" in value:
        compiled = _env().from_string(value.strip())
        text = compiled.render(context)
        if text.startswith("["):
            return yaml.safe_load(text)
        return text
    return value


def _role_vars(role: str, os_name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text())
    os_vars = os_vars_path(ROLES / role / "vars", PLATFORMS[os_name])  # what include_vars finds
    assert os_vars is not None, (role, os_name)
    data.update(yaml.safe_load(os_vars.read_text()))
    return data


def _os_facts(os_name: str) -> dict[str, Any]:
    """The facts a role's OS variables read, as Ansible gathers them on ``os_name``."""
    p = PLATFORMS[os_name]
    return {"ansible_facts": {"distribution_version": p.version, "distribution_major_version": p.major}}


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_the_roles_name_nvidias_repository_as_the_area_does(os_name: str) -> None:
    """nccl and gpu_metrics derive the repository's directory from the node's facts."""
    for role in ("nccl", "gpu_metrics"):
        data = _role_vars(role, os_name)
        key = "__nccl_os_repo_dist" if role == "nccl" else "__gpu_metrics_os_cuda_repo_dist"
        assert _render(data[key], _os_facts(os_name)) == gpu.CUDA_REPO_DIST[os_name], role


def _drop_empty(items: list[str]) -> tuple[str, ...]:
    return tuple(i for i in items if i)


def test_driver_tables_agree() -> None:
    main = yaml.safe_load((ROLES / "nvidia_driver" / "vars" / "main.yml").read_text())
    assert main["__nvidia_driver_open_min_branch"] == gpu.OPEN_MODULES_MIN_BRANCH
    assert main["__nvidia_driver_open_default_from"] == gpu.OPEN_MODULES_DEFAULT_FROM
    assert main["__nvidia_driver_debian_branch"] == gpu.DEBIAN_DRIVER_BRANCH


# The role keeps its own copies of the branch lists (it runs on its own too): they must say
# what versions.yaml says, and its default branch must be the manifest's.
def test_role_branch_tables_agree() -> None:
    main = yaml.safe_load((ROLES / "nvidia_driver" / "vars" / "main.yml").read_text())
    installable = {b for b in gpu.KNOWN_BRANCHES for src in gpu.DRIVER_SOURCES for os_ in gpu.OS_NAMES
                   if not gpu.branch_problems(os_, b, src, gpu.default_open_modules(b))}
    assert set(main["__nvidia_driver_known_branches"]) == installable
    server = {b: frozenset(flavours) for b, flavours in main["__nvidia_driver_server_modules"].items()}
    assert server == gpu.UBUNTU_SERVER_MODULES
    assert tuple(main["__nvidia_driver_cuda_repo_branches"]) == gpu.CUDA_REPO_BRANCHES
    defaults = yaml.safe_load((ROLES / "nvidia_driver" / "defaults" / "main.yml").read_text())
    assert defaults["nvidia_driver_branch"] == NvidiaDriver().branch
    specs = yaml.safe_load((ROLES / "nvidia_driver" / "meta" / "argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["nvidia_driver_branch"]["default"] == NvidiaDriver().branch


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_driver_packages_agree(os_name: str) -> None:
    data = _role_vars("nvidia_driver", os_name)
    assert data["__nvidia_driver_os_auto_source"] == gpu.AUTO_SOURCES[os_name]["driver"]
    assert data["__nvidia_driver_os_cuda_repo_dist"] == gpu.CUDA_REPO_DIST[os_name]
    valid = [s for s in gpu.DRIVER_SOURCES if _driver_ok(os_name, s)]
    assert sorted(data["__nvidia_driver_os_sources"]) == sorted(valid)
    checked = 0
    for source in valid:
        for branch in gpu.KNOWN_BRANCHES:
            for use_open in (False, True):
                try:
                    plan = gpu.resolve_driver(os_name, branch, source, use_open, nvswitch=source != "debian",
                                              kernel_flavour="generic-hwe-22.04")
                except GpuStackError:
                    continue
                ctx = {"nvidia_driver_branch": branch, "__nvidia_driver_o": "-open" if use_open else "",
                       "__nvidia_driver_flavour": "generic-hwe-22.04",
                       "__nvidia_driver_kernel_release": "6.8.0-50-generic",
                       "__nvidia_driver_repo_url": gpu.CUDA_REPO_URL.format(dist=gpu.CUDA_REPO_DIST[os_name])}
                table = _render(data["__nvidia_driver_os_packages"][source], ctx)
                assert _drop_empty(table["full"]) == plan.packages
                assert _drop_empty(table["kernel"]) == plan.kernel_packages
                assert table["per_kernel"] == plan.for_kernel("6.8.0-50-generic")
                assert _drop_empty(table["userspace"]) == plan.userspace_packages
                assert _drop_empty(table["fabricmanager"]) == plan.fabricmanager_packages
                if plan.fabricmanager_packages:
                    assert table["fabricmanager_pin"] == plan.fabricmanager_pin
                assert _drop_empty(table["pin"]) == plan.pin_packages
                assert _drop_empty(table["unheld"]) == plan.unheld_packages
                assert table["version_package"] in plan.userspace_packages
                checked += 1
    assert checked > 0


def _driver_ok(os_name: str, source: str) -> bool:
    """Whether ``source`` can install some branch on ``os_name``."""
    return any(not gpu.driver_problems(os_name, b, source, False) for b in gpu.KNOWN_BRANCHES)


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_cuda_packages_agree(os_name: str) -> None:
    data = _role_vars("cuda", os_name)
    assert data["__cuda_os_auto_source"] == gpu.AUTO_SOURCES[os_name]["cuda"]
    assert tuple(data["__cuda_os_repo_versions"]) == gpu.CUDA_REPO_VERSIONS[os_name]
    assert data["__cuda_os_repo_dist"] == gpu.CUDA_REPO_DIST[os_name]
    debian = [gpu.DEBIAN_CUDA_VERSION] if os_name == "debian-12" else []
    assert data["__cuda_os_debian_versions"] == debian
    for source in data["__cuda_os_sources"]:
        versions = ["11.8"] if source == "debian" else list(gpu.CUDA_REPO_VERSIONS[os_name][-3:])
        plan = gpu.resolve_cuda(os_name, versions, source=source, cudnn=source == "cuda-repo")
        ctx = {"cuda_versions": versions}
        assert tuple(_render(data["__cuda_os_packages"][source], ctx)) == plan.packages
        assert tuple(_render(data["__cuda_os_cudnn_packages"][source], ctx)) == plan.cudnn_packages
    for source in gpu.CUDA_SOURCES:
        if source not in data["__cuda_os_sources"]:
            with pytest.raises(GpuStackError):
                gpu.resolve_cuda(os_name, ["11.8"], source=source)


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
@pytest.mark.parametrize(("version", "cuda"), [("2.21.5", "12.4"), ("2.21.5-2", "12.5"), ("2.27.7", "13.0")])
def test_nccl_names_agree(os_name: str, version: str, cuda: str) -> None:
    data = _role_vars("nccl", os_name)
    assert data["__nccl_os_auto_source"] == gpu.AUTO_SOURCES[os_name]["nccl"]
    assert _render(data["__nccl_os_repo_dist"], _os_facts(os_name)) == gpu.CUDA_REPO_DIST[os_name]
    ranges = {int(k): (tuple(map(int, lo.split("."))), tuple(map(int, hi.split("."))) if hi else None)
              for k, (lo, hi) in data["__nccl_wheel_range"].items()}
    assert ranges == gpu.NCCL_WHEEL_RANGE
    ctx: dict[str, Any] = {"nccl_version": version, "nccl_cuda_version": cuda, "nccl_prefix_root": "/opt/nccl"}
    for key in ("__nccl_base_version", "__nccl_cuda_major"):
        ctx[key] = _render(data[key], ctx)
    ctx["__nccl_apt_version"] = _render(data["__nccl_apt_version"], ctx)
    apt = _render(data["__nccl_os_packages"]["apt"], ctx)
    build = gpu.pick_nccl_build(os_name, version, cuda)
    plan = gpu.resolve_nccl(os_name, version, "apt", cuda_version=build)
    # the role gets the build as nccl_cuda_version from the rolevars
    ctx_build = dict(ctx, nccl_cuda_version=build)
    ctx_build["__nccl_apt_version"] = _render(data["__nccl_apt_version"], ctx_build)
    assert tuple(_render(data["__nccl_os_packages"]["apt"], ctx_build)) == plan.packages
    assert apt[0].startswith("libnccl2=")
    pypi = gpu.resolve_nccl(os_name, version, "pypi", cuda_version=cuda)
    assert _render(data["__nccl_wheel"], ctx) == pypi.wheel
    assert _render(data["__nccl_pypi_prefix"], ctx) == pypi.prefix


@pytest.mark.parametrize("os_name", gpu.OS_NAMES)
def test_docker_tables_agree(os_name: str) -> None:
    data = _role_vars("docker", os_name)
    assert data["__docker_os_auto_source"] == gpu.AUTO_SOURCES[os_name]["docker"]
    assert tuple(data["__docker_packages"]["docker-ce"]) == gpu.DOCKER_CE_PACKAGES
    assert tuple(data["__docker_packages"]["distro"]) == gpu.DOCKER_DISTRO_PACKAGES
    assert data["__docker_os_repo_url"] == gpu.DOCKER_REPO[os_name][0]


# --------------------------------------------------------------------------- the fact module
FACTS = role_module("nvidia_driver", "nvidia_gpu_facts")


def _pci(root: Path, address: str, vendor: str, pci_class: str, device: str = "0x2230") -> None:
    dev = root / "bus" / "pci" / "devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(pci_class + "\n")
    (dev / "device").write_text(device + "\n")


def test_pci_counts_display_controllers_only(tmp_path: Path) -> None:
    _pci(tmp_path, "0000:41:00.0", "0x10de", "0x030200")  # 3D controller (data-center GPU)
    _pci(tmp_path, "0000:61:00.0", "0x10DE", "0x030000", "0x2204")  # VGA (workstation GPU)
    _pci(tmp_path, "0000:61:00.1", "0x10de", "0x040300")  # the GPU's HDMI audio function
    _pci(tmp_path, "0000:07:00.0", "0x10de", "0x068000")  # NVSwitch
    _pci(tmp_path, "0000:00:02.0", "0x8086", "0x030000")  # someone else's VGA
    gpus, switches = FACTS.pci_devices(str(tmp_path))
    assert [g["address"] for g in gpus] == ["0000:41:00.0", "0000:61:00.0"]
    assert gpus[1]["device"] == "0x2204"
    assert switches == 1


def test_pci_without_sysfs(tmp_path: Path) -> None:
    assert FACTS.pci_devices(str(tmp_path / "missing")) == ([], 0)


@pytest.mark.parametrize(
    ("expected", "found", "needle"),
    [(0, 3, None), (2, 2, None), (8, 7, "PCI shows 7"), (2, 0, "PCI shows no NVIDIA GPU")],
)
def test_count_problem(expected: int, found: int, needle: str | None) -> None:
    problem = FACTS.count_problem(expected, found)
    if needle is None:
        assert problem == ""
    else:
        assert needle in problem and f"manifest says {expected}" in problem


def test_reboot_reasons() -> None:
    assert FACTS.reboot_reasons(0, True, "", "") == []  # no GPU: nothing to run
    assert FACTS.reboot_reasons(2, False, "550.127.05", "550.127.05") == []
    assert "nouveau is loaded" in FACTS.reboot_reasons(2, True, "", "550.127.05")[0]
    assert "loaded nvidia module is 550.90.07 but 550.127.05" in FACTS.reboot_reasons(
        2, False, "550.90.07", "550.127.05")[0]
    assert "installed but does not load" in FACTS.reboot_reasons(2, False, "", "550.127.05")[0]
    assert "no nvidia module is installed" in FACTS.reboot_reasons(2, False, "", "")[0]


def test_parse_proc_version() -> None:
    text = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.127.05  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Oct  8 02:56:05 UTC 2024\nGCC version:  gcc version 12.2.0")
    assert FACTS.parse_proc_version(text) == "550.127.05"
    assert FACTS.parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May") \
        == "535.183.01"
    assert FACTS.parse_proc_version("") == ""
