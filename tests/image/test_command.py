"""`provision image build`: per OS of the manifest, a named image fetched and verified, or a build."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.commands import image as image_cmd
from provisioner.image import build as ib

Capsys = pytest.CaptureFixture[str]


def write(kit: Any, tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(kit.dump(data))
    return path


def test_a_named_image_is_fetched_verified_and_published(kit: Any, tmp_path: Path, capsys: Capsys) -> None:
    tarball = tmp_path / "site-debian.tar.gz"
    tarball.write_bytes(b"a root file system")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    data = kit.on_os(kit.base(), "debian-12")
    data["cluster"]["images"] = {"debian-12": {"url": tarball.as_uri(), "sha256": digest}}
    manifest = write(kit, tmp_path, data)
    assert main(["image", "build", str(manifest)]) == 0
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
