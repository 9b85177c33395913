"""provisioner.commands.slurm: `provision slurm build`: fetch and check the pinned sources, build
in a chroot of each OS release (a stand-in for mmdebstrap here), check what came out, cache it."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from provisioner.areas import registry
from provisioner.areas.slurm.build import PROOF_FILES, Job, jobs
from provisioner.commands import slurm as cmd
from provisioner.errors import ProvisionError
from provisioner.interrupts import Interrupted
from provisioner.proctree import processes_end_with_a_signal

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators import mmdebstrap  # noqa: E402

PLUGIN_DIR = "./usr/lib/x86_64-linux-gnu/slurm/"


class FakeBuild:
    """mmdebstrap's stand-in: leaves one .deb per wanted package in the sync-out folder;
    dpkg-deb -c lists the option files (all, or without ``lacking``)."""

    def __init__(self, packages: tuple[str, ...], lacking: str = "", rc: int = 0, hang: bool = False) -> None:
        self.packages, self.lacking, self.rc, self.hang = packages, lacking, rc, hang
        self.builds: list[list[str]] = []

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if argv[0] == "dpkg-deb":
            files = [PLUGIN_DIR + f + ".so" for option, f in PROOF_FILES.items() if option != self.lacking]
            listing = "\n".join(f"-rw-r--r-- root/root 1 2026 {f}" for f in files)
            return subprocess.CompletedProcess(argv, 0, listing, "")
        assert argv[0] == "mmdebstrap" and kw["timeout"] > 0
        self.builds.append(argv)
        if self.hang:
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        outdir = Path(next(a for a in argv if a.startswith("--customize-hook=sync-out ")).split()[-1])
        for name in self.packages:
            (outdir / f"{name}_1.0-1_amd64.deb").write_bytes(name.encode())
        return subprocess.CompletedProcess(argv, self.rc, "", "")


def job_for(tmp_path: Path, kit: Any, version: str = "25.05.1", tamper: bool = False) -> Job:
    data = kit.on_os(kit.base(), "debian-12")
    data["slurm"].update(source="build", version=version, mirror=f"file://{tmp_path / 'mirror'}")
    (job,) = jobs(kit.load(data).manifest)
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / job.source.file).write_bytes(b"a stand-in tarball")
    digest = hashlib.sha256(b"a stand-in tarball" + (b"x" if tamper else b"")).hexdigest()
    src = replace(job.source, sha256=digest)  # the stand-in's own pin (or a wrong one)
    return replace(job, source=src)


def build(job: Job, cache: Path, fake: FakeBuild) -> cmd.Built:
    b = registry.package_build()
    return cmd.build_one(job, cache, proxy="http://127.0.0.1:3142", mirror=None, jobs=2, timeout=b.timeout_s,
                         missing=b.missing, run=fake, chroot_run=fake)


def test_builds_checks_and_caches(tmp_path: Path, kit: Any) -> None:
    job = job_for(tmp_path, kit)
    fake = FakeBuild(job.debs)
    built = build(job, tmp_path / "cache", fake)
    assert built.source == "built" and built.path == tmp_path / "cache" / job.name
    assert {cmd.package_name(d) for d in built.debs} == set(job.debs)
    sums = (built.path / "SHA256SUMS").read_text()
    assert sums.count("\n") == len(job.debs) and "slurm-smd-slurmd_1.0-1_amd64.deb" in sums
    argv = fake.builds[0]
    assert "--aptopt=Acquire::http::Proxy \"http://127.0.0.1:3142\"" in argv
    at = argv.index("bookworm")
    assert argv[at + 1:at + 3] == [
        "/dev/null", "deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware"]
    assert any("dpkg-buildpackage -b -uc -us -j2" in a for a in argv)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [job.name]  # no partial left
    again = build(job, tmp_path / "cache", fake)
    assert again.source == "cached" and len(fake.builds) == 1


@pytest.mark.parametrize(("fake_args", "tamper", "message"), [
    ({}, True, "pinned"),  # the source does not match its pin: nothing runs
    ({"lacking": "nvml"}, False, "lack build options nvml"),
    ({"rc": 2}, False, r"failed \(mmdebstrap exit 2\)"),
    ({"hang": True}, False, "took longer than"),
])
def test_a_failed_build_leaves_nothing(tmp_path: Path, kit: Any, fake_args: dict[str, Any], tamper: bool,
                                       message: str) -> None:
    job = job_for(tmp_path, kit, tamper=tamper)
    fake = FakeBuild(job.debs, **fake_args)
    with pytest.raises(ProvisionError, match=message):
        build(job, tmp_path / "cache", fake)
    assert list((tmp_path / "cache").iterdir()) == []
    assert len(fake.builds) == (0 if tamper else 1)


def test_a_build_without_a_wanted_package_fails(tmp_path: Path, kit: Any) -> None:
    job = job_for(tmp_path, kit, version="24.11.5")
    assert job.url == f"file://{tmp_path}/mirror/slurm-24-11-5-1.tar.gz"
    with pytest.raises(ProvisionError, match="the build left no slurm-smd-slurmd"):
        build(job, tmp_path / "cache", FakeBuild(tuple(p for p in job.debs if p != "slurm-smd-slurmd")))


def test_the_command_refuses_what_it_cannot_build(tmp_path: Path, kit: Any, write_manifest: Any) -> None:
    console = Console(file=None, stderr=True)
    args = argparse.Namespace(manifest=write_manifest(kit.base()), os=None, cache_dir=tmp_path, jobs=2, json=False)
    with pytest.raises(ProvisionError, match=r"nothing to build: the manifest has slurm\.source: os"):
        cmd.build_all(args, console, console, euid=lambda: 0, which=lambda _: "/x")
    data = kit.base()
    data["slurm"]["source"] = "build"
    args.manifest = write_manifest(data)
    with pytest.raises(ProvisionError, match="--os debian-12: none of the manifest's Slurm nodes runs it"):
        cmd.build_all(argparse.Namespace(**{**vars(args), "os": "debian-12"}), console, console, euid=lambda: 0,
                      which=lambda _: "/x")
    with pytest.raises(ProvisionError, match="needs root"):
        cmd.build_all(args, console, console, euid=lambda: 1000, which=lambda _: "/x")
    with pytest.raises(ProvisionError, match="mmdebstrap is not installed"):
        cmd.build_all(args, console, console, euid=lambda: 0, which=lambda _: None)


def tiny_deb(folder: Path, name: str) -> str:
    """A real (empty) .deb named like a built one."""
    tree = folder / f"tree-{name}"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 24.11.5-1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: test\n")
    deb = f"{name}_24.11.5-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(folder / deb)], check=True,
                   capture_output=True, timeout=60)
    return deb


@pytest.mark.skipif(not all(map(shutil.which, ("gpg", "gpgv", "dpkg-deb", "apt-get"))), reason="gpg, apt tools")
def test_the_packages_are_published_signed_and_apt_takes_them(tmp_path: Path) -> None:
    built_dir = tmp_path / "debian-12-24.11.5-k"
    built_dir.mkdir()
    debs = tuple(tiny_deb(built_dir, name) for name in ("slurm-smd", "slurm-smd-slurmd"))
    built = cmd.Built("debian-12", "24.11.5", built_dir, debs, "built")
    repo = registry.package_build().repo
    home = cmd.signing_key(repo, tmp_path / "secrets", "testc")
    assert (tmp_path / "secrets").stat().st_mode & 0o077 == 0 and home.stat().st_mode & 0o077 == 0
    assert cmd.signing_key(repo, tmp_path / "secrets", "testc") == home  # made once
    target = cmd.publish(built, tmp_path / "repo", repo, home)
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [*debs, "InRelease", "Packages", "Packages.gz", "Release"])
    keyring = tmp_path / "key.gpg"
    public = tmp_path / "repo" / "public.asc"
    (tmp_path / "g").mkdir(mode=0o700)
    subprocess.run(["gpg", "--homedir", str(tmp_path / "g"), "--batch", "--yes", "--dearmor", "--output", str(keyring),
                    str(public)], check=True, timeout=30)
    subprocess.run(["gpgv", "--keyring", str(keyring), str(target / "InRelease")], check=True, timeout=30,
                   capture_output=True)
    # apt itself: the signed flat repository, pinned as the nodes pin it, offers its version
    state = tmp_path / "apt"
    (state / "lists" / "partial").mkdir(parents=True)
    (state / "sources.list").write_text(f"deb [signed-by={keyring}] file://{target} ./\n")
    (state / "preferences").write_text("Package: *\nPin: release o=provision\nPin-Priority: 1001\n")
    opts = [f"-o=Dir::Etc::SourceList={state / 'sources.list'}", "-o=Dir::Etc::SourceParts=/nonexistent",
            f"-o=Dir::State::Lists={state / 'lists'}", f"-o=Dir::Etc::Preferences={state / 'preferences'}",
            "-o=Dir::Etc::PreferencesParts=/nonexistent", f"-o=Dir::Cache={state}", "-o=APT::Sandbox::User=root"]
    update = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True, timeout=60)
    assert update.returncode == 0 and "W:" not in update.stdout + update.stderr, update.stdout + update.stderr
    policy = subprocess.run(["apt-cache", *opts, "policy", "slurm-smd-slurmd"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    assert "Candidate: 24.11.5-1" in policy and "1001 file:" in policy


@pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in builder mounts a tmpfs: needs root")
def test_a_signal_during_the_chroot_build_leaves_nothing_mounted(tmp_path: Path, kit: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The build runs mmdebstrap through provisioner.image.builder under the command's own
    stop (every new process ended on a signal): a SIGTERM while the chroot is mounted ends in
    Interrupted after mmdebstrap's own cleanup, with nothing mounted and nothing left of the
    build. Before, the command's stop ended that cleanup and the chroot's mount stayed."""
    job = job_for(tmp_path, kit)
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    build_wait = f"74.{os.getpid() % 10000:04d}2"
    mmdebstrap.write(bin_dir, "0.01", build_wait)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    b = registry.package_build()
    try:
        with processes_end_with_a_signal(1.0), pytest.raises(Interrupted):
            mmdebstrap.signal_self_when(mmdebstrap.sleeping(build_wait))
            cmd.build_one(job, tmp_path / "cache", proxy=None, mirror=None, jobs=2, timeout=30, missing=b.missing,
                          run=FakeBuild(job.debs))
        mounted = mmdebstrap.mounts(tmp_path)
    finally:
        mmdebstrap.unmount_all(tmp_path)
    assert mounted == [] and list(tmp.iterdir()) == []
    assert list((tmp_path / "cache").iterdir()) == []
    assert not mmdebstrap.sleeping(build_wait)()
