"""Shared fixtures for the baremetal scenario's testinfra checks."""

from __future__ import annotations

import os
from typing import Any

import pytest
import testinfra

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]


@pytest.fixture(scope="module")
def server() -> Any:
    return testinfra.get_host("ansible://pxe-server", ansible_inventory=INVENTORY)


@pytest.fixture(scope="module")
def client() -> Any:
    return testinfra.get_host("ansible://pxe-client", ansible_inventory=INVENTORY)
