"""The Ubuntu installer media: stable source with a checksum, or pinned in the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from ansible.plugins.test.core import TestModule as CoreTests

from provisioner.areas.baremetal import decide as ic
from provisioner.areas.baremetal import media as im
from provisioner.areas.baremetal import rolevars
from provisioner.validate import load_manifest

ROOT = Path(__file__).resolve().parents[3]
DIGEST = "9bc6028870aef3f74f4e16b900008179e78b130e6b0b9a140635434a46aa98b0"


def test_default_media_is_verified_against_the_stable_checksum_list() -> None:
    """A point-release URL alone 404s once the release moves on: the default names the
    release's stable directory, and the ISO is checked against that directory's SHA256SUMS,
    which fails at once (naming the list) when the ISO name is no longer the current one."""
    m = load_manifest(ROOT / "examples" / "music-lab.yaml").manifest
    media = rolevars.cluster_vars(m)["pxe_server_ubuntu_media"]
    assert set(media) == {"ubuntu-22.04", "ubuntu-24.04"}
    for release, entry in media.items():
        directory = f"https://releases.ubuntu.com/{release.removeprefix('ubuntu-')}/"
        assert entry["directory"] == directory
        assert entry["sha256sums"] == directory + "SHA256SUMS"
        assert entry["url"].startswith(directory) and entry["url"].endswith("-live-server-amd64.iso")
        assert entry["checksum"] == f"sha256:{directory}SHA256SUMS"
        assert entry["path"] == ""


def test_media_pinned_in_the_manifest(kit: Any) -> None:
    data = kit.example("music-lab.yaml")
    data["cluster"]["install_media"] = {
        "ubuntu-24.04": {"url": "http://mirror.lab.example.org/iso/noble.iso", "sha256": "SHA256:" + DIGEST.upper()},
        "ubuntu-22.04": {"path": "/srv/iso/jammy.iso"},
    }
    media = im.ubuntu_media(kit.load(data).manifest)
    assert media["ubuntu-24.04"]["url"] == "http://mirror.lab.example.org/iso/noble.iso"
    assert media["ubuntu-24.04"]["checksum"] == f"sha256:{DIGEST}"
    assert media["ubuntu-22.04"]["path"] == "/srv/iso/jammy.iso" and media["ubuntu-22.04"]["checksum"] == ""


@pytest.mark.parametrize(("media", "message"), [
    ({"url": "http://mirror/noble.iso"}, "needs its sha256"),
    ({"url": "http://mirror/noble.iso", "sha256": "abc"}, "is not a SHA-256"),
    ({"path": "/a.iso", "url": "http://mirror/noble.iso", "sha256": DIGEST}, "exactly one of url or path"),
])
def test_pinned_media_needs_a_checksum(kit: Any, media: dict[str, str], message: str) -> None:
    data = kit.example("music-lab.yaml")
    data["cluster"]["install_media"] = {"ubuntu-24.04": media}
    d = kit.error(data, message)
    assert d.path.startswith("cluster.install_media['ubuntu-24.04']")


def test_current_point_release_from_a_checksum_list() -> None:
    sums = "\n".join([
        f"{'a' * 64} *ubuntu-24.04.2-live-server-amd64.iso",
        f"{'b' * 64} *ubuntu-24.04.4-live-server-amd64.iso",
        f"{'c' * 64} *ubuntu-24.04.4-desktop-amd64.iso",
        f"{'d' * 64} *ubuntu-24.04.4-live-server-arm64.iso",
    ])
    assert im.live_server_iso(sums, "ubuntu-24.04") == ("ubuntu-24.04.4-live-server-amd64.iso", "b" * 64)
    assert im.live_server_iso(f"{'e' * 64}  ubuntu-22.04-live-server-amd64.iso", "ubuntu-22.04")[0] == (
        "ubuntu-22.04-live-server-amd64.iso")
    with pytest.raises(ic.InstallConfigError, match=r"names no ubuntu-22\.04 live-server ISO"):
        im.live_server_iso(sums, "ubuntu-22.04")


def test_the_media_table_and_its_documentation() -> None:
    source, checked = im.UBUNTU_MEDIA_SOURCE
    assert "releases.ubuntu.com/<release>/" in source
    docs = (ROOT / "docs" / "baremetal.md").read_text()
    assert "provisioner/areas/baremetal/media.yaml" in docs and checked in docs
    for release, default in im.UBUNTU_MEDIA.items():
        assert default.iso.startswith(release) and default.iso in docs
    with pytest.raises(RuntimeError, match="releases is missing"):
        im.load_media("ubuntu_live_server: {}")


def _installer_os(nodes: list[dict[str, Any]]) -> list[str]:
    """roles/pxe_server/vars/main.yml's __pxe_server_installer_os for ``nodes``, rendered
    with Jinja2 and Ansible's own filters and tests."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(CoreFilters().filters())
    env.tests.update(CoreTests().tests())
    expression = yaml.safe_load((ROOT / "roles/pxe_server/vars/main.yml").read_text())["__pxe_server_installer_os"]
    rendered: list[str] = yaml.safe_load(env.from_string(expression.strip()).render(pxe_server_nodes=nodes))
    return rendered


def test_the_pxe_server_fetches_installer_media_only_for_installer_nodes(kit: Any) -> None:
    """An image deploy boots the deploy ramdisk: a site whose nodes all deploy images must not
    download a live-server ISO (gigabytes) or unpack a netboot installer for nothing."""
    data = kit.example("music-lab.yaml")  # every node ubuntu-24.04, image deploys (the default)
    nodes = rolevars.cluster_vars(kit.load(data).manifest)["pxe_server_nodes"]
    assert {n["method"] for n in nodes} == {"image"}
    assert _installer_os(nodes) == []
    stores = next(n for n in data["nodes"] if n["name"] == "store[1-2]")
    stores["install_method"], stores["os"] = "installer", "debian-12"
    nodes = rolevars.cluster_vars(kit.load(data).manifest)["pxe_server_nodes"]
    assert _installer_os(nodes) == ["debian-12"]
    data["cluster"]["install_method"] = "installer"
    nodes = rolevars.cluster_vars(kit.load(data).manifest)["pxe_server_nodes"]
    assert _installer_os(nodes) == ["debian-12", "ubuntu-24.04"]
    # an entry without a method (an older inventory) is served by the installer, as before
    assert _installer_os([{"name": "n1", "os": "ubuntu-22.04"}]) == ["ubuntu-22.04"]
