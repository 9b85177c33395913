"""What the roles install per OS, derived from the roles (provisioner/packages.py): the list
the image proof asks apt about, its vendor repositories and keys, and who asked for each
package. The lab manifest (Debian 12, what CI proves in the real image) selects no vendor
repository; the GPU example (Ubuntu) selects CUDA, the container toolkit and Docker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import packages
from provisioner.image.proof import AptRequest, ProofInput

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "tests" / "lab" / "lab.yaml"


def lab(kit: Any, **changes: Any) -> ProofInput:
    data = yaml.safe_load(LAB.read_text())
    data["cluster"]["ssh"]["public_key"] = kit.ssh_key
    data.update(changes)
    return packages.wanted(kit.load(data).manifest, "debian-12", "6.1.0-56-amd64")


def by_role(w: ProofInput) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in w.requests:
        out.setdefault(r.role, set()).update(r.packages)
    return out


def request_of(w: ProofInput, package: str) -> AptRequest:
    return next(r for r in w.requests if package in r.packages)


def test_every_role_of_the_playbooks_names_its_manifest_field() -> None:
    roles = {r.role for book in packages.PLAYBOOKS for r in packages.role_runs(ROOT / "playbooks" / book)}
    assert roles == set(packages.ROLE_FIELDS)
    assert {"common", "pxe_server", "nvidia_driver", "gpu_metrics"} <= roles


def test_the_lab_manifest_asks_for_its_roles_packages_from_debian_only(kit: Any) -> None:
    w = lab(kit)
    roles = by_role(w)
    assert {"chrony", "python3-apt", "htop"} <= roles["common"]
    assert {"slurmctld", "slurmd", "slurm-client", "libpmix2"} <= roles["slurm"]
    # the zfs role builds its module for the node's kernel: the image's kernel's headers
    assert {"zfs-dkms", "zfsutils-linux", "linux-headers-6.1.0-56-amd64"} <= roles["zfs"]
    assert {"nginx", "ipxe", "dnsmasq"} <= roles["pxe_server"]
    assert {"prometheus-node-exporter", "prometheus", "prometheus-alertmanager"} <= set(w.packages)
    assert w.repositories == ()  # CI's image proof needs no vendor repository (none is reachable there)
    assert "docker" not in roles and "nvidia_driver" not in roles
    slurmd = request_of(w, "slurmd")
    assert slurmd.field == "slurm (Slurm nodes)" and slurmd.nodes == ("pxe1",)
    assert slurmd.task == "roles/slurm/tasks/main.yml: Install the client commands (and slurmd on compute nodes)"
    assert request_of(w, "chrony").nodes == ("head1", "store1", "store2", "pxe1")


def test_a_package_named_in_role_vars_is_asked_for_by_role_vars(kit: Any) -> None:
    w = lab(kit, role_vars={"all": {"common_packages": ["htop", "slurmdd"]}})
    req = request_of(w, "slurmdd")
    assert req.origin("slurmdd") == "role_vars: common_packages"
    assert req.origin("chrony") == "nodes (the common role runs on every node)"
    assert "acl" not in req.packages  # the role's own defaults gave way to the manifest's list


def test_the_gpu_example_selects_nvidia_and_docker_repositories_with_their_keys(kit: Any) -> None:
    m = kit.load(kit.example("music-lab.yaml")).manifest
    w = packages.wanted(m, "ubuntu-24.04", "6.8.0-50-generic")
    roles = by_role(w)
    assert {"linux-modules-nvidia-580-server-open-generic", "nvidia-utils-580-server"} <= roles["nvidia_driver"]
    assert {"cuda-toolkit-12-8"} <= roles["cuda"]
    assert {p for p in roles["nccl"] if p.startswith("libnccl2=")} == {"libnccl2=2.26.2-1+cuda12.8"}
    assert {"docker-ce", "containerd.io"} <= roles["docker"]
    assert any(p.startswith("nvidia-container-toolkit=") for p in roles["nvidia_container_toolkit"])
    # DCGM: the role asks NVIDIA's repository on the node first; the proof counts it as asked
    assert any(p.startswith("datacenter-gpu-manager-4-proprietary=") for p in roles["gpu_metrics"])
    assert "libpmix2t64" in roles["slurm"]
    repos = {(r.role, r.uris, r.suites, r.components, r.signed_by) for r in w.repositories}
    cuda = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
    assert ("cuda", (cuda,), ("/",), (), cuda + "3bf863cc.pub") in repos
    assert ("docker", ("https://download.docker.com/linux/ubuntu",), ("noble",), ("stable",),
            "https://download.docker.com/linux/ubuntu/gpg") in repos
    assert any(r.role == "nvidia_container_toolkit" and r.signed_by.startswith("https://nvidia.github.io/")
               for r in w.repositories)
    assert request_of(w, "cuda-toolkit-12-8").field == "software.cuda (nodes with hardware.gpu)"


def test_the_manifests_choices_change_the_list(kit: Any) -> None:
    data = kit.example("music-lab.yaml")
    data["docker"]["source"] = "distro"
    data["software"]["nvidia_driver"]["source"] = "cuda-repo"
    w = packages.wanted(kit.load(data).manifest, "ubuntu-24.04", "6.8.0-50-generic")
    roles = by_role(w)
    assert roles["docker"] == {"docker.io"}
    assert not any(r.role == "docker" for r in w.repositories)
    assert "cuda-drivers-580" in roles["nvidia_driver"]
    assert any(r.role == "nvidia_driver" for r in w.repositories)


def test_an_os_no_node_runs_asks_for_nothing(kit: Any) -> None:
    m = kit.load(kit.example("music-lab.yaml")).manifest
    assert packages.wanted(m, "debian-12").requests == ()


def test_a_condition_on_a_node_result_is_decided_only_where_it_does_not_need_it(kit: Any) -> None:
    """gpu_metrics installs DCGM when the manifest asks for it and NVIDIA's repository answers
    the node (a registered probe): with dcgm the proof asks for DCGM (the probe is the node's),
    with the nvidia-smi collector the condition is false whatever the probe says."""
    data = kit.example("music-lab.yaml")
    dcgm = by_role(packages.wanted(kit.load(data).manifest, "ubuntu-24.04", "6.8.0-50-generic"))
    assert any(p.startswith("datacenter-gpu-manager-4-core=") for p in dcgm["gpu_metrics"])
    data["monitoring"]["gpu_metrics"] = "nvidia-smi"
    w = packages.wanted(kit.load(data).manifest, "ubuntu-24.04", "6.8.0-50-generic")
    assert not any(p.startswith("datacenter-gpu-manager") for p in w.packages)
    assert not any(r.role == "gpu_metrics" for r in w.repositories)


def test_what_only_the_node_knows_fails_any_use() -> None:
    with pytest.raises(packages.DeriveError):
        str(packages.UNKNOWN)
    with pytest.raises(packages.DeriveError):
        bool(packages.UNKNOWN)
    with pytest.raises(packages.DeriveError):
        _ = packages.UNKNOWN.status


def lab_manifest(kit: Any, data: dict[str, Any] | None = None) -> Any:
    data = data or yaml.safe_load(LAB.read_text())
    data["cluster"]["ssh"]["public_key"] = kit.ssh_key
    return kit.load(data).manifest


def test_the_image_carries_the_image_roles_packages_of_the_node_it_deploys(kit: Any) -> None:
    """pxe1, deployed from the debian-12 image, is a Slurm compute node mounting NFS: its image
    brings the NFS client, munge and slurmd, not the head's or the storage nodes' packages."""
    assert packages.image_extras(lab_manifest(kit), "debian-12") == (
        "libpmix2", "munge", "nfs-common", "slurm-client", "slurmd")


def test_an_image_no_node_is_deployed_from_carries_nothing_more(kit: Any) -> None:
    data = yaml.safe_load(LAB.read_text())
    pxe1 = next(n for n in data["nodes"] if n["name"] == "pxe1")
    pxe1["install_method"] = "installer"
    assert packages.image_extras(lab_manifest(kit, data), "debian-12") == ()
    del pxe1["install"], pxe1["install_method"]
    assert packages.image_extras(lab_manifest(kit, data), "debian-12") == ()
    assert packages.image_extras(lab_manifest(kit), "ubuntu-24.04") == ()


def test_the_image_carries_only_what_every_node_deployed_from_it_gets(kit: Any) -> None:
    """A second deployed node that mounts nothing: nfs-common is no longer for every node."""
    data = yaml.safe_load(LAB.read_text())
    pxe1 = next(n for n in data["nodes"] if n["name"] == "pxe1")
    pxe2 = {**pxe1, "name": "pxe2", "interfaces": {"management": {"ip": "10.213.9.21", "mac": "52:54:00:d9:00:21",
                                                                   "interface": "eth0"}},
            "bmc": {**pxe1["bmc"], "address": "127.0.0.2"}}
    data["nodes"].append(pxe2)
    data["slurm"]["partitions"][0]["nodes"] = ["pxe1", "pxe2"]
    assert packages.image_extras(lab_manifest(kit, data), "debian-12") == (
        "libpmix2", "munge", "slurm-client", "slurmd")


def test_a_role_that_adds_a_vendor_repository_gives_the_image_nothing(kit: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's sources are the OS's own: the docker role (Docker's repository on the GPU
    nodes of the example) gives nothing even when named an image role; slurm does."""
    monkeypatch.setattr(packages.registry, "image_roles", lambda: frozenset({"docker", "slurm"}))
    m = kit.load(kit.example("music-lab.yaml")).manifest
    extras = packages.image_extras(m, "ubuntu-24.04")
    assert {"slurmd", "slurm-client", "libpmix2t64"} <= set(extras)
    assert not {"docker-ce", "containerd.io", "docker.io"} & set(extras)
