"""provisioner.status: rows from the manifest, the state and the probe; the probe's parsers."""

from __future__ import annotations

from typing import Any

from provisioner.state import NodeState, State
from provisioner.status import NodeProbe, parse_node_probe, parse_sinfo, rows, uptime_text
from provisioner.verify.catalog import Output


def test_parse_node_probe() -> None:
    assert parse_node_probe(Output(stdout="uptime=93784.52\ngpus=2\n")) == NodeProbe(True, "", 93784.52, 2)
    assert parse_node_probe(Output(stdout="uptime=12.0\ngpus=none\n")).gpus is None
    down = parse_node_probe(Output(rc=255, error="ssh: connect to host 10.0.0.21 port 22: No route to host"))
    assert not down.reachable and "No route to host" in down.detail
    odd = parse_node_probe(Output(rc=2, stderr="cut: /proc/uptime: No such file or directory\n"))
    assert not odd.reachable and odd.detail == "probe failed: cut: /proc/uptime: No such file or directory"


def test_parse_sinfo() -> None:
    text = "node01|idle\nnode02|drained\nnode01|idle\nnode03|down*\n"
    assert parse_sinfo(text) == {"node01": "idle", "node02": "drained", "node03": "down*"}
    assert parse_sinfo("") == {}


def test_uptime_text() -> None:
    assert uptime_text(93784) == "1d 2h"
    assert uptime_text(3725) == "1h 2m"


def test_rows(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    state = State(cluster="testc", nodes={
        "head01": NodeState(lifecycle="configured", applied_at="2026-11-23T05:00:00+00:00", last_result="ok"),
        "node01": NodeState(lifecycle="configured", applied_at="2026-11-23T05:00:00+00:00", last_result="ok"),
        "gone01": NodeState(lifecycle="configured", applied_at="2026-11-20T05:00:00+00:00", last_result="ok"),
        "gone02": NodeState(lifecycle="removed", applied_at="2026-11-20T05:00:00+00:00", last_result="ok",
                            removed_at="2026-11-22T05:00:00+00:00"),
        "node02": NodeState(lifecycle="removed", removed_at="2026-11-22T05:00:00+00:00"),
    })
    probes = {
        "head01": NodeProbe(True, "", 3725.0, None),
        "node01": NodeProbe(True, "", 93784.0, 1),
        "node02": NodeProbe(False, "ssh: connect to host 10.0.0.22 port 22: Connection refused"),
    }
    found = {r.node: r for r in rows(m, state, probes, {"node01": "idle", "node02": "down*"})}
    assert list(found) == ["head01", "node01", "node02", "gone01", "gone02"]
    assert (found["head01"].reach, found["head01"].slurm, found["head01"].gpus) == ("up 1h 2m", "-", "-")
    assert (found["node01"].lifecycle, found["node01"].slurm, found["node01"].gpus) == ("configured", "idle", "1/2")
    assert found["node02"].lifecycle == "new" and found["node02"].last_result == "-"
    assert found["node02"].reach.endswith("Connection refused") and found["node02"].gpus == "?/2"
    assert found["gone01"].lifecycle == "configured, not in the manifest" and found["gone01"].reach == "-"
    assert found["gone02"].lifecycle == "removed" and found["gone02"].applied_at == "2026-11-22T05:00:00+00:00"
    # node02 was removed once and is in the manifest again: it starts afresh
    # Slurm not asked, or sinfo failed: said so per compute node
    failed = {r.node: r for r in rows(m, state, probes, None, "sinfo: timed out after 10 s on head01")}
    assert failed["node01"].slurm == "sinfo: timed out after 10 s on head01"
    no_probe = {r.node: r for r in rows(m, state, {}, None)}
    assert (no_probe["node01"].reach, no_probe["node01"].slurm, no_probe["node01"].gpus) == ("-", "-", "?/2")
