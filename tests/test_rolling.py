"""provisioner.rolling: the roll's state machine with fake steps."""

from __future__ import annotations

import signal

import pytest

from provisioner.drain import Drained
from provisioner.errors import ProvisionError
from provisioner.gate import Finding
from provisioner.interrupts import Interrupted
from provisioner.rolling import Steps, batches, roll


class Cluster:
    """Fake steps recording what happened, in order; ``fail`` picks a (stage, node) to fail."""

    def __init__(self, fail: tuple[str, str] = ("", ""), reboot: frozenset[str] = frozenset()) -> None:
        self.fail = fail
        self.pending_reboot = set(reboot)
        self.log: list[str] = []
        self.reasons: dict[str, str] = {}
        self.drained: set[str] = set()

    def _bad(self, stage: str, node: str) -> bool:
        return self.fail == (stage, node)

    def steps(self) -> Steps:
        def drain(n: str) -> Drained:
            self.log.append(f"drain {n}")
            if self._bad("drain", n):
                return Drained(n, False, "still running jobs 7 after 60 s; the node stays drained (no job was killed)")
            self.drained.add(n)
            return Drained(n, True, "drained, no jobs")

        def apply(nodes: list[str]) -> int:
            self.log.append(f"apply {','.join(nodes)}")
            assert all(n in self.drained for n in nodes), "apply before drain"
            if any(self._bad("raise", n) for n in nodes):
                raise ProvisionError("ansible-playbook failed (rc 4): YAML parsing failed")
            if any(self._bad("signal", n) for n in nodes):
                raise Interrupted(signal.SIGTERM, "recorded as run r1")
            return 2 if any(self._bad("apply", n) for n in nodes) else 0

        def reboot(n: str) -> str:
            self.log.append(f"reboot {n}")
            self.pending_reboot.discard(n)
            return "no SSH after 900 s" if self._bad("reboot", n) else ""

        def verify(n: str) -> list[Finding]:
            self.log.append(f"verify {n}")
            if self._bad("signal verify", n):
                raise Interrupted(signal.SIGINT)
            if self._bad("gate", n):  # a check of the acceptance gate failed, and one that is not
                return [Finding("clock", "offset 900 ms"),
                        Finding("gpu.dcgm", "level 1: software on GPU 0: Persistence mode for GPU 0 is disabled.",
                                gate=True)]
            return [Finding("gpu.count", "1 GPUs seen, manifest says 2")] if self._bad("verify", n) else []

        def resume(n: str) -> Drained:
            self.log.append(f"resume {n}")
            self.drained.discard(n)
            return Drained(n, True, "resumed")

        def leave(n: str, reason: str) -> str:
            self.reasons[n] = reason
            return ""

        return Steps(drain, apply, lambda n: n in self.pending_reboot, reboot, verify, resume, leave)


