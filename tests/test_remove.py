"""provisioner.remove: which nodes may be removed."""

from __future__ import annotations

from typing import Any

from provisioner.remove import removal_problems
from provisioner.state import NodeState, State


def test_removal_problems(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    state = State(nodes={"node09": NodeState(lifecycle="configured"), "node08": NodeState(
        lifecycle="removed", removed_at="2026-11-23T05:00:00+00:00")})
    assert removal_problems(m, state, ["node09"]) == []
    (still,) = removal_problems(m, state, ["node01"])
    assert still.startswith("node01 is still in the manifest: delete it there first")
    (unknown,) = removal_problems(m, state, ["node77"])
    assert unknown == "node77 is not in the state: nothing to remove (nodes the manifest no longer lists: node09)"
    assert removal_problems(m, state, ["node08"]) == ["node08 was removed already (2026-11-23T05:00:00+00:00)"]
