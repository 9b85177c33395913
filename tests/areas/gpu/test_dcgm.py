"""provisioner.areas.gpu.dcgm: the gpu.dcgm check (``dcgmi diag -r N -j``), its JSON read per
test and per GPU, its verdicts and where it applies.

The ``recorded/dcgmi-diag-*.json`` outputs follow DCGM's own writer and schema (NVIDIA/DCGM
``dcgmi/Diag.cpp``, ``testing/python3/dcgm_diag_schema.json``: DCGM 4.x, and 3.x's older form
with ``gpu_ids``) with the error texts of ``dcgm_errors.h``; no GPU machine with DCGM was at
hand to record them from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.gpu import dcgm
from provisioner.nodecheck.check import Check, Outcome, Output
from provisioner.nodecheck.parsers import ParseError
from provisioner.verify import catalog

RECORDED = Path(__file__).parent / "recorded"


def read(name: str) -> str:
    return (RECORDED / name).read_text()


def by_name(checks: list[Check], node: str, name: str) -> Check:
    (found,) = [c for c in checks if c.node == node and c.name == name]
    return found


def judge(text: str, level: int = 1, rc: int = 0, stderr: str = "") -> tuple[str, str]:
    o = dcgm.diag_judge(level)(Output(rc=rc, stdout=text, stderr=stderr))
    return o.status, o.detail


def test_dcgm4_pass_is_read_per_test_and_gpu() -> None:
    d = dcgm.parse_diag(read("dcgmi-diag-r1-pass.json"))
    assert d.version == "4.2.3" and d.runtime_error == ""
    (t,) = d.tests
    assert (t.category, t.name, t.status) == ("Deployment", "software", "pass")
    assert [(r.gpu, r.status) for r in t.results] == [(0, "pass"), (1, "pass")]
    assert judge(read("dcgmi-diag-r1-pass.json")) == ("PASS", "level 1: 1 tests passed (software)")


def test_dcgm4_failure_names_the_test_the_gpu_and_dcgms_words() -> None:
    text = read("dcgmi-diag-r2-fail.json")
    d = dcgm.parse_diag(text)
    assert [(t.name, t.status) for t in d.tests] == [("software", "pass"), ("pcie", "fail"), ("memory", "pass")]
    # dcgmi exits non-zero when a test fails; the JSON says which
    assert judge(text, level=2, rc=226) == (
        "FAIL", "level 2: pcie on GPU 1: Detected 423 PCIe replays for GPU 1 which is above the threshold 250")


def test_dcgm3_form_with_gpu_ids_is_read_too() -> None:
    d = dcgm.parse_diag(read("dcgmi-diag-r1-dcgm3-persistence.json"))
    assert d.version == "3.3.9" and len(d.tests) == 9
    persistence = next(t for t in d.tests if t.name == "Persistence Mode")
    assert persistence.status == "fail" and persistence.results[0].gpu == -1  # one result for GPUs "0,1"
    status, detail = judge(read("dcgmi-diag-r1-dcgm3-persistence.json"))
    assert status == "FAIL" and detail.startswith("level 1: Persistence Mode: Persistence mode for GPU 0 is disabled")


def test_runtime_error_fails_with_dcgms_reason() -> None:
    status, detail = judge(read("dcgmi-diag-runtime-error.json"))
    assert status == "FAIL" and "could not run the diagnostic: Error: GPU 0 is running" in detail


def test_a_failure_only_in_the_summary_is_reported() -> None:
    # DCGM 4 puts an error of no particular GPU in the test's summary only
    text = ('{"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [{"name": "software", '
            '"results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Fail"}], '
            '"test_summary": {"status": "Fail", "warnings": [{"warning": "Fabric Manager is not running", '
            '"error_id": 1, "error_category": 0, "error_severity": 1}]}}]}]}}')
    assert judge(text) == ("FAIL", "level 1: software: Fabric Manager is not running")


def test_warn_passes_named_and_all_skipped_skips() -> None:
    def one(status: str) -> str:
        return ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory", '
                f'"results": [{{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "{status}"}}], '
                f'"test_summary": {{"status": "{status}"}}}}]}}]}}}}')
    assert judge(one("Warn")) == ("PASS", "level 1: 1 tests passed (memory) (warnings: memory)")
    assert judge(one("Skip")) == ("SKIP", "level 1: DCGM skipped every test")
    assert judge('{"DCGM Diagnostic": {"test_categories": []}}') == ("FAIL", "level 1: dcgmi ran no test")


@pytest.mark.parametrize("text, message", [
    ("Error: unable to establish a connection to the specified host: localhost\n", "not dcgmi's JSON: Error: unable"),
    ("", "not dcgmi's JSON: no output"),
    ('{"something": {}}', "no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' object"),
    ('{"DCGM Diagnostic": {"test_categories": [{"category": "x", "tests": [{"name": "software", '
     '"results": [{"status": "Maybe"}]}]}]}}', "unknown test status 'Maybe'"),
])
def test_unreadable_output_fails_with_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message.replace("(", r"\(")):
        dcgm.parse_diag(text)
    status, detail = judge(text, rc=1, stderr="host engine down")
    assert status == "FAIL" and detail.endswith("(host engine down)")


def test_missing_dcgm_or_gpu_says_skip_and_why() -> None:
    assert judge("provision-skip: DCGM is not installed (no dcgmi)\n") == ("SKIP", "DCGM is not installed (no dcgmi)")
    assert judge("provision-skip: no GPU device (/dev/nvidiaN)\n") == ("SKIP", "no GPU device (/dev/nvidiaN)")
    assert dcgm.diag_judge(1)(Output(error="timed out after 180 s")) == Outcome("FAIL", "timed out after 180 s")
    text = dcgm.diag_command(2)
    assert text.index("command -v dcgmi") < text.index("/dev/nvidia[0-9]") < text.index("dcgmi diag -r 2 -j")


def test_planned_on_gpu_nodes_at_the_manifests_level_with_its_bound(kit: Any) -> None:
    m = kit.load(kit.base()).manifest
    check = by_name(catalog.plan(m), "node01", "gpu.dcgm")
    assert check.needs == "gpu" and check.command is not None
    assert "dcgmi diag -r 1 -j" in check.command.text and check.command.timeout == 180
    assert not [c for c in catalog.plan(m) if c.node == "head01" and c.name == "gpu.dcgm"]
    data = kit.base()
    data["verify"] = {"dcgm_level": 3}
    check = by_name(catalog.plan(kit.load(data).manifest), "node01", "gpu.dcgm")
    assert check.command is not None and "dcgmi diag -r 3 -j" in check.command.text
    assert check.command.timeout == dcgm.LEVEL_BOUND_S[3] == 2700


def test_level_is_one_to_four(kit: Any) -> None:
    data = kit.base()
    data["verify"] = {"dcgm_level": 5}
    (diag,) = [d for d in kit.errors(data) if d.path == "verify.dcgm_level"]
    assert diag.line > 0 and "4" in diag.message