def test_batches() -> None:
    assert batches(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    assert batches(["a", "b"], 1) == [["a"], ["b"]]
    with pytest.raises(ValueError):
        batches(["a"], 0)


def test_one_at_a_time_all_resumed() -> None:
    c = Cluster(reboot=frozenset({"b"}))
    r = roll(batches(["a", "b"], 1), c.steps(), allow_reboot=True)
    assert r.ok and r.done == ["a", "b"] and r.untouched == []
    assert c.log == ["drain a", "apply a", "verify a", "resume a", "drain b", "apply b", "reboot b", "verify b",
                     "resume b"]
    assert c.drained == set() and c.reasons == {}


def test_a_batch_of_two_is_drained_together() -> None:
    c = Cluster()
    r = roll(batches(["a", "b", "c"], 2), c.steps(), allow_reboot=False)
    assert r.ok and c.log[:3] == ["drain a", "drain b", "apply a,b"]


def test_a_failed_verify_stops_the_roll_and_leaves_the_node_drained_with_the_reason() -> None:
    c = Cluster(fail=("verify", "b"))
    r = roll(batches(["a", "b", "c"], 1), c.steps(), allow_reboot=True)
    assert not r.ok and r.failed == "b" and r.done == ["a"] and r.untouched == ["c"]
    assert "drain c" not in c.log and "resume b" not in c.log
    assert c.drained == {"b"}
    assert c.reasons == {"b": "provision apply --rolling: verify failed: gpu.count: 1 GPUs seen, manifest says 2"}


def test_a_failed_apply_leaves_the_whole_batch_drained() -> None:
    c = Cluster(fail=("apply", "a"))
    r = roll(batches(["a", "b", "c"], 2), c.steps(), allow_reboot=True)
    assert not r.ok and r.failed == "a, b" and r.untouched == ["c"]
    assert set(c.reasons) == {"a", "b"} and c.reasons["a"].startswith("provision apply --rolling: apply failed")
    assert not any(line.startswith(("verify", "resume")) for line in c.log)


def test_a_drain_that_times_out_stops_before_any_change() -> None:
    c = Cluster(fail=("drain", "a"))
    r = roll(batches(["a", "b"], 1), c.steps(), allow_reboot=True)
    assert not r.ok and c.log == ["drain a"] and r.untouched == ["b"]
    assert "drain failed: still running jobs 7" in c.reasons["a"]


def test_reboot_only_when_allowed() -> None:
    c = Cluster(reboot=frozenset({"a"}))
    r = roll([["a"]], c.steps(), allow_reboot=False)
    assert r.ok and "reboot a" not in c.log
    assert any(e.stage == "reboot" and "allow_reboot is false" in e.detail for e in r.events)
    failed = Cluster(fail=("reboot", "a"), reboot=frozenset({"a"}))
    r = roll([["a"], ["b"]], failed.steps(), allow_reboot=True)
    assert not r.ok and failed.reasons["a"] == "provision apply --rolling: reboot failed: no SSH after 900 s"
    assert "verify a" not in failed.log


def test_in_a_batch_a_later_failure_keeps_the_unresumed_nodes_drained() -> None:
    c = Cluster(fail=("verify", "b"))
    r = roll([["a", "b", "c"]], c.steps(), allow_reboot=True)
    assert r.done == ["a"] and set(c.reasons) == {"b", "c"}
    assert c.reasons["c"].startswith("provision apply --rolling: verify failed on b:")


def test_an_apply_that_raises_stops_the_roll_like_a_failed_one() -> None:
    """apply can stop with an error before any recap (Ansible could not read the inventory):
    the roll stops there, its batch left drained with that error as the reason."""
    c = Cluster(fail=("raise", "a"))
    r = roll(batches(["a", "b"], 1), c.steps(), allow_reboot=True)
    assert not r.ok and r.failed == "a" and r.untouched == ["b"]
    assert c.log == ["drain a", "apply a"]
    assert c.reasons == {"a": "provision apply --rolling: apply failed: ansible-playbook failed (rc 4): YAML parsing "
                              "failed"}
    assert [(e.stage, e.ok) for e in r.events] == [("drain", True), ("apply", False)]


def test_a_failed_gate_check_leaves_the_node_drained_with_the_gates_reason() -> None:
    """The node whose gate check failed gets the gate's reason (provision resume will not lift
    it without --force); the rest of its batch keeps the roll's reason."""
    c = Cluster(fail=("gate", "b"))
    r = roll([["a"], ["b", "c"], ["d"]], c.steps(), allow_reboot=True)
    assert not r.ok and r.failed == "b" and r.done == ["a"] and r.untouched == ["d"]
    assert c.reasons["b"] == ("provision gate: gpu.dcgm failed: level 1: software on GPU 0: Persistence mode for "
                              "GPU 0 is disabled.")
    assert c.reasons["c"].startswith("provision apply --rolling: gate failed on b: clock: offset 900 ms; gpu.dcgm")
    assert [(e.node, e.stage, e.ok) for e in r.events][-1] == ("b", "gate", False)


def test_a_signal_in_the_apply_is_no_failed_apply_it_stops_the_roll_at_once() -> None:
    """Interrupted is a ProvisionError, and the roll took a signal in the batch's apply for a
    failed apply: it went on to a drain on the controller after the operator said stop, and
    the command exited 1 instead of 128 + the signal. Now nothing more runs, and the
    Interrupted names where the roll stopped and the nodes it leaves drained."""
    c = Cluster(fail=("signal", "b"))
    with pytest.raises(Interrupted) as info:
        roll([["a"], ["b", "c"], ["d"]], c.steps(), allow_reboot=True)
    assert c.log == ["drain a", "apply a", "verify a", "resume a", "drain b", "drain c", "apply b,c"]
    assert c.reasons == {}
    assert info.value.exit_code == 143
    assert str(info.value) == ("interrupted by SIGTERM: rolling stopped in the apply of b, c; drained (or being "
                               "drained) by this roll, not resumed: b, c (provision resume them once they are "
                               "right); recorded as run r1")


def test_a_signal_while_checking_a_node_names_only_the_unresumed_ones() -> None:
    c = Cluster(fail=("signal verify", "b"))
    with pytest.raises(Interrupted) as info:
        roll([["a", "b", "c"]], c.steps(), allow_reboot=True)
    assert c.log[-1] == "verify b" and c.reasons == {}
    assert str(info.value) == ("interrupted (Ctrl-C): rolling stopped while checking b; drained (or being drained) "
                               "by this roll, not resumed: b, c (provision resume them once they are right)")
