"""provisioner.areas.storage.units: systemd mount unit names, as systemd-escape makes them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.areas.storage import units

ROOT = Path(__file__).resolve().parents[3]
HGST = "ata-HGST_HUS726T6TALE6L4_V8G0000"


# =========================================================================== units
@pytest.mark.parametrize(
    ("path", "unit"),
    [("/data", "data.mount"), ("/mnt/corpus1", "mnt-corpus1.mount"),
     ("/home/shared", "home-shared.mount"), ("/mnt/a-b", "mnt-a\\x2db.mount"),
     ("/srv/my data", "srv-my\\x20data.mount"), ("/.hidden/x", "\\x2ehidden-x.mount"),
     ("/", "-.mount"), ("/srv/ä", "srv-\\xc3\\xa4.mount")],
)
def test_mount_unit_names(path: str, unit: str) -> None:
    assert units.mount_unit(path) == unit
    assert units.automount_unit(path) == unit.replace(".mount", ".automount")


SYSTEMD_ESCAPE = shutil.which("systemd-escape")


@pytest.mark.skipif(SYSTEMD_ESCAPE is None, reason="systemd-escape not installed")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abz09._-: @ä+", min_size=1, max_size=8), min_size=1, max_size=4))
def test_escape_matches_systemd(parts: list[str]) -> None:
    parts = [p for p in parts if p not in (".", "..")]
    if not parts:
        return
    path = "/" + "/".join(parts)
    assert SYSTEMD_ESCAPE is not None
    real = subprocess.run([SYSTEMD_ESCAPE, "--path", path], capture_output=True, text=True, check=True)
    assert units.systemd_escape_path(path) == real.stdout.strip()
