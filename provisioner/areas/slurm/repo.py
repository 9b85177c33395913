"""The built Slurm's way to the nodes (``slurm.source: build``; pure): a flat apt repository
per OS release, indexed and signed on the control machine with the cluster's key, served by
the head node's nginx, and pinned on every Slurm node over the OS's own Slurm. The role
variables of a built Slurm. The design: docs/design.md, "One Slurm for the cluster"."""

from __future__ import annotations

from typing import Any

from provisioner.areas.slurm.build import PACKAGES, slurm_os_releases, source
from provisioner.manifest.fields import OsName
from provisioner.manifest.model import Manifest

# The OS archives' Slurm packages, kept off nodes that run SchedMD's (other names, same files).
OS_SLURM_PACKAGES = ("slurm-wlm*", "slurm-client*", "slurmd", "slurmctld", "slurmdbd", "slurmrestd",
                     "libslurm*", "libpmi*", "libpam-slurm*", "sackd")
REPO_PORT = 8073  # the head's nginx serves the repository here (80: pxe_server, 8071: pxe-state)
REPO_ROOT = "/srv/provision-slurm"
REPO_KEYRING = "/etc/apt/keyrings/provision-slurm.asc"
# The cluster's repository key: a GnuPG home in the state directory's secrets/ (never copied
# anywhere; only the public key goes to the nodes, as REPO_KEYRING).
SIGNING_HOME = "slurm-repo-gnupg"
PIN_FILE = "/etc/apt/preferences.d/provision-slurm"


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
    """Make the cluster's repository key in the GnuPG home ``home`` (once: the edge runs these
    only when ``home`` holds no key) and export its public half as ``home``/public.asc."""
    return [
        ["gpg", "--batch", "--homedir", home, "--passphrase", "", "--quick-gen-key",
         f"provision Slurm repository ({cluster})", "ed25519", "sign", "never"],
        ["gpg", "--batch", "--homedir", home, "--armor", "--output", f"{home}/public.asc", "--export"],
    ]


def repo_commands(os_name: str, home: str) -> list[list[str]]:
    """On the control machine, in the cache's ``repo/<os>/`` holding the built .debs: the flat
    repository's indexes, signed with the cluster key in the GnuPG home ``home`` (the secret key
    never leaves the control machine; the head only serves the files)."""
    return [
        ["sh", "-c", "dpkg-scanpackages --multiversion . > Packages && gzip -9kf Packages"],
        ["sh", "-c", "apt-ftparchive -o APT::FTPArchive::Release::Origin=provision "
                     f"-o APT::FTPArchive::Release::Label=slurm-{os_name} release . > Release"],
        ["gpg", "--batch", "--yes", "--homedir", home, "--clearsign", "--output", "InRelease", "Release"],
    ]


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


