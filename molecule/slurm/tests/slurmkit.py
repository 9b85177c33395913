"""Helpers of the slurm scenario's verifier (molecule/slurm/tests): a node of the scenario
reached over the inventory's SSH connection, and polling with a time bound."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import testinfra

T = TypeVar("T")


def node(name: str) -> Any:
    """A testinfra host of the scenario over the inventory's connection
    (.config/molecule/config.yml); testinfra keeps one per name."""
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=os.environ["MOLECULE_INVENTORY_FILE"])


def wait_for(what: str, probe: Callable[[], T], timeout: float = 90, step: float = 1) -> T:
    """Call ``probe`` every ``step`` seconds until it returns something true, and return that;
    fail naming ``what`` and the last answer after ``timeout`` seconds. The step is short:
    each probe is one command over the node's open SSH connection, and on a loaded machine a
    long step adds its whole length to every wait."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() + step > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}; last: {last!r}")
        time.sleep(step)
