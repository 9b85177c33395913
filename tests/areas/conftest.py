"""Fixtures shared by the areas' tests: the two example manifests, loaded once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.manifest import Manifest
from provisioner.validate import load_manifest

ROOT = Path(__file__).resolve().parents[2]


def example(name: str) -> Manifest:
    return load_manifest(ROOT / "examples" / name).manifest


@pytest.fixture(scope="module")
def llm() -> Manifest:
    return example("llm-200k.yaml")


@pytest.fixture(scope="module")
def lab() -> Manifest:
    return example("music-lab.yaml")
