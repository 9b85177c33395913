"""`provision status`: one row per node from the recorded state and a quick live probe.

Pure: the probe's commands and parsers, and the rows built from the manifest, the state
and the probe's outputs; the command (provisioner/commands/status.py) runs the probe over
SSH with :mod:`provisioner.verify.remote`, each command bounded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from provisioner.manifest.model import Manifest
from provisioner.nodecheck.check import Output
from provisioner.state import RunRecord, State

NODE_PROBE = ("printf 'uptime=%s\\n' \"$(cut -d' ' -f1 /proc/uptime)\"; "
              "if command -v nvidia-smi >/dev/null 2>&1; then "
              "printf 'gpus=%s\\n' \"$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')\"; else echo gpus=none; fi")
SLURM_PROBE = "sinfo --noheader --Node --format='%N|%T'"
PROBE_TIMEOUT = 10  # seconds status waits for a node at most, the SSH connection included (it is meant to be quick)
PROBE_COMMAND_TIMEOUT = 5  # of them for the command on the node (timeout(1) there); the rest is the connection's


@dataclass(frozen=True)
class NodeProbe:
    reachable: bool
    detail: str = ""  # why not, when not reachable
    uptime_s: float | None = None
    gpus: int | None = None  # None: no nvidia-smi on the node


def parse_node_probe(out: Output) -> NodeProbe:
    if out.error:
        return NodeProbe(False, out.error)
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    try:
        uptime = float(values["uptime"])
    except (KeyError, ValueError):
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        return NodeProbe(False, f"probe failed: {lines[-1] if lines else f'exit {out.rc}'}")
    gpus_text = values.get("gpus", "none").strip()
    return NodeProbe(True, "", uptime, int(gpus_text) if gpus_text.isdigit() else None)


def parse_sinfo(text: str) -> dict[str, str]:
    """``sinfo --noheader --Node --format='%N|%T'``: node -> state (a node in several
    partitions is listed once per partition with the same state)."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, state = line.strip().partition("|")
        if sep and name:
            states[name] = state.strip()
    return states


@dataclass(frozen=True)
class Row:
    """One node's row. None is unknown or not asked, in the table shown as "-" (JSON: null)."""

    node: str
    lifecycle: str  # from the state; for a node the manifest no longer lists: "removed", or
    # "<lifecycle>, not in the manifest" while its removal is pending (provision remove)
    last_result: str | None
    applied_at: str | None  # for a removed node: when it was removed
    reachable: bool | None  # None: not probed
    reach_detail: str | None  # why not, when not reachable
    uptime_s: float | None
    slurm: str | None  # Slurm's state of the node; None: Slurm off, not asked, not a Slurm node, or unknown
    gpus_seen: int | None  # None: not probed, unreachable, or no nvidia-smi on the node
    gpus_expected: int
    nvidia_smi: bool | None = None  # whether the node has nvidia-smi; None: not probed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def probe_failed(self) -> bool:
        return self.reachable is False


def uptime_text(seconds: float) -> str:
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}d {hours}h" if days else f"{hours}h {rest // 60}m"


def reach_text(r: Row) -> str:
    if r.reachable is None:
        return "-"
    return f"up {uptime_text(r.uptime_s or 0)}" if r.reachable else (r.reach_detail or "unreachable")


def gpus_text(r: Row) -> str:
    if r.gpus_seen is not None:
        return f"{r.gpus_seen}/{r.gpus_expected}"
    if not r.gpus_expected:
        return "-"
    return f"no nvidia-smi/{r.gpus_expected}" if r.reachable and r.nvidia_smi is False else f"?/{r.gpus_expected}"


def slurm_text(r: Row, slurm_asked: bool, is_slurm_node: bool) -> str:
    if r.slurm is not None:
        return r.slurm
    return "?" if slurm_asked and is_slurm_node else "-"


def pending_run(state: State) -> RunRecord | None:
    """The newest run still marked running: an apply going on now, or one that was killed
    before it could record its result (SIGKILL, a crash). Its nodes' recorded results are
    older than it."""
    return next((r for r in reversed(state.runs) if r.result == "running"), None)


def rows(m: Manifest, state: State, probes: dict[str, NodeProbe], slurm: dict[str, str] | None,
         pending: str | None = None, run: RunRecord | None = None) -> list[Row]:
    """One row per manifest node (in its order), then the recorded nodes it no longer lists.
    ``slurm``: sinfo's states (None: Slurm off, not asked, or sinfo failed). ``pending``:
    what the last result of the nodes of ``run`` is instead of the recorded one
    ("running", or that the run ended without recording)."""
    out: list[Row] = []
    in_pending = set(run.limit or m.node_names()) if run is not None else set()
    for node in m.nodes:
        ns = state.nodes.get(node.name)
        probe = probes.get(node.name)
        known = slurm is not None and (node.has_role("compute") or node.name in slurm)
        lifecycle: str = "new" if ns is None or ns.lifecycle == "removed" else ns.lifecycle  # added again: afresh
        last = pending if node.name in in_pending and pending else (ns.last_result if ns else None)
        out.append(Row(
            node.name, lifecycle, last, ns.applied_at if ns else None,
            reachable=None if probe is None else probe.reachable,
            reach_detail=probe.detail if probe is not None and not probe.reachable else None,
            uptime_s=probe.uptime_s if probe is not None else None,
            slurm=(slurm or {}).get(node.name, "not in sinfo") if known else None,
            gpus_seen=probe.gpus if probe is not None and probe.reachable else None,
            gpus_expected=node.gpu_count,
            nvidia_smi=(probe.gpus is not None) if probe is not None and probe.reachable else None,
        ))
    names = set(m.node_names())
    for name in sorted(set(state.nodes) - names):
        ns = state.nodes[name]
        gone = "removed" if ns.lifecycle == "removed" else f"{ns.lifecycle}, not in the manifest"
        out.append(Row(name, gone, ns.last_result, ns.removed_at or ns.applied_at, None, None, None, None, None, 0))
    return out
