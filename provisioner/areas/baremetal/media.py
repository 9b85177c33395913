"""The installers' media: the pinned Ubuntu live-server ISOs (``media.yaml``: where each
release's current point release lives, its checksum file, the newest ISO known here) and
Debian's netboot installer, and which of them a node's OS needs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import yaml

from provisioner.areas.baremetal.decide import InstallConfigError
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.platforms import UBUNTU_RELEASES

# --------------------------------------------------------------------------- installer media
MEDIA_FILE = "media.yaml"


@dataclass(frozen=True)
class UbuntuMediaSource:
    """Where a release's live-server ISO comes from by default: a directory that always holds
    the current point release, its checksum file, and the newest ISO name known here."""

    directory: str
    sha256sums: str
    iso: str


def load_media(text: str | None = None) -> tuple[dict[str, UbuntuMediaSource], tuple[str, str]]:
    """(release -> default source, (source, last checked)) from media.yaml (or ``text``)."""
    if text is None:
        text = resources.files(__package__ or "provisioner.areas.baremetal").joinpath(MEDIA_FILE).read_text("utf-8")
    data = yaml.safe_load(text)
    table = data.get("ubuntu_live_server") if isinstance(data, dict) else None
    if not isinstance(table, dict) or not isinstance(table.get("releases"), dict):
        raise RuntimeError(f"{MEDIA_FILE}: ubuntu_live_server.releases is missing")
    out: dict[str, UbuntuMediaSource] = {}
    for release in UBUNTU_RELEASES:
        entry = table["releases"].get(release)
        if not isinstance(entry, dict) or not str(entry.get("directory", "")).endswith("/"):
            raise RuntimeError(f"{MEDIA_FILE}: {release} needs a directory ending in /")
        out[release] = UbuntuMediaSource(str(entry["directory"]), str(table["sha256sums"]), str(entry["iso"]))
    return out, (str(table["source"]), str(table["checked"]))


UBUNTU_MEDIA, UBUNTU_MEDIA_SOURCE = load_media()


def live_server_iso(sha256sums: str, release: str) -> tuple[str, str]:
    """(ISO name, SHA-256) of the newest live-server ISO of ``release`` (ubuntu-24.04) listed
    in a SHA256SUMS file (``<hex> *<name>`` lines). For the pxe_server role, which resolves
    the current point release from the stable directory instead of a name that moves away."""
    version = release.removeprefix("ubuntu-")
    pattern = re.compile(rf"^([0-9a-f]{{64}}) [ *]?(ubuntu-{re.escape(version)}(?:\.(\d+))?-live-server-amd64\.iso)$")
    found: list[tuple[int, str, str]] = []
    for line in sha256sums.splitlines():
        match = pattern.match(line.strip())
        if match:
            found.append((int(match.group(3) or 0), match.group(2), match.group(1)))
    if not found:
        raise InstallConfigError(f"the checksum list names no {release} live-server ISO for amd64")
    _point, name, digest = max(found)
    return name, digest


def ubuntu_media(m: Manifest) -> dict[str, dict[str, str]]:
    """The pxe_server role's ``pxe_server_ubuntu_media``: per Ubuntu release ``url``, ``path``
    and ``checksum``, from the manifest's pinned ``cluster.install_media`` or else the release's
    stable directory (the newest ISO name known here, verified against the directory's
    SHA256SUMS, so a superseded name fails at once naming the checksum list), plus
    ``directory`` and ``sha256sums`` for resolving the current point release
    (:func:`live_server_iso`)."""
    out: dict[str, dict[str, str]] = {}
    for release in UBUNTU_RELEASES:
        default = UBUNTU_MEDIA[release]
        sums = default.directory + default.sha256sums
        entry = {"directory": default.directory, "sha256sums": sums}
        pinned = next((media for name, media in m.cluster.install_media.items() if name == release), None)
        if pinned is None:
            entry |= {"url": default.directory + default.iso, "path": "", "checksum": f"sha256:{sums}"}
        else:
            entry |= {"url": pinned.url or "", "path": pinned.path or "",
                      "checksum": f"sha256:{pinned.sha256}" if pinned.sha256 else ""}
        out[release] = entry
    return out


def media_for(nodes: list[Node]) -> list[str]:
    """The installer media (OS names) the PXE server needs for ``nodes``."""
    return sorted({n.os for n in nodes})
