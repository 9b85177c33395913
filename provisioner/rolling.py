"""`provision apply --rolling`: node-local changes on Slurm compute nodes, a batch at a time.

The roll (pure; its side effects are the injected :class:`Steps`, faked in the tests):

1. the batch's nodes are drained in Slurm and their jobs waited for (bounded);
2. their node-local plays run (apply with --limit the batch; the roles reboot for a new
   driver themselves when cluster.allow_reboot says so);
3. a node that still wants a reboot (/var/run/reboot-required) is rebooted when
   cluster.allow_reboot is true and waited for, else that is noted and it goes on;
4. each node passes ``verify`` for itself (with the acceptance gate's checks, provisioner/gate.py);
5. each node is resumed.

A failure stops the roll (an apply that raises ProvisionError is one too): the failing node
stays drained with the reason in Slurm (a failed gate check: the gate's reason, which
``provision resume`` will not lift without --force), and the nodes of later batches are not
touched; a node that could not be drained (the controller unreachable) is reported as such.

A signal (:class:`~provisioner.interrupts.Interrupted`, from any step) is not a failure: the
roll stops at once, touching nothing more (no reason is written: that would be a command to
the controller after the operator said stop), and the Interrupted it raises says where it
stopped and which nodes it leaves drained.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.drain import Drained
from provisioner.errors import ProvisionError
from provisioner.gate import Finding, failed_reason
from provisioner.interrupts import Interrupted
from provisioner.manifest.ranges import listed

REASON_PREFIX = "provision apply --rolling"


@dataclass(frozen=True)
class Steps:
    drain: Callable[[str], Drained]  # drain and wait for the node's jobs (bounded)
    apply: Callable[[list[str]], int]  # node-local plays with --limit these nodes: apply's exit code
    needs_reboot: Callable[[str], bool]
    reboot: Callable[[str], str]  # reboot and wait for SSH: "" when back, else why not
    verify: Callable[[str], list[Finding]]  # the node's failed checks (empty: it passed)
    resume: Callable[[str], Drained]
    leave_drained: Callable[[str, str], str]  # keep the node drained with this reason in Slurm: "" or why not


@dataclass(frozen=True)
class Event:
    node: str  # "" for the whole batch
    stage: str  # drain, apply, reboot, verify, resume
    ok: bool
    detail: str


@dataclass
class Roll:
    events: list[Event] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # rolled and resumed
    failed: str = ""  # the node (or batch) that stopped the roll
    untouched: list[str] = field(default_factory=list)  # later nodes the roll never reached
    left_drained: list[str] = field(default_factory=list)  # nodes now drained with the failure as the reason
    not_drained: dict[str, str] = field(default_factory=dict)  # nodes that could not be (left) drained, and why

    @property
    def ok(self) -> bool:
        return not self.failed


def batches(nodes: list[str], size: int) -> list[list[str]]:
    if size < 1:
        raise ValueError("a batch holds at least one node")
    return [nodes[i:i + size] for i in range(0, len(nodes), size)]


def stopped_by_signal(where: str, held: list[str]) -> str:
    """Where a signal stopped the roll and what it leaves (the detail of its Interrupted)."""
    if not held:
        return f"rolling stopped {where}"
    return (f"rolling stopped {where}; drained (or being drained) by this roll, not resumed: {listed(held)} "
            "(provision resume them once they are right)")


def roll(groups: list[list[str]], steps: Steps, allow_reboot: bool) -> Roll:
    """Roll ``groups`` a batch at a time (module docstring); a signal raises Interrupted."""
    result = Roll()
    at = {"where": ""}  # the step under way, for a signal's message
    held: list[str] = []  # drained (or being drained) by this roll, not resumed
    try:
        return _roll(groups, steps, allow_reboot, result, at, held)
    except Interrupted as exc:
        detail = stopped_by_signal(at["where"], held)
        raise Interrupted(exc.signum, f"{detail}; {exc.detail}" if exc.detail else detail) from None


def _roll(groups: list[list[str]], steps: Steps, allow_reboot: bool, result: Roll, at: dict[str, str],
          held: list[str]) -> Roll:

    def stop(index: int, node: str, stage: str, detail: str, drained: list[str], reason: str = "") -> Roll:
        """End the roll: every drained node of this batch not yet resumed stays drained,
        with the reason in Slurm (``reason``: the failed node's own, else the roll's); later
        batches are not touched."""
        result.events.append(Event(node, stage, False, detail))
        result.failed = node or ", ".join(drained)
        at["where"] = f"while leaving {listed(drained)} drained after the failed {stage}"
        for n in drained:
            if n in result.done:
                continue
            where = "" if n == node or not node else f" on {node}"
            own = reason if reason and n == node else f"{REASON_PREFIX}: {stage} failed{where}: {detail}"[:200]
            why = steps.leave_drained(n, own)
            if why:  # e.g. the controller is unreachable: nobody may say this node is drained
                result.not_drained[n] = why
            else:
                result.left_drained.append(n)
        result.untouched = [n for g in groups[index + 1:] for n in g]
        return result

    for i, group in enumerate(groups):
        drained: list[str] = []
        for node in group:
            at["where"] = f"while draining {node}"
            held.append(node)
            d = steps.drain(node)
            if not d.ok:
                return stop(i, node, "drain", d.detail, [*drained, node])
            result.events.append(Event(node, "drain", True, d.detail))
            drained.append(node)
        at["where"] = f"in the apply of {listed(group)}"
        try:
            rc = steps.apply(group)
        except Interrupted:
            raise
        except ProvisionError as exc:  # apply stopped before its recap (e.g. Ansible could not start)
            return stop(i, "", "apply", str(exc), drained)
        if rc != 0:
            return stop(i, "", "apply", f"apply exited {rc} (see its recap)", drained)
        result.events.append(Event("", "apply", True, f"node-local plays on {', '.join(group)}"))
        for node in group:
            at["where"] = f"while checking {node}"
            if steps.needs_reboot(node):
                if not allow_reboot:
                    result.events.append(Event(node, "reboot", True,
                                               "a reboot is pending; cluster.allow_reboot is false: not rebooted"))
                else:
                    why = steps.reboot(node)
                    if why:
                        return stop(i, node, "reboot", why, drained)
                    result.events.append(Event(node, "reboot", True, "rebooted"))
            failures = steps.verify(node)
            gated = [f for f in failures if f.gate]
            if gated:  # the gate's own reason on the node (the rest of the batch: the roll's)
                return stop(i, node, "gate", "; ".join(map(str, failures)), drained, failed_reason(gated))
            if failures:
                return stop(i, node, "verify", "; ".join(map(str, failures)), drained)
            result.events.append(Event(node, "verify", True, "passed"))
            at["where"] = f"while resuming {node}"
            r = steps.resume(node)
            if not r.ok:
                return stop(i, node, "resume", r.detail, drained)
            result.events.append(Event(node, "resume", True, r.detail))
            result.done.append(node)
            held.remove(node)
    return result
