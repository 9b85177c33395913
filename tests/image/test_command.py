"""`provision image build`: per OS of the manifest, a named image fetched and verified, or a build."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import image as image_cmd
from provisioner.image import build as ib
from provisioner.image import proof

Capsys = pytest.CaptureFixture[str]


def write(kit: Any, tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(kit.dump(data))
    return path


def named_image(kit: Any, tmp_path: Path) -> tuple[Path, dict[str, Any], str]:
    """A Debian 12 manifest naming a local root file system tarball as its image: the
    manifest's path, its data and the tarball's SHA-256."""
    tarball = tmp_path / "site-debian.tar.gz"
    tarball.write_bytes(b"a root file system")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    data = kit.on_os(kit.base(), "debian-12")
    data["cluster"]["images"] = {"debian-12": {"url": tarball.as_uri(), "sha256": digest}}
    return write(kit, tmp_path, data), data, digest


def test_a_named_image_is_fetched_verified_and_published(kit: Any, tmp_path: Path, capsys: Capsys) -> None:
    manifest, data, digest = named_image(kit, tmp_path)
    assert main(["image", "build", str(manifest), "--skip-proof"]) == 0
    out = capsys.readouterr().out
    assert f"debian-12: fetched in 0 s: {tmp_path}/.provision/images/debian-12-named-{digest[:16]}.tar.gz" in out
    assert ib.current(tmp_path / ".provision" / "images", "debian-12") is not None
    # a wrong checksum: refused with both sums, nothing published
    data["cluster"]["images"]["debian-12"]["sha256"] = "f" * 64
    write(kit, tmp_path, data)
    assert main(["image", "build", str(manifest), "--cache-dir", str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err
    assert f"SHA-256 mismatch: expected {'f' * 64}, got {digest}" in err
    assert ib.current(tmp_path / "other", "debian-12") is None


def test_a_named_image_in_json(kit: Any, tmp_path: Path, capsys: Capsys) -> None:
    """image build had no --json (issue 27 item 13): the progress on stderr, one object on
    stdout, null for what did not happen (a skipped proof, no ramdisk, no time when cached)."""
    manifest, _, digest = named_image(kit, tmp_path)
    for source in ("fetched", "cached"):
        assert main(["image", "build", str(manifest), "--skip-proof", "--json"]) == 0
        captured = capsys.readouterr()
        doc = json.loads(captured.out)
        assert "proof skipped" in captured.err
        image = doc["images"][0]
        assert (doc["ok"], doc["ramdisk"], image["os"], image["source"], image["sha256"], image["proof"]) == (
            True, None, "debian-12", source, digest, None)
        assert image["path"] == f"{tmp_path}/.provision/images/debian-12-named-{digest[:16]}.tar.gz"
        assert (image["seconds"] is None) == (source == "cached")


def test_an_os_no_node_runs_is_refused(kit: Any, tmp_path: Path, capsys: Capsys) -> None:
    manifest = write(kit, tmp_path, kit.base())
    assert main(["image", "build", str(manifest), "--os", "debian-12"]) == 1
    assert "--os debian-12: no node of the manifest runs it (they run ubuntu-24.04)" in capsys.readouterr().err


def test_build_uses_the_manifest_mirror_and_proxy(kit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = kit.on_os(kit.base(), "debian-12")
    data["cluster"]["mirrors"] = {"apt": "http://127.0.0.1:9/debian", "apt_proxy": "http://127.0.0.1:9"}
    seen: list[Any] = []

    def fake_build(r: Any, cache: Path) -> ib.Image:
        seen.append((r, cache))
        return ib.Image(r.os, cache, "0", "cached")

    monkeypatch.setattr(image_cmd, "build", fake_build)
    monkeypatch.setattr(image_cmd, "prove", lambda m, os_name, image: (proof.Record(os_name, "0", "k", (), ()), False))
    manifest = write(kit, tmp_path, data)
    assert main(["image", "build", str(manifest)]) == 0
    (r, cache), = seen
    assert (r.os, r.mirror, r.proxy, cache) == ("debian-12", "http://127.0.0.1:9/debian", "http://127.0.0.1:9",
                                                tmp_path / ".provision" / "images")
    assert "prometheus-node-exporter" not in r.packages  # no monitoring: section, no agent
    # a monitored cluster's image carries the agent every node gets
    data["monitoring"] = {}
    write(kit, tmp_path, data)
    assert main(["image", "build", str(manifest)]) == 0
    assert {"prometheus-node-exporter", "prometheus-node-exporter-collectors"} <= set(seen[-1][0].packages)


def named_manifest(kit: Any, tmp_path: Path) -> tuple[Path, str]:
    tarball = tmp_path / "site-debian.tar.gz"
    tarball.write_bytes(b"a root file system")
    data = kit.on_os(kit.base(), "debian-12")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    data["cluster"]["images"] = {"debian-12": {"url": tarball.as_uri(), "sha256": digest}}
    return write(kit, tmp_path, data), digest


def test_the_image_is_proven_once_then_its_record_counts(kit: Any, tmp_path: Path, capsys: Capsys,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    manifest, digest = named_manifest(kit, tmp_path)
    proven: list[Any] = []

    def fake_prove(image: Path, sha256: str, os_name: str, os_sources: Any, proxy: Any, derive: Any) -> proof.Record:
        wanted = derive("6.1.0-56-amd64")
        proven.append((image, sha256, os_name, tuple(os_sources)))
        record = proof.Record(os_name, sha256, wanted.kernel, proof.sources(os_sources, wanted.repositories),
                              wanted.packages, 3.0)
        proof.record_path(image).write_text(proof.record_text(record))
        return record

    monkeypatch.setattr(image_cmd.proof, "prove", fake_prove)
    monkeypatch.setattr(image_cmd.os, "geteuid", lambda: 0)
    assert main(["image", "build", str(manifest)]) == 0
    out = capsys.readouterr().out
    (image, sha256, os_name, sources), = proven
    assert (sha256, os_name) == (digest, "debian-12") and sources[0].startswith("deb http://deb.debian.org/debian ")
    assert "debian-12: proven in 3 s: " in out and f"{image.name}.proof.json" in out
    assert main(["image", "build", str(manifest)]) == 0
    assert "debian-12: proof cached: " in capsys.readouterr().out and len(proven) == 1
    # another package for the nodes: the record no longer covers it, the proof runs again
    data = kit.on_os(kit.base(), "debian-12")
    data["cluster"]["images"] = {"debian-12": {"url": (tmp_path / "site-debian.tar.gz").as_uri(), "sha256": digest}}
    data["role_vars"] = {"all": {"common_packages": ["htop", "iotop"]}}
    write(kit, tmp_path, data)
    assert main(["image", "build", str(manifest)]) == 0
    assert len(proven) == 2


def test_a_failed_proof_fails_the_build_and_needs_root(kit: Any, tmp_path: Path, capsys: Capsys,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    manifest, _ = named_manifest(kit, tmp_path)

    def failing(*args: Any, **kw: Any) -> proof.Record:
        raise proof.ProofError("debian-12: 1 package(s) the roles install do not resolve in the image:\n  slurmdd: ...")

    monkeypatch.setattr(image_cmd.proof, "prove", failing)
    monkeypatch.setattr(image_cmd.os, "geteuid", lambda: 0)
    assert main(["image", "build", str(manifest)]) == 1
    assert "slurmdd: ..." in capsys.readouterr().err
    monkeypatch.setattr(image_cmd.os, "geteuid", lambda: 1000)
    assert main(["image", "build", str(manifest)]) == 1
    assert "proving the image needs root (a chroot into it): run with sudo, or give --skip-proof" in \
        capsys.readouterr().err
    assert main(["image", "build", str(manifest), "--skip-proof"]) == 0
    assert "debian-12: proof skipped (--skip-proof): apply will not deploy this image" in capsys.readouterr().out
