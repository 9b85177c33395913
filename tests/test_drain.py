"""provisioner.drain: drain (waiting for jobs, bounded) and resume with a fake controller."""

from __future__ import annotations

from provisioner.drain import Drained, drain_node, parse_jobs, resume_node
from provisioner.nodecheck.check import Output

REASON = "provision remove"


class Controller:
    """scontrol/squeue on a fake head: jobs end after ``jobs_for`` looks."""

    def __init__(self, known: bool = True, jobs_for: int = 0, fail_drain: bool = False) -> None:
        self.known, self.jobs_for, self.fail_drain = known, jobs_for, fail_drain
        self.calls: list[str] = []

    def __call__(self, host: str, text: str, timeout: int) -> Output:
        assert host == "head01" and timeout == 15
        self.calls.append(text)
        if text.startswith("scontrol show node"):
            return Output(stdout="NodeName=node09 State=IDLE") if self.known else Output(
                rc=1, stdout="Node node09 not found\n")
        if text.startswith("scontrol update") and "RESUME" in text:
            return Output(rc=1, stderr="slurm_update error: Invalid node state transition requested") \
                if self.known is False else Output()
        if text.startswith("scontrol update"):
            return Output(rc=1, stderr="slurm_update error: Invalid node name specified") if self.fail_drain \
                else Output()
        assert text.startswith("squeue")
        self.jobs_for -= 1
        return Output(stdout="4711\n4712\n" if self.jobs_for >= 0 else "")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_drain_waits_for_jobs() -> None:
    ctl, clock = Controller(jobs_for=2), Clock()
    result = drain_node("head01", "node09", ctl, 60, REASON, clock.sleep, clock)
    assert result.ok and result.detail == "drained, no jobs"
    assert ctl.calls[1] == "scontrol update NodeName=node09 State=DRAIN Reason='provision remove'"
    assert ctl.calls.count("squeue --noheader --nodelist=node09 --format=%i") == 3 and clock.now == 10


def test_drain_timeout_never_kills_jobs() -> None:
    ctl, clock = Controller(jobs_for=100), Clock()
    result = drain_node("head01", "node09", ctl, 12, REASON, clock.sleep, clock)
    assert not result.ok and result.detail.startswith("still running jobs 4711, 4712 after 12 s")
    assert not any("cancel" in c or "DOWN" in c for c in ctl.calls)


def test_a_node_slurm_does_not_know_needs_no_drain_and_errors_stop() -> None:
    clock = Clock()
    assert drain_node("head01", "node09", Controller(known=False), 60, REASON, clock.sleep, clock).detail == (
        "not in Slurm: nothing to drain")
    failed = drain_node("head01", "node09", Controller(fail_drain=True), 60, REASON, clock.sleep,
                        clock)
    assert not failed.ok and "Invalid node name" in failed.detail
    down = drain_node("head01", "node09", lambda h, t, s: Output(rc=-1, error="timed out after 15 s on head01"),
                      60, REASON, clock.sleep, clock)
    assert not down.ok and down.detail == "scontrol on head01: timed out after 15 s on head01"


def test_parse_jobs() -> None:
    assert parse_jobs("  12\n13\n\n") == ["12", "13"]


def test_resume() -> None:
    ctl = Controller()
    assert resume_node("head01", "node09", ctl) == Drained("node09", True, "resumed")
    assert ctl.calls == ["scontrol update NodeName=node09 State=RESUME"]
    assert resume_node("head01", "node09", Controller(known=False)).detail == "not drained: left as it is"
    down = resume_node("head01", "node09", lambda h, t, s: Output(rc=-1, error="ssh: Connection refused"))
    assert not down.ok and down.detail == "resume on head01: ssh: Connection refused"


def test_drain_without_waiting_leaves_jobs_running() -> None:
    ctl, clock = Controller(jobs_for=5), Clock()
    result = drain_node("head01", "node09", ctl, 0, "maintenance", clock.sleep, clock)
    assert result.ok and result.detail == "drained; jobs 4711, 4712 run on (not waited for)" and clock.now == 0
    assert ctl.calls[1] == "scontrol update NodeName=node09 State=DRAIN Reason=maintenance"
