"""provisioner.ansible_plugins.strategy.provision: its pure decisions (the plugin at work
is in tests/test_runner_ansible.py)."""

from __future__ import annotations

import pytest

from provisioner.ansible_plugins.strategy.provision import capped, task_cap, whole_batch_failed
from provisioner.settings import TASK_CAP_ENV


def test_the_cap_keeps_the_smaller_bound() -> None:
    assert capped(900, 90) == 90
    assert capped(30, 90) == 30
    assert capped(None, 90) == 90
    assert capped(0, 90) == 90  # Ansible's "no timeout"
    assert capped(900, None) == 900


@pytest.mark.parametrize(("value", "cap"), [("90", 90), ("", None), ("0", None), ("-5", None), ("ten", None)])
def test_the_cap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, value: str, cap: int | None) -> None:
    monkeypatch.setenv(TASK_CAP_ENV, value)
    assert task_cap() == cap


def test_a_play_ends_for_nobody_else_only_when_its_whole_batch_failed() -> None:
    assert whole_batch_failed(["a"], {"a"}, set())
    assert whole_batch_failed(["a", "b"], {"a"}, {"b"})
    assert not whole_batch_failed(["a", "b"], {"a"}, set())
    assert not whole_batch_failed([], set(), set())
