"""provisioner.gate: the acceptance gate's decisions and its admission of new nodes, with fakes."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.drain import Drained
from provisioner.gate import (
    GATE_PREFIX,
    AdmitSteps,
    Finding,
    admit,
    failed_reason,
    findings,
    hold_reason,
    is_gate_reason,
    resume_refusal,
)
from provisioner.verify.run import Result

GATE = ["gpu.dcgm"]


def rows(*rows: tuple[str, str, str]) -> list[Result]:
    return [Result("gpu01", check, status, detail) for check, status, detail in rows]  # type: ignore[arg-type]


def test_findings_mark_the_gates_checks_and_hold_a_gpu_node_whose_gate_check_skipped() -> None:
    results = rows(("reach", "PASS", ""), ("clock", "FAIL", "offset 900 ms"),
                   ("gpu.dcgm", "FAIL", "level 1: software on GPU 0: Persistence mode for GPU 0 is disabled."))
    assert findings(results, GATE, has_gpus=True) == [
        Finding("clock", "offset 900 ms", gate=False),
        Finding("gpu.dcgm", "level 1: software on GPU 0: Persistence mode for GPU 0 is disabled.", gate=True)]
    skipped = rows(("reach", "PASS", ""), ("gpu.dcgm", "SKIP", "DCGM is not installed (no dcgmi)"))
    assert findings(skipped, GATE, has_gpus=True) == [
        Finding("gpu.dcgm", "did not run (DCGM is not installed (no dcgmi))", gate=True)]
    assert findings(skipped, GATE, has_gpus=False) == []  # a node without GPUs: its SKIP passes
    assert findings(skipped, [], has_gpus=True) == []  # no gate: a SKIP is no failure
    assert findings(rows(("mtu.data", "SKIP", "no kernel access")), GATE, has_gpus=True) == []


def test_reasons_are_ours_name_the_failing_check_and_fit_slurm() -> None:
    assert hold_reason(["gpu.dcgm", "gpu.burn"]) == "provision gate: awaiting gpu.dcgm, gpu.burn"
    one = failed_reason([Finding("gpu.dcgm", "level 2: pcie on GPU 1: Detected 423 PCIe replays", True)])
    assert one == "provision gate: gpu.dcgm failed: level 2: pcie on GPU 1: Detected 423 PCIe replays"
    long = failed_reason([Finding("gpu.burn", "x" * 500, True), Finding("gpu.dcgm", "y", True)])
    assert len(long) == 200 and long.startswith("provision gate: gpu.burn failed: xxx") and long.endswith(" (+1 more)")
    assert is_gate_reason(one) and is_gate_reason(hold_reason(GATE))
    assert not is_gate_reason("provision apply --rolling: verify failed: clock") and not is_gate_reason("")


def test_resume_refuses_only_the_gates_holds() -> None:
    refusal = resume_refusal("gpu01", "provision gate: gpu.dcgm failed: level 1: software")
    assert "gpu01 is held by the acceptance gate (provision gate: gpu.dcgm failed" in refusal
    assert "--force" in refusal and "apply --rolling --full --limit gpu01" in refusal
    assert resume_refusal("gpu01", "provision drain") == resume_refusal("gpu01", "") == ""


class Slurm:
    """A fake controller: per node its drain reason ("" when not drained), and the order of events."""

    def __init__(self, failing: dict[str, list[Finding]] | None = None, unreachable: bool = False,
                 refuse_reason: bool = False) -> None:
        self.failing = failing or {}
        self.unreachable = unreachable
        self.refuse_reason = refuse_reason
        self.reason: dict[str, str] = {}
        self.log: list[str] = []

    def steps(self) -> AdmitSteps:
        def hold(n: str, reason: str) -> Drained:
            self.log.append(f"hold {n}")
            if self.unreachable:
                return Drained(n, False, "scontrol on head01: ssh: connect to host 10.0.0.1 port 22: timed out")
            self.reason[n] = reason
            return Drained(n, True, "drained, no jobs")

        def check(n: str) -> list[Finding]:
            self.log.append(f"check {n}")
            assert self.reason[n] == hold_reason(GATE), "checked before it was held"
            return self.failing.get(n, [])

        def resume(n: str) -> Drained:
            self.log.append(f"resume {n}")
            self.reason[n] = ""
            return Drained(n, True, "resumed")

        def leave(n: str, reason: str) -> str:
            if self.refuse_reason:
                return "scontrol on head01: Access/permission denied"
            self.reason[n] = reason
            return ""

        return AdmitSteps(hold, check, resume, leave)


def test_admit_holds_each_node_checks_it_then_resumes_or_keeps_it_held() -> None:
    bad = Finding("gpu.dcgm", "level 1: software on GPU 1: Persistence mode for GPU 1 is disabled.", True)
    slurm = Slurm({"gpu02": [bad]})
    got = admit(["gpu01", "gpu02"], GATE, slurm.steps())
    assert slurm.log == ["hold gpu01", "check gpu01", "resume gpu01", "hold gpu02", "check gpu02"]
    assert [(a.node, a.verdict) for a in got] == [("gpu01", "resumed"), ("gpu02", "held")]
    assert slurm.reason == {"gpu01": "", "gpu02": failed_reason([bad])}
    assert got[1].detail == f"{GATE_PREFIX}: gpu.dcgm failed: {bad.detail}"
    assert got[0].detail == "passed gpu.dcgm; resumed"


def test_admit_without_a_controller_gates_nothing_and_says_so() -> None:
    slurm = Slurm(unreachable=True)
    (got,) = admit(["gpu01"], GATE, slurm.steps())
    assert (got.verdict, slurm.log) == ("not gated", ["hold gpu01"])
    assert "timed out" in got.detail


@pytest.mark.parametrize("refuse", [True, False])
def test_a_reason_that_cannot_be_set_keeps_the_hold(refuse: bool) -> None:
    slurm = Slurm({"gpu01": [Finding("reach", "unreachable", False)]}, refuse_reason=refuse)
    (got,) = admit(["gpu01"], GATE, slurm.steps())
    assert got.verdict == "held" and "resume gpu01" not in slurm.log
    held_as = hold_reason(GATE) if refuse else "provision gate: reach failed: unreachable"
    assert slurm.reason["gpu01"] == held_as
    assert ("the failure could not be set" in got.detail) is refuse


def test_gate_in_the_manifest_is_checked(kit: Any) -> None:
    data = kit.base()
    data["verify"] = {"gate": ["gpu.burn", "gpu.burn"]}
    messages = [d.message for d in kit.errors(data)]
    assert "gpu.burn is named twice" in messages
    assert "gpu.burn runs only with verify.burn_in_s > 0 (its seconds)" in messages
    data["verify"] = {"gate": ["gpu.dcgm"]}
    data["slurm"] = {"enabled": False}
    (diag,) = kit.errors(data)
    assert diag.path == "verify.gate" and diag.line > 0 and "slurm.enabled is false" in diag.message
    data["verify"] = {"gate": ["nccl.multi_node"]}
    assert any(d.path.startswith("verify.gate") for d in kit.errors(data))
    data = kit.base()
    data["verify"] = {"gate": ["gpu.dcgm", "gpu.burn"], "burn_in_s": 60}
    assert kit.load(data).manifest.verify.gate == ["gpu.dcgm", "gpu.burn"]
