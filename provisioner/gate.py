"""The acceptance gate: a new or rolled Slurm compute node takes no job until it passed the
checks the manifest's ``verify.gate`` names (docs/operations.md, "The acceptance gate").

Pure apart from the injected :class:`AdmitSteps` (Slurm on the controller and verify over SSH
in provisioner/commands/apply.py, fakes in the tests):

* a new compute node (the first apply that configures it) is drained with the reason
  ``provision gate: awaiting <checks>``, the gate's checks run on it, and it is resumed when
  they passed; else it stays drained with ``provision gate: <check> failed: <why>``;
* a rolled node runs every verify check anyway (provisioner/rolling.py); a gate check that
  failed there leaves it drained with the same gate reason;
* ``provision resume`` refuses a node whose reason is the gate's without ``--force``.

A gate check must PASS on a node the manifest gives GPUs (a SKIP there, e.g. DCGM not
installed, holds the node); on a node without GPUs its SKIP passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from provisioner.drain import Drained
from provisioner.verify.run import Result

GATE_PREFIX = "provision gate"
REASON_MAX = 200  # characters of a Slurm reason we write


@dataclass(frozen=True)
class Finding:
    """What keeps a node from jobs: a check that failed (``gate``: one of the gate's)."""

    check: str
    detail: str
    gate: bool = False

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}"


def hold_reason(gate: Sequence[str]) -> str:
    return f"{GATE_PREFIX}: awaiting {', '.join(gate)}"


def failed_reason(found: Sequence[Finding]) -> str:
    """The Slurm reason of a node the gate holds: the first failing check, and how many more."""
    first = found[0]
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    text = f"{GATE_PREFIX}: {first.check} failed: {first.detail}"
    return text[:REASON_MAX - len(more)] + more


def is_gate_reason(reason: str) -> bool:
    return reason.startswith(f"{GATE_PREFIX}:")


def findings(results: Sequence[Result], gate: Sequence[str], has_gpus: bool) -> list[Finding]:
    """Every FAIL of a node's verify rows (marked ``gate`` where the check is one of the gate's),
    and a gate check that said SKIP on a node the manifest gives GPUs."""
    out: list[Finding] = []
    for r in results:
        gated = r.check in gate
        if r.status == "FAIL":
            out.append(Finding(r.check, r.detail, gated))
        elif r.status == "SKIP" and gated and has_gpus:
            out.append(Finding(r.check, f"did not run ({r.detail})", True))
    return out


@dataclass(frozen=True)
class AdmitSteps:
    hold: Callable[[str, str], Drained]  # drain the node with this reason (not waiting for jobs)
    check: Callable[[str], list[Finding]]  # the gate's checks on the node: what failed
    resume: Callable[[str], Drained]
    leave_drained: Callable[[str, str], str]  # set this reason on the drained node: "" or why not


Verdict = Literal["resumed", "held", "not gated"]


@dataclass(frozen=True)
class Admission:
    node: str
    verdict: Verdict  # resumed: passed; held: drained with the gate's reason; not gated: see detail
    detail: str


def admit(nodes: Sequence[str], gate: Sequence[str], steps: AdmitSteps) -> list[Admission]:
    """Hold each node, run the gate's checks, then resume it or leave it held with the reason."""
    out: list[Admission] = []
    for node in nodes:
        held = steps.hold(node, hold_reason(gate))
        if not held.ok:  # e.g. the controller does not answer: the gate could not hold it
            out.append(Admission(node, "not gated", held.detail))
            continue
        found = steps.check(node)
        if found:
            reason = failed_reason(found)
            why = steps.leave_drained(node, reason)
            detail = reason if not why else f"drained as '{hold_reason(gate)}'; the failure could not be set: {why}"
            out.append(Admission(node, "held", detail))
            continue
        resumed = steps.resume(node)
        out.append(Admission(node, "resumed" if resumed.ok else "held",
                             f"passed {', '.join(gate)}; {resumed.detail}"))
    return out


def resume_refusal(node: str, reason: str) -> str:
    """Why ``provision resume`` (without --force) will not resume ``node`` ("" when it may)."""
    if not is_gate_reason(reason):
        return ""
    return (f"{node} is held by the acceptance gate ({reason}); fix it and roll it through the gate "
            f"(provision apply --rolling --full --limit {node}), or resume it anyway with --force")
