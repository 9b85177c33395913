"""The built Slurm's way to the nodes (``slurm.source: build``; pure): a flat apt repository
per OS release, indexed and signed on the control machine with the cluster's key, served by
the head node's nginx, and pinned on every Slurm node over the OS's own Slurm. The role
variables of a built Slurm. The design: docs/design.md, "One Slurm for the cluster"."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from provisioner.areas.slurm.build import PACKAGES, slurm_os_releases, source
from provisioner.manifest.fields import OsName
from provisioner.manifest.model import Manifest

# The OS archives' Slurm packages, kept off nodes that run SchedMD's (other names, same files).
# (Not libpmi*: libpmix2, PMIx itself, is the OS's and Slurm's PMIx plugin needs it.)
OS_SLURM_PACKAGES = ("slurm-wlm*", "slurm-client*", "slurmd", "slurmctld", "slurmdbd", "slurmrestd",
                     "libslurm*", "libpmi0*", "libpmi2-0*", "libpam-slurm*", "sackd")
REPO_PORT = 8073  # the head's nginx serves the repository here (80: pxe_server, 8071: pxe-state)
REPO_ROOT = "/srv/provision-slurm"
REPO_KEYRING = "/etc/apt/keyrings/provision-slurm.asc"
# The cluster's repository key: a GnuPG home in the state directory's secrets/ (never copied
# anywhere; only the public key goes to the nodes, as REPO_KEYRING).
SIGNING_HOME = "slurm-repo-gnupg"
PIN_FILE = "/etc/apt/preferences.d/provision-slurm"
ORIGIN = "provision"


def repo_url(m: Manifest, os_name: OsName | str) -> str:
    """The flat repository of ``os_name``'s packages on the head, over its management address."""
    return f"http://{m.head.ip}:{REPO_PORT}/{os_name}/"


def apt_source(m: Manifest, os_name: OsName | str) -> str:
    return f"deb [signed-by={REPO_KEYRING}] {repo_url(m, os_name)} ./"


def pin(m: Manifest) -> str:
    """/etc/apt/preferences.d/provision-slurm: the head's packages over any other version
    (1001: also over a newer one elsewhere, so no update swaps a node's Slurm), and the OS's
    own Slurm packages (other names, the same files) never installed."""
    text = f"Package: *\nPin: origin \"{m.head.ip}\"\nPin-Priority: 1001\n"
    for origin in ("Debian", "Ubuntu"):
        text += f"\nPackage: {' '.join(OS_SLURM_PACKAGES)}\nPin: release o={origin}\nPin-Priority: -1\n"
    return text


def key_commands(home: str, cluster: str) -> list[list[str]]:
    """Make the cluster's repository key in the GnuPG home ``home`` (once: the edge runs the
    first only when ``home`` holds no secret key) and export its public half, which the nodes
    get as REPO_KEYRING."""
    return [
        ["gpg", "--batch", "--homedir", home, "--passphrase", "", "--quick-gen-key",
         f"provision Slurm repository ({cluster})", "ed25519", "sign", "never"],
        ["gpg", "--batch", "--yes", "--homedir", home, "--armor", "--output", f"{home}/{PUBLIC_KEY}", "--export"],
    ]


PUBLIC_KEY = "public.asc"


def packages_stanza(control: str, file_name: str, data: bytes) -> str:
    """A .deb's entry in the flat repository's Packages index: its control fields (``dpkg-deb
    --field``) and where and what the file is (what apt checks the download against)."""
    fields = control.strip("\n")
    return (f"{fields}\nFilename: ./{file_name}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n")


def release_text(os_name: str, indexes: Mapping[str, bytes], date: str) -> str:
    """The repository's Release file: its origin and label (what the pin and apt-cache policy
    show) and the size and SHA256 of each index (``Packages``, ``Packages.gz``)."""
    lines = [f"Origin: {ORIGIN}", f"Label: slurm-{os_name}", f"Date: {date}", "SHA256:"]
    lines += [f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}" for name, data in sorted(indexes.items())]
    return "\n".join(lines) + "\n"


def sign_command(home: str) -> list[str]:
    """Release -> InRelease (clear-signed) in the current folder, with the key in ``home``."""
    return ["gpg", "--batch", "--yes", "--homedir", home, "--clearsign", "--output", "InRelease", "Release"]


def cluster_vars(m: Manifest) -> dict[str, Any]:
    """The role variables of a built Slurm (nothing with ``slurm.source: os``, so that the
    fingerprints of existing clusters stay as they are)."""
    src = source(m)
    if src is None:
        return {}
    return {"slurm_build": {
        "version": src.version,
        "packages": {daemon: list(names) for daemon, names in PACKAGES.items()},
        "repo_port": REPO_PORT,
        "repo_root": REPO_ROOT,
        "keyring": REPO_KEYRING,
        "sources": {os_name: apt_source(m, os_name) for os_name in slurm_os_releases(m)},
        "pin_file": PIN_FILE,
        "pin": pin(m),
        "cgroup_plugin": "autodetect",
    }}


