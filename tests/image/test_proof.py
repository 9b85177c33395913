"""The image proof (provisioner/image/proof.py): apt's recorded output turned into the
build's failure message (a misspelt package, a missing component, a version, unmet
dependencies), the sources it looks in, the record apply checks, and the edge with its
commands faked (tar, chroot apt-get)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.image import proof
from provisioner.image.proof import AptRequest, ProofError, ProofInput, Repository, Unresolved
from provisioner.image.recipe import OS_IMAGES

APT = Path(__file__).with_name("apt")
DEBIAN = OS_IMAGES["debian-12"].sources("http://deb.debian.org/debian")
CUDA = Repository("cuda", ("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/",), ("/",),
                  (), "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub",
                  "cuda")
DOCKER = Repository("docker", ("https://download.docker.com/linux/ubuntu",), ("noble",), ("stable",),
                    "https://download.docker.com/linux/ubuntu/gpg", "docker")


def request(*packages: str, role: str = "slurm", field: str = "slurm (Slurm nodes)",
            named_by: tuple[tuple[str, str], ...] = ()) -> AptRequest:
    return AptRequest(packages, role, f"roles/{role}/tasks/main.yml: Install", field, ("pxe1", "gpu01"), named_by)


def recorded(name: str) -> str:
    return (APT / name).read_text()


def test_a_misspelt_package_is_named_with_the_os_the_sources_and_the_field() -> None:
    req = request("htop", "slurmdd", "nvidia-smi", role="common", field="nodes (the common role runs on every node)",
                  named_by=(("slurmdd", "role_vars: common_packages"),))
    found = proof.attribute(proof.parse_apt(recorded("misspelt.txt")), req)
    assert found == [(Unresolved("slurmdd", "no package of that name in these sources"), req)]
    message = proof.failure_message("debian-12", found, DEBIAN)
    assert message.splitlines()[0] == "debian-12: 1 package(s) the roles install do not resolve in the image:"
    assert ("  slurmdd: no package of that name in these sources; asked for by role_vars: common_packages "
            "(role common, roles/common/tasks/main.yml: Install; nodes pxe1, gpu01)") in message
    assert "debian-12: sources looked in:" in message
    for line in DEBIAN:
        assert f"  {line}" in message.splitlines()


def test_a_missing_component_says_the_package_has_no_candidate_here() -> None:
    req = request("nvidia-driver", "firmware-misc-nonfree", "slurmd", "slurmdd", role="nvidia_driver",
                  field="software.nvidia_driver (nodes with hardware.gpu)")
    found = proof.attribute(proof.parse_apt(recorded("main-only.txt")), req)
    names = {u.package: u.reason for u, _ in found}
    assert set(names) == {"nvidia-driver", "firmware-misc-nonfree", "slurmdd"}  # slurmd is in main
    assert "missing pocket or component" in names["nvidia-driver"]
    assert "missing pocket or component" in names["firmware-misc-nonfree"]
    message = proof.failure_message("debian-12", found, ("deb http://deb.debian.org/debian bookworm main",))
    assert "nvidia-driver: known, but no version of it is in these sources" in message
    assert "asked for by software.nvidia_driver (nodes with hardware.gpu)" in message
    assert message.endswith("  deb http://deb.debian.org/debian bookworm main")


def test_dependencies_in_a_missing_component_fail_the_package_that_needs_them() -> None:
    found = proof.parse_apt(recorded("no-contrib.txt"))
    assert [u.package for u in found] == ["nvidia-driver"]
    assert found[0].reason.startswith("depends on nvidia-installer-cleanup, which these sources cannot install")


def test_a_version_not_there_is_named_with_its_version() -> None:
    found = proof.parse_apt(recorded("version.txt"))
    assert found == (Unresolved("bash=0.1", "version 0.1 is not in these sources"),)
    req = request("bash=0.1")
    assert proof.attribute(found, req) == [(found[0], req)]


def test_apt_output_without_errors_has_nothing_unresolved() -> None:
    assert proof.parse_apt("Reading package lists...\nInst slurmd (22.05.8-4 Debian:12.12/stable [amd64])\n") == ()


def test_vendor_repositories_join_the_os_sources_once_with_their_keys() -> None:
    nccl_cuda = Repository(CUDA.name, CUDA.uris, CUDA.suites, CUDA.components, CUDA.signed_by, "nccl")
    looked = proof.sources(("deb http://archive.ubuntu.com/ubuntu noble main",), [CUDA, nccl_cuda, DOCKER])
    key_cuda, key_docker = proof.key_path(CUDA), proof.key_path(DOCKER)
    assert looked == (
        "deb http://archive.ubuntu.com/ubuntu noble main",
        f"deb [signed-by={key_cuda}] https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /",
        f"deb [signed-by={key_docker}] https://download.docker.com/linux/ubuntu noble stable",
    )
    assert key_cuda.startswith(proof.WORK + "/keys/cuda-") and key_cuda != key_docker


def test_the_record_covers_only_its_image_sources_and_packages() -> None:
    record = proof.Record("debian-12", "a" * 64, "6.1.0-56-amd64", DEBIAN, ("munge", "slurmd"))
    again = proof.parse_record(proof.record_text(record))
    assert again == record
    assert proof.covers(again, "a" * 64, DEBIAN, ["slurmd"]) is None
    assert "no proof" in str(proof.covers(None, "a" * 64, DEBIAN, ["slurmd"]))
    assert "another image" in str(proof.covers(record, "b" * 64, DEBIAN, ["slurmd"]))
    assert "other sources" in str(proof.covers(record, "a" * 64, (*DEBIAN, "deb http://x/ y main"), ["slurmd"]))
    assert "does not cover zfs-dkms" in str(proof.covers(record, "a" * 64, DEBIAN, ["slurmd", "zfs-dkms"]))
    assert proof.parse_record("{}") is None and proof.parse_record("not json") is None


def test_the_kernel_is_the_newest_in_boot() -> None:
    names = ["./boot/vmlinuz-6.1.0-50-amd64", "./boot/vmlinuz-6.1.0-56-amd64", "./boot/config-6.1.0-56-amd64"]
    assert proof.kernel_release(names) == "6.1.0-56-amd64"
    assert proof.kernel_release(["./etc/hostname"]) is None


def test_keys_are_placed_from_urls_text_or_the_image(tmp_path: Path) -> None:
    fetched: list[tuple[str, str | None]] = []

    def fetch(url: str, proxy: str | None) -> bytes:
        fetched.append((url, proxy))
        return b"KEY"

    armored = Repository("doca", ("https://x/",), ("./",), (), "-----BEGIN PGP PUBLIC KEY BLOCK-----\nabc", "ofed")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "k.gpg").write_bytes(b"LOCAL")
    local = Repository("local", ("http://x/",), ("/",), (), "/etc/k.gpg", "docker")
    proof.place_keys(tmp_path, [CUDA, armored, local], "http://proxy:3142", fetch)
    assert fetched == [(CUDA.signed_by, "http://proxy:3142")]
    assert (tmp_path / proof.key_path(CUDA).lstrip("/")).read_bytes() == b"KEY"
    assert (tmp_path / proof.key_path(armored).lstrip("/")).read_text().startswith("-----BEGIN")
    assert (tmp_path / proof.key_path(local).lstrip("/")).read_bytes() == b"LOCAL"

    def unreachable(url: str, proxy: str | None) -> bytes:
        raise OSError("Network is unreachable")

    with pytest.raises(ProofError, match=r"cannot fetch the key of the docker repository \(role docker\) from "
                                         r"https://download.docker.com/linux/ubuntu/gpg: Network is unreachable"):
        proof.place_keys(tmp_path, [DOCKER], None, unreachable)
    with pytest.raises(ProofError, match="names no key"):
        proof.place_keys(tmp_path, [Repository("x", ("http://x/",), ("/",), (), "/nowhere.gpg", "cuda")], None,
                         fetch)


class FakeImage:
    """tar unpacks a kernel; chroot apt-get answers from recorded output per package."""

    def __init__(self, outputs: dict[str, tuple[int, str]], update: tuple[int, str] = (0, "")) -> None:
        self.outputs = outputs
        self.update = update
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        if cmd[0] == "tar":
            root = Path(cmd[cmd.index("-C") + 1])
            (root / "boot").mkdir()
            (root / "boot" / "vmlinuz-6.1.0-56-amd64").write_text("")
            (root / "etc").mkdir()
            return subprocess.CompletedProcess(cmd, 0, "", "")
        assert cmd[0] == "chroot" and cmd[2] == "apt-get"
        assert kw["env"]["LC_ALL"] == "C" and kw["timeout"] > 0
        if "update" in cmd:
            return subprocess.CompletedProcess(cmd, self.update[0], self.update[1], "")
        rc, out = self.outputs.get(cmd[-1], (0, ""))
        return subprocess.CompletedProcess(cmd, rc, out, "")


def derive(requests: tuple[AptRequest, ...]) -> Any:
    def inner(kernel: str) -> ProofInput:
        assert kernel == "6.1.0-56-amd64"
        return ProofInput("debian-12", kernel, requests, ())
    return inner


def test_prove_writes_a_record_of_every_package_and_source(tmp_path: Path) -> None:
    image = tmp_path / "debian-12-k.tar.gz"
    image.write_bytes(b"x")
    fake = FakeImage({})
    reqs = (request("munge"), request("slurmd", "slurm-client"))
    record = proof.prove(image, "d" * 64, "debian-12", DEBIAN, "http://10.0.0.1:3142", derive(reqs), run=fake)
    assert record.packages == ("munge", "slurm-client", "slurmd") and record.sources == DEBIAN
    assert proof.read_record(image) == record
    update = fake.calls[1]
    assert update[-2:] == ["update", "--error-on=any"] and "-oAcquire::http::Proxy=http://10.0.0.1:3142" in update
    assert [c[-1] for c in fake.calls[2:]] == ["munge", "slurm-client"]
    assert all("--simulate" in c for c in fake.calls[2:])
    assert sorted(p.name for p in tmp_path.iterdir()) == [image.name, image.name + ".proof.json"]


def test_prove_fails_naming_every_unresolved_package_and_writes_no_record(tmp_path: Path) -> None:
    image = tmp_path / "debian-12-k.tar.gz"
    image.write_bytes(b"x")
    fake = FakeImage({"slurmdd": (100, recorded("misspelt.txt")), "nvidia-driver": (100, recorded("no-contrib.txt"))})
    reqs = (request("htop", "slurmdd"), request("nvidia-driver", role="nvidia_driver", field="software.nvidia_driver"))
    with pytest.raises(ProofError) as failed:
        proof.prove(image, "d" * 64, "debian-12", DEBIAN, None, derive(reqs), run=fake)
    text = str(failed.value)
    assert "debian-12: 2 package(s)" in text and "slurmdd: no package of that name" in text
    assert "nvidia-driver: depends on nvidia-installer-cleanup" in text
    assert "asked for by software.nvidia_driver" in text
    assert proof.read_record(image) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == [image.name]  # the scratch tree is gone


def test_a_failed_update_names_apt_errors_and_the_sources(tmp_path: Path) -> None:
    image = tmp_path / "debian-12-k.tar.gz"
    image.write_bytes(b"x")
    fake = FakeImage({}, update=(100, "Err:1 http://deb.debian.org/debian bookworm InRelease\n"
                                      "E: The repository 'http://deb.debian.org/debian bookworm InRelease' is not "
                                      "signed.\n"))
    with pytest.raises(ProofError, match=r"(?s)apt-get update failed in the image \(exit 100\).*is not signed.*"
                                         r"sources looked in:\n  deb http://deb.debian.org/debian bookworm "):
        proof.prove(image, "d" * 64, "debian-12", DEBIAN, None, derive((request("munge"),)), run=fake)
