"""provisioner.status: rows from the manifest, the state and the probe; the probe's parsers."""

from __future__ import annotations

from typing import Any

from provisioner.nodecheck.check import Output
from provisioner.state import NodeState, RunRecord, State
from provisioner.status import (
    NodeProbe,
    gpus_text,
    parse_node_probe,
    parse_sinfo,
    pending_run,
    reach_text,
    rows,
    slurm_text,
    uptime_text,
)


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
    head = found["head01"]
    assert (reach_text(head), head.slurm, gpus_text(head)) == ("up 1h 2m", None, "-")
    assert (found["node01"].lifecycle, found["node01"].slurm, gpus_text(found["node01"])) == ("configured", "idle",
                                                                                               "1/2")
    assert (found["node01"].gpus_seen, found["node01"].gpus_expected) == (1, 2)
    assert found["node02"].lifecycle == "new" and found["node02"].last_result is None
    assert found["node02"].reachable is False and found["node02"].reach_detail.endswith("Connection refused")
    assert found["node02"].gpus_seen is None and gpus_text(found["node02"]) == "?/2"
    assert found["gone01"].lifecycle == "configured, not in the manifest" and found["gone01"].reachable is None
    assert found["gone02"].lifecycle == "removed" and found["gone02"].applied_at == "2026-11-22T05:00:00+00:00"
    # node02 was removed once and is in the manifest again: it starts afresh
    # sinfo failed: unknown (None), said once by the command, not in every row
    failed = {r.node: r for r in rows(m, state, probes, None)}
    assert failed["node01"].slurm is None and slurm_text(failed["node01"], True, True) == "?"
    assert slurm_text(failed["head01"], True, False) == "-"
    no_probe = {r.node: r for r in rows(m, state, {}, None)}
    assert (reach_text(no_probe["node01"]), no_probe["node01"].slurm, gpus_text(no_probe["node01"])) == ("-", None,
                                                                                                         "?/2")
    assert no_probe["node01"].to_json() == {
        "node": "node01", "lifecycle": "configured", "last_result": "ok", "applied_at": "2026-11-23T05:00:00+00:00",
        "reachable": None, "reach_detail": None, "uptime_s": None, "slurm": None, "gpus_seen": None,
        "gpus_expected": 2, "nvidia_smi": None}


def test_a_run_that_never_recorded_its_result_shows(kit: Any) -> None:
    """After a SIGKILLed apply, status showed the result of the run before it (issue 27 item 10)."""
    m = kit.load(kit.base()).manifest
    state = State(cluster="testc", nodes={"node01": NodeState(lifecycle="configured", last_result="ok")},
                  runs=[RunRecord(id="r1", started="t", result="ok"),
                        RunRecord(id="r2", started="t", limit=["node01"])])
    run = pending_run(state)
    assert run is not None and run.id == "r2"
    found = {r.node: r for r in rows(m, state, {}, None, "interrupted (run r2 ended without recording)", run)}
    assert found["node01"].last_result == "interrupted (run r2 ended without recording)"
    assert found["head01"].last_result is None  # not in that run
    assert pending_run(State(runs=[RunRecord(id="r1", started="t", result="ok")])) is None
