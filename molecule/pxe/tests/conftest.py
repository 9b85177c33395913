"""Shared fixtures for the pxe scenario's testinfra checks."""

from __future__ import annotations

from typing import Any

import pytest
import testinfra

# testinfra's podman backend runs `podman exec` directly; its ansible backend would send
# every command through an ansible run (minutes for this scenario).


@pytest.fixture(scope="module")
def server() -> Any:
    return testinfra.get_host("podman://pxe-server")


@pytest.fixture(scope="module")
def client() -> Any:
    return testinfra.get_host("podman://pxe-client")
