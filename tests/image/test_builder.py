"""provisioner.image.builder: a chroot builder stopped at any moment leaves nothing mounted
(issue 27). The builder is a stand-in for mmdebstrap --mode=root that mounts a tmpfs in its
chroot (tests/emulators/mmdebstrap.py); mounting needs root."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.image import builder
from provisioner.interrupts import Interrupted, Signals

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators import mmdebstrap  # noqa: E402

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:40 / /tmp/b/mmdebstrap.x/proc rw shared:20 - proc proc rw
41 40 0:41 / /tmp/b/mmdebstrap.x/proc/sys/fs/binfmt_misc rw shared:21 - binfmt_misc binfmt rw
42 22 0:42 / /tmp/b/mmdebstrap.x/dev/pts rw shared:22 - devpts devpts rw
43 22 0:43 / /tmp/bb/proc rw shared:23 - proc proc rw
44 22 0:44 / /tmp/b\\040c/proc rw shared:24 - proc proc rw
45 22 0:40 / /tmp/b/mmdebstrap.x/proc rw shared:20 - proc proc rw
"""


def test_mounts_under_a_folder_deepest_first_once_each() -> None:
    assert builder.mounts_under("/tmp/b", MOUNTINFO) == [
        "/tmp/b/mmdebstrap.x/proc/sys/fs/binfmt_misc", "/tmp/b/mmdebstrap.x/dev/pts", "/tmp/b/mmdebstrap.x/proc"]
    assert builder.mounts_under("/tmp/b c/", MOUNTINFO) == ["/tmp/b c/proc"]  # mountinfo's \040 is a space
    assert builder.mounts_under("/tmp/none", MOUNTINFO) == []


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in builder mounts a tmpfs: needs root")


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The system's temporary folder for the test (where the builder's folder is made);
    whatever the stand-in left mounted there is unmounted after the test."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    mmdebstrap.unmount_all(tmp_path)


def stand_in(tmp_path: Path, setup: str, build: str, deaf: bool = False) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    return [str(mmdebstrap.write(bin_dir, setup, build, deaf=deaf)), "--mode=root", "bookworm",
            str(tmp_path / "out.tar.gz")]


@needs_root
def test_a_finished_build_leaves_its_output_and_no_folder_of_ours(tmp_path: Path, tmp: Path) -> None:
    cmd = stand_in(tmp_path, "0.01", "0.01")
    result = builder.run(cmd, timeout=30)
    assert result.returncode == 0 and (tmp_path / "out.tar.gz").is_file()
    assert list(tmp.iterdir()) == [] and mmdebstrap.mounts(tmp_path) == []


@needs_root
@pytest.mark.parametrize("moment", ["setup", "build"])
def test_a_signal_is_passed_on_and_the_builders_cleanup_runs_to_its_end(tmp_path: Path, tmp: Path,
                                                                       moment: str) -> None:
    """The signal raised while we wait becomes one SIGTERM to the builder, whose own cleanup
    (children of its own, a second long) is waited for: nothing mounted, nothing left."""
    setup = f"71.{os.getpid() % 10000:04d}1" if moment == "setup" else "0.01"
    build = f"71.{os.getpid() % 10000:04d}2"
    cmd = stand_in(tmp_path, setup, build)
    with Signals(), pytest.raises(Interrupted):
        mmdebstrap.signal_self_when(mmdebstrap.sleeping(setup if moment == "setup" else build))
        builder.run(cmd, timeout=20)
    assert mmdebstrap.mounts(tmp_path) == []
    assert list(tmp.iterdir()) == []
    assert not mmdebstrap.sleeping(setup)() and not mmdebstrap.sleeping(build)()


@needs_root
def test_a_builder_deaf_to_the_stop_is_killed_and_what_it_mounted_unmounted(tmp_path: Path, tmp: Path) -> None:
    build = f"72.{os.getpid() % 10000:04d}2"
    cmd = stand_in(tmp_path, "0.01", build, deaf=True)
    start = time.monotonic()
    with Signals(), pytest.raises(Interrupted):
        mmdebstrap.signal_self_when(mmdebstrap.sleeping(build))
        builder.run(cmd, timeout=60, stop_wait=1.0)
    assert time.monotonic() - start < 15
    assert mmdebstrap.mounts(tmp_path) == [] and list(tmp.iterdir()) == []
    assert not mmdebstrap.sleeping(build)()


@needs_root
def test_the_time_bound_stops_the_builder_and_unmounts_its_target_folder_too(tmp_path: Path, tmp: Path) -> None:
    """With ``also`` (mmdebstrap --format=directory mounts in its target), a mount there goes
    too; the bound raises TimeoutExpired after the stop."""
    build = f"73.{os.getpid() % 10000:04d}2"
    target = tmp_path / "work"
    (target / "tree" / "sys").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", mmdebstrap.SOURCE, str(target / "tree" / "sys")], check=True, timeout=30)
    cmd = stand_in(tmp_path, "0.01", build, deaf=True)
    with pytest.raises(subprocess.TimeoutExpired):
        builder.run(cmd, timeout=1.5, also=target, stop_wait=0.5)
    assert mmdebstrap.mounts(tmp_path) == [] and list(tmp.iterdir()) == []
    assert builder.remove(target) and not target.exists()


@needs_root
def test_a_folder_with_a_mount_under_it_is_not_removed(tmp_path: Path, tmp: Path) -> None:
    folder = tmp_path / "f"
    (folder / "m").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", mmdebstrap.SOURCE, str(folder / "m")], check=True, timeout=30)
    (folder / "m" / "kept").write_text("what the mount shows")
    assert builder.remove(folder) is False
    assert (folder / "m" / "kept").read_text() == "what the mount shows"
