"""The lab's guest image (tests/lab/build-image.sh) carries every package the roles install
on the lab's booted guests, so no apt task of theirs reaches the network under emulation:
a unit test (no VM), run with the unit stage. pxe1 is deployed from the node image that
`provision image build` makes, so its packages are not the guest image's business."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from provisioner import packages
from provisioner.validate import load_text

HERE = Path(__file__).resolve().parent
DEPLOYED = {"pxe1"}
# in every Debian system (priority required), so not listed; the headers of the guest's
# kernel come with linux-headers-amd64 (the roles name them by the running release)
IN_ANY_IMAGE = {"e2fsprogs"}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl lab"


def image_packages(script: str) -> set[str]:
    """The names in build-image.sh's BASE_PACKAGES and ROLE_PACKAGES arrays."""
    names: set[str] = set()
    for array in ("BASE_PACKAGES", "ROLE_PACKAGES"):
        found = re.search(rf"^{array}=\((.*?)^\)", script, re.S | re.M)
        assert found, f"build-image.sh has no {array}=( ... )"
        for line in found.group(1).splitlines():
            names.update(line.split("#", 1)[0].split())
    return names


def test_the_guest_image_carries_what_the_roles_install_on_the_booted_guests() -> None:
    data = yaml.safe_load((HERE / "lab.yaml").read_text())
    data["cluster"]["ssh"]["public_key"] = KEY
    manifest = load_text(yaml.safe_dump(data), "lab.yaml").manifest
    have = image_packages((HERE / "build-image.sh").read_text()) | IN_ANY_IMAGE
    missing = {}
    for request in packages.wanted(manifest, "debian-12").requests:
        if set(request.nodes) <= DEPLOYED:
            continue
        names = [p.split("=", 1)[0] for p in request.packages]
        gone = [n for n in names if n not in have and not n.startswith("linux-headers-")]
        if gone:
            missing[f"{request.role} ({request.task}) on {', '.join(request.nodes)}"] = gone
    assert not missing, f"add to ROLE_PACKAGES in tests/lab/build-image.sh: {missing}"


def test_the_reader_sees_both_arrays() -> None:
    script = "BASE_PACKAGES=(\n  a b # c\n)\nROLE_PACKAGES=(\n  # x\n  d\n)\n"
    assert image_packages(script) == {"a", "b", "d"}
