"""`provision image prune`: the current image of each OS and the current deploy ramdisk stay,
with the --keep newest older ones; dead builds' leftovers go; nothing else is touched."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.image import build as ib
from provisioner.image import prune as prune_mod
from provisioner.image.prune import Entry, RemoveError, Stale, remove, scan, stale

Capsys = pytest.CaptureFixture[str]
NOW = 1_000_000.0
HOUR = 3600.0


def image(name: str, age_h: float, size: int = 100) -> Entry:
    return Entry(name, "file", NOW - age_h * HOUR, size)


def link(name: str, target: str) -> Entry:
    return Entry(name, "link", NOW, 0, target)


def names(found: list[Stale]) -> list[str]:
    return [n for s in found for n in s.names]


CACHE = [
    image("debian-12-aaaa.tar.gz", 50), image("debian-12-aaaa.tar.gz.sha256", 50, 1),
    image("debian-12-bbbb.tar.gz", 40), image("debian-12-bbbb.tar.gz.sha256", 40, 1),
    image("debian-12-cccc.tar.gz", 30), image("debian-12-cccc.tar.gz.sha256", 30, 1),
    image("debian-12-dddd.tar.gz", 20),  # its checksum file was lost: removed alone
    link("debian-12.tar.gz", "debian-12-aaaa.tar.gz"), image("debian-12.tar.gz.sha256", 1, 1),
    image("ubuntu-24.04-named-0123456789abcdef.tar.xz", 90), image("ubuntu-24.04-1111.tar.gz", 10),
    link("ubuntu-24.04.tar.gz", "ubuntu-24.04-1111.tar.gz"), image("ubuntu-24.04.tar.gz.sha256", 1, 1),
    Entry("deploy-ramdisk-0a0a", "dir", NOW - 70 * HOUR, 300), Entry("deploy-ramdisk-0b0b", "dir", NOW - 5 * HOUR, 300),
    Entry("deploy-ramdisk-0c0c", "dir", NOW - 9 * HOUR, 300), link("deploy-ramdisk", "deploy-ramdisk-0b0b"),
    image("notes.txt", 500), Entry("site-images", "dir", NOW - 500 * HOUR, 9),
]


def test_the_current_one_and_the_newest_older_ones_stay() -> None:
    found = stale(CACHE, keep=1, now=NOW)
    # debian-12: current aaaa is the oldest and stays; dddd is the newest other and stays
    assert names(found) == ["debian-12-bbbb.tar.gz", "debian-12-bbbb.tar.gz.sha256",
                            "debian-12-cccc.tar.gz", "debian-12-cccc.tar.gz.sha256",
                            "deploy-ramdisk-0a0a"]
    assert {s.why for s in found} == {"an older debian-12 image, not the current one",
                                      "an older deploy ramdisk, not the current one"}
    assert sum(s.size for s in found) == 100 + 1 + 100 + 1 + 300
    # the named ubuntu image is the one older ubuntu-24.04 image kept
    assert names(stale(CACHE, keep=0, now=NOW)) == [
        "debian-12-bbbb.tar.gz", "debian-12-bbbb.tar.gz.sha256", "debian-12-cccc.tar.gz",
        "debian-12-cccc.tar.gz.sha256", "debian-12-dddd.tar.gz", "deploy-ramdisk-0a0a", "deploy-ramdisk-0c0c",
        "ubuntu-24.04-named-0123456789abcdef.tar.xz"]
    assert stale(CACHE, keep=3, now=NOW) == []


def test_a_current_link_of_another_compression_keeps_its_image() -> None:
    entries = [image("ubuntu-24.04-named-0123456789abcdef.tar.xz", 90), image("ubuntu-24.04-1111.tar.gz", 10),
               image("ubuntu-24.04-2222.tar.gz", 20),
               link("ubuntu-24.04.tar.xz", "ubuntu-24.04-named-0123456789abcdef.tar.xz")]
    assert names(stale(entries, keep=1, now=NOW)) == ["ubuntu-24.04-2222.tar.gz"]


def test_an_os_without_a_current_link_keeps_its_newest() -> None:
    entries = [image("debian-12-aaaa.tar.gz", 5), image("debian-12-bbbb.tar.gz", 3), image("debian-12-cccc.tar.gz", 9)]
    assert names(stale(entries, keep=1, now=NOW)) == ["debian-12-aaaa.tar.gz", "debian-12-cccc.tar.gz"]


def test_dead_builds_leftovers_go_once_no_build_can_still_be_running() -> None:
    entries = [image(".partial-debian-12-eeee.tar.gz", 2), image(".partial-debian-12-ffff.tar.gz", 0.5),
               Entry(".ramdisk-x1y2", "dir", NOW - 3 * HOUR, 400), Entry(".ramdisk-z9", "dir", NOW - 60, 400),
               image(".debian-12.link", 9)]
    found = stale(entries, keep=1, now=NOW)
    assert names(found) == [".partial-debian-12-eeee.tar.gz", ".ramdisk-x1y2"]
    assert {s.why for s in found} == {"left by a build that did not finish"}


def test_an_images_proof_record_goes_with_it_and_a_dead_proof_tree_too() -> None:
    entries = [image("debian-12-aaaa.tar.gz", 5), image("debian-12-aaaa.tar.gz.sha256", 5, 1),
               image("debian-12-aaaa.tar.gz.proof.json", 5, 2), image("debian-12-bbbb.tar.gz", 3),
               image("debian-12-bbbb.tar.gz.proof.json", 3, 2), link("debian-12.tar.gz", "debian-12-bbbb.tar.gz"),
               Entry(".proof-k2j4", "dir", NOW - 3 * HOUR, 700), Entry(".proof-live", "dir", NOW - 60, 700)]
    found = stale(entries, keep=0, now=NOW)
    assert [s.names for s in found] == [(".proof-k2j4",), ("debian-12-aaaa.tar.gz", "debian-12-aaaa.tar.gz.sha256",
                                                           "debian-12-aaaa.tar.gz.proof.json")]
    assert [s.size for s in found] == [700, 103]


def test_keep_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="keep must be 0 or more"):
        stale(CACHE, keep=-1, now=NOW)


def _cache(tmp_path: Path) -> Path:
    cache = tmp_path / ".provision" / "images"
    cache.mkdir(parents=True)
    for i, key in enumerate(("aaaa", "bbbb", "cccc")):
        f = cache / f"debian-12-{key}.tar.gz"
        f.write_bytes(b"x" * (1 << 20))
        (cache / f"debian-12-{key}.tar.gz.sha256").write_text(f"{'0' * 64}  {f.name}\n")
        for p in (f, cache / f"{f.name}.sha256"):
            os.utime(p, (NOW + i * HOUR, NOW + i * HOUR))
    (cache / "debian-12.tar.gz").symlink_to("debian-12-aaaa.tar.gz")
    (cache / "debian-12.tar.gz.sha256").write_text(f"{'0' * 64}  debian-12.tar.gz\n")
    for key in ("0a0a", "0b0b"):
        (cache / f"deploy-ramdisk-{key}").mkdir()
        (cache / f"deploy-ramdisk-{key}" / "initrd.img").write_bytes(b"r" * 2048)
    os.utime(cache / "deploy-ramdisk-0a0a", (NOW, NOW))
    (cache / "deploy-ramdisk").symlink_to("deploy-ramdisk-0b0b")
    (cache / "README").write_text("the site's notes\n")
    return cache


def test_scan_sees_links_files_and_directory_sizes(tmp_path: Path) -> None:
    entries = {e.name: e for e in scan(_cache(tmp_path))}
    assert entries["debian-12.tar.gz"] == Entry("debian-12.tar.gz", "link", entries["debian-12.tar.gz"].mtime, 0,
                                                "debian-12-aaaa.tar.gz")
    assert (entries["deploy-ramdisk-0a0a"].kind, entries["deploy-ramdisk-0a0a"].size) == ("dir", 2048)
    assert (entries["debian-12-bbbb.tar.gz"].kind, entries["debian-12-bbbb.tar.gz"].size) == ("file", 1 << 20)
    assert scan(tmp_path / "none") == []


def test_prune_command_lists_then_removes(kit: Any, tmp_path: Path, capsys: Capsys) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(kit.dump(kit.base()))
    cache = _cache(tmp_path)
    before = sorted(p.name for p in cache.iterdir())
    assert main(["image", "prune", str(manifest), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove debian-12-bbbb.tar.gz, debian-12-bbbb.tar.gz.sha256 (1 MiB): an older debian-12 image" in out
    assert f"{cache}: would remove 1, 1 MiB" in out
    assert sorted(p.name for p in cache.iterdir()) == before  # a dry run removes nothing
    assert main(["image", "prune", str(manifest)]) == 0
    assert f"{cache}: removed 1, 1 MiB" in capsys.readouterr().out
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        set(before) - {"debian-12-bbbb.tar.gz", "debian-12-bbbb.tar.gz.sha256"})
    current = ib.current(cache, "debian-12")
    assert current is not None and current.path.name == "debian-12-aaaa.tar.gz"
    # keep 0: the older ramdisk and the last older image go; the current ones and the notes stay
    assert main(["image", "prune", str(manifest), "--keep", "0"]) == 0
    assert sorted(p.name for p in cache.iterdir()) == [
        "README", "debian-12-aaaa.tar.gz", "debian-12-aaaa.tar.gz.sha256", "debian-12.tar.gz",
        "debian-12.tar.gz.sha256", "deploy-ramdisk", "deploy-ramdisk-0b0b"]
    capsys.readouterr()
    assert main(["image", "prune", str(manifest)]) == 0
    assert f"{cache}: nothing to prune" in capsys.readouterr().out


def test_prune_in_json(kit: Any, tmp_path: Path, capsys: Capsys) -> None:
    """image prune had no --json (issue 27 item 13)."""
    manifest = tmp_path / "m.yaml"
    manifest.write_text(kit.dump(kit.base()))
    cache = _cache(tmp_path)
    assert main(["image", "prune", str(manifest), "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True, "cache": str(cache), "dry_run": True,
        "removed": [{"names": ["debian-12-bbbb.tar.gz", "debian-12-bbbb.tar.gz.sha256"],
                     "bytes": (1 << 20) + len(f"{'0' * 64}  debian-12-bbbb.tar.gz\n"),
                     "why": "an older debian-12 image, not the current one"}],
        "bytes": (1 << 20) + len(f"{'0' * 64}  debian-12-bbbb.tar.gz\n")}
    assert (cache / "debian-12-bbbb.tar.gz").exists()
    assert main(["image", "prune", str(manifest), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dry_run"] is False
    assert not (cache / "debian-12-bbbb.tar.gz").exists()
    assert main(["image", "prune", str(manifest), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == []


def test_prune_refuses_a_negative_keep(tmp_path: Path, capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["image", "prune", str(tmp_path / "m.yaml"), "--keep", "-1"])
    assert exc.value.code == 2
    assert "must be at least 0" in capsys.readouterr().err


def test_a_refused_removal_says_what_went_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file system refuses the second stale entry (tests/faults/test_disk.py refuses the first
    on a real read-only mount): remove stops there and says how many went before it."""
    cache = _cache(tmp_path)
    gone = stale(scan(cache), 0, NOW + 3 * HOUR)
    refused = cache / gone[1].names[0]
    real_unlink, real_rmtree = Path.unlink, shutil.rmtree

    def unlink(path: Path, missing_ok: bool = False) -> None:
        if path == refused:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        real_unlink(path, missing_ok=missing_ok)

    def rmtree(path: Path) -> None:
        if Path(path) == refused:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        real_rmtree(path)

    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(prune_mod.shutil, "rmtree", rmtree)
    with pytest.raises(RemoveError) as info:
        remove(cache, gone)
    assert (info.value.path, info.value.reason, info.value.removed) == (str(refused), "Read-only file system", 1)
    assert not (cache / gone[0].names[0]).exists() and refused.exists()
