"""provisioner.areas.slurm.repo: the built Slurm's repository on the head, its key and pin, and
the role variables (none with slurm.source: os)."""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

from provisioner.areas.slurm import repo
from provisioner.areas.slurm.rolevars import cluster_vars
from provisioner.manifest import Manifest


def built(m: Manifest, **settings: Any) -> Manifest:
    slurm = m.slurm.model_copy(update={"source": "build", **settings})
    return m.model_copy(update={"slurm": slurm})


def test_the_os_source_adds_no_role_variable(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    assert repo.cluster_vars(m) == {}
    assert "slurm_build" not in cluster_vars(m) and "slurm_build" in cluster_vars(built(m))


def test_role_variables_serve_one_repository_per_os_release_and_pin_it(kit: Any) -> None:
    data = kit.on_os(kit.base(), "debian-12")
    data["nodes"][0]["os"] = "ubuntu-24.04"  # 22.05 under a 23.11 controller: valid with the OS's Slurm too
    m = built(kit.load(data).manifest)
    v = repo.cluster_vars(m)["slurm_build"]
    head = m.head.ip
    assert v["sources"] == {
        "debian-12": f"deb [signed-by=/etc/apt/keyrings/provision-slurm.asc] http://{head}:8073/debian-12/ ./",
        "ubuntu-24.04": f"deb [signed-by=/etc/apt/keyrings/provision-slurm.asc] http://{head}:8073/ubuntu-24.04/ ./",
    }
    assert v["pin"].startswith(f'Package: *\nPin: origin "{head}"\nPin-Priority: 1001\n')
    assert "Pin: release o=Ubuntu\nPin-Priority: -1" in v["pin"]  # the OS's Slurm (other names) never
    assert "Package: slurm-wlm* slurm-client* slurmd slurmctld" in v["pin"]
    debian_names = ("slurmd", "slurm-client", "libslurm42t64", "libpmi2-0t64", "libpam-slurm-adopt",
                    "slurm-wlm-basic-plugins")
    assert all(any(fnmatch(p, pat) for pat in repo.OS_SLURM_PACKAGES) for p in debian_names)
    kept = ("libpmix2", "libpmix-dev", "munge", "libmunge2")  # the OS's, needed by the built Slurm
    assert not any(fnmatch(p, pat) for p in kept for pat in repo.OS_SLURM_PACKAGES)
    assert v["packages"]["compute"] == ["slurm-smd-slurmd"] and v["cgroup_plugin"] == "autodetect"


def test_the_repository_is_indexed_and_signed_on_the_control_machine() -> None:
    text = repo.release_text("debian-12", {"Packages": b"abc", "Packages.gz": b"x"}, "Fri, 27 Nov 2026 09:00:00 UTC")
    assert text == (
        "Origin: provision\nLabel: slurm-debian-12\nDate: Fri, 27 Nov 2026 09:00:00 UTC\nSHA256:\n"
        " ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad 3 Packages\n"
        " 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 1 Packages.gz\n")
    assert repo.sign_command("/st/secrets/slurm-repo-gnupg") == [
        "gpg", "--batch", "--yes", "--homedir", "/st/secrets/slurm-repo-gnupg", "--clearsign", "--output",
        "InRelease", "Release"]
    make = repo.key_commands("/st/secrets/slurm-repo-gnupg", "testc")
    assert make[0][-4:] == ["provision Slurm repository (testc)", "ed25519", "sign", "never"]
    assert make[1][-3:] == ["--output", "/st/secrets/slurm-repo-gnupg/public.asc", "--export"]
