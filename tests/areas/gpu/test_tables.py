"""provisioner/areas/gpu/versions.yaml: the vendors' tables as data, and the docs that say
where each comes from and when it was last checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provisioner.areas.gpu import decide as gpu

ROOT = Path(__file__).resolve().parents[3]
DOCS = (ROOT / "docs" / "roles" / "gpu.md").read_text()
SECTION = DOCS.split("## Version tables", 1)[-1].split("\n## ", 1)[0]


def _docs_row(table: str) -> str:
    row = next((line for line in SECTION.splitlines() if line.startswith(f"| `{table}` |")), None)
    assert row is not None, f"docs/roles/gpu.md has no row for table {table}"
    return row


@pytest.mark.parametrize("table", sorted(gpu.TABLE_SOURCES))
def test_every_table_has_a_source_and_date_in_the_docs(table: str) -> None:
    source, checked = gpu.TABLE_SOURCES[table]
    assert source.strip() and re.search(r"\b20\d\d\b", checked), (table, checked)
    assert _docs_row(table).rstrip(" |").endswith(checked)


def test_the_docs_list_no_table_the_data_lacks() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| ", SECTION, re.M)
    assert set(rows) - {"cuda_defaults"} == set(gpu.TABLE_SOURCES)


def test_the_tables_are_consistent() -> None:
    assert not set(gpu.UBUNTU_TRANSITIONAL) & gpu.UBUNTU_SERVER_BRANCHES
    assert set(gpu.UBUNTU_TRANSITIONAL.values()) <= gpu.UBUNTU_SERVER_BRANCHES
    assert all(int(b) < gpu.CUDA_REPO_RENAMED_FROM for b in gpu.CUDA_REPO_BRANCHES)
    for os_name, defaults in gpu.CUDA_DEFAULTS.items():
        for source, version in defaults.items():
            allowed = gpu.CUDA_REPO_VERSIONS[os_name] if source == "cuda-repo" else (gpu.DEBIAN_CUDA_VERSION,)
            assert version in allowed, (os_name, source, version)


def test_a_malformed_table_is_refused() -> None:
    with pytest.raises(RuntimeError, match="not a mapping"):
        gpu.load_versions("- a list")
    assert gpu.load_versions("driver_branches: {}") == {"driver_branches": {}}
