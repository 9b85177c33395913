"""`provision status`: one row per node from the recorded state and a quick live probe.

Pure: the probe's commands and parsers, and the rows built from the manifest, the state
and the probe's outputs; the command (provisioner/commands/status.py) runs the probe over
SSH with :mod:`provisioner.verify.remote`, each command bounded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from provisioner.manifest.model import Manifest
from provisioner.state import State
from provisioner.verify.catalog import Output

NODE_PROBE = ("printf 'uptime=%s\\n' \"$(cut -d' ' -f1 /proc/uptime)\"; "
              "if command -v nvidia-smi >/dev/null 2>&1; then "
              "printf 'gpus=%s\\n' \"$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')\"; else echo gpus=none; fi")
SLURM_PROBE = "sinfo --noheader --Node --format='%N|%T'"
PROBE_TIMEOUT = 10  # seconds per probe command (status is meant to be quick)


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
    node: str
    lifecycle: str  # from the state; for a node the manifest no longer lists: "removed", or
    # "<lifecycle>, not in the manifest" while its removal is pending (provision remove)
    last_result: str
    applied_at: str  # for a removed node: when it was removed
    reach: str  # "up <uptime>", or why not; "-" when not probed
    slurm: str  # Slurm's state of the node; "-" when Slurm is off or not asked
    gpus: str  # "seen/expected", "-" without GPUs in the manifest and none seen

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def uptime_text(seconds: float) -> str:
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}d {hours}h" if days else f"{hours}h {rest // 60}m"


def gpus_text(expected: int, probe: NodeProbe | None) -> str:
    if probe is None or not probe.reachable:
        return f"?/{expected}" if expected else "-"
    if probe.gpus is None:
        return f"no nvidia-smi/{expected}" if expected else "-"
    return f"{probe.gpus}/{expected}"


def rows(m: Manifest, state: State, probes: dict[str, NodeProbe], slurm: dict[str, str] | None,
         slurm_problem: str = "") -> list[Row]:
    """One row per manifest node (in its order), then the recorded nodes it no longer lists.
    ``slurm``: sinfo's states (None: Slurm off or not asked); ``slurm_problem``: why sinfo
    gave nothing."""
    out: list[Row] = []
    for node in m.nodes:
        ns = state.nodes.get(node.name)
        probe = probes.get(node.name)
        if probe is None:
            reach = "-"
        elif probe.reachable:
            reach = f"up {uptime_text(probe.uptime_s or 0)}"
        else:
            reach = probe.detail
        if slurm is None:
            slurm_state = slurm_problem or "-"
        elif node.has_role("compute") or node.name in slurm:
            slurm_state = slurm.get(node.name, "not in sinfo")
        else:
            slurm_state = "-"
        lifecycle: str = "new" if ns is None or ns.lifecycle == "removed" else ns.lifecycle  # added again: afresh
        out.append(Row(node.name, lifecycle, (ns.last_result or "-") if ns else "-",
                       (ns.applied_at or "-") if ns else "-", reach, slurm_state,
                       gpus_text(node.gpu_count, probe)))
    names = set(m.node_names())
    for name in sorted(set(state.nodes) - names):
        ns = state.nodes[name]
        gone = "removed" if ns.lifecycle == "removed" else f"{ns.lifecycle}, not in the manifest"
        out.append(Row(name, gone, ns.last_result or "-", ns.removed_at or ns.applied_at or "-", "-", "-", "-"))
    return out
