"""The GPU area's DCGM diagnostic (``gpu.dcgm``): ``dcgmi diag -r LEVEL -j`` on the node, its
JSON read per test and per GPU, and judged.

The JSON is DCGM's stable form (``dcgmi/Diag.cpp``, ``testing/python3/dcgm_diag_schema.json``
in NVIDIA/DCGM): DCGM 4 writes ``{"DCGM Diagnostic": {"test_categories": [{"category",
"tests": [{"name", "results": [{"entity_group", "entity_id", "status", "warnings": [{"warning",
"error_id"}]}], "test_summary": {"status"}}]}]}}`` and, when the diagnostic could not run,
``{"DCGM Diagnostic": {"version", "runtime_error"}}``; DCGM 3 wrote the same under ``"DCGM GPU
Diagnostic"`` with ``gpu_ids`` in place of the entity and no summary. Both are read. A status
is ``Pass``, ``Skip``, ``Warn``, ``Fail`` (case as DCGM 3 or 4 spells it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from provisioner.nodecheck.check import Judge, Outcome, Output, stderr_hint
from provisioner.nodecheck.parsers import ParseError

# NVIDIA's guide to the levels: 1 takes seconds (deployment readiness), 2 under two minutes
# (after a failed job), 3 about half an hour and 4 one to two hours (acceptance). The bound
# of the check's command per level, seconds, with room for a slow node.
LEVEL_BOUND_S: dict[int, int] = {1: 180, 2: 600, 3: 2700, 4: 9000}
SKIP_MARK = "provision-skip: "  # what the command prints where the diagnostic cannot run
ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # DCGM 4, DCGM 3
FAILED = ("fail",)
ORDER = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}


@dataclass(frozen=True)
class DiagResult:
    """One test's result on one GPU (``gpu`` -1: the test as a whole, DCGM 4's summary or an
    entity that is no GPU)."""

    gpu: int
    status: str  # pass, skip, warn, fail (lower case)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagTest:
    category: str
    name: str
    status: str  # the test's own: its summary, else the worst of its results
    results: tuple[DiagResult, ...]


@dataclass(frozen=True)
class Diag:
    tests: tuple[DiagTest, ...]
    runtime_error: str = ""
    version: str = ""


def diag_command(level: int) -> str:
    """``dcgmi diag`` at ``level``, or a SKIP line where DCGM or a GPU device is missing."""
    return (f"if ! command -v dcgmi >/dev/null 2>&1; then echo '{SKIP_MARK}DCGM is not installed (no dcgmi)'; "
            f"elif ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then echo '{SKIP_MARK}no GPU device (/dev/nvidiaN)'; "
            f"else dcgmi diag -r {int(level)} -j; fi")


def _status(value: object) -> str:
    s = str(value or "").strip().lower()
    if s not in ORDER:
        raise ParseError(f"unknown test status {value!r}")
    return s


def _gpu(entry: dict[str, Any]) -> int:
    if "entity_id" in entry:  # DCGM 4
        return int(entry["entity_id"]) if str(entry.get("entity_group", "GPU")).upper() == "GPU" else -1
    ids = str(entry.get("gpu_ids", "")).strip()  # DCGM 3: "0" or "0,1,2,3" (one result for all)
    return int(ids) if ids.isdigit() else -1


def _result(entry: object) -> DiagResult:
    if not isinstance(entry, dict):
        raise ParseError(f"a test result is not an object: {entry!r}")
    warnings = tuple(str(w.get("warning", "")).strip() if isinstance(w, dict) else str(w).strip()
                     for w in entry.get("warnings", []) or [])
    return DiagResult(_gpu(entry), _status(entry.get("status")), tuple(w for w in warnings if w))


def _worst(statuses: list[str]) -> str:
    return max(statuses, key=ORDER.__getitem__) if statuses else "skip"


def _test(category: str, entry: object) -> DiagTest:
    if not isinstance(entry, dict) or "name" not in entry:
        raise ParseError(f"a test of {category!r} has no name")
    results = tuple(_result(r) for r in entry.get("results", []) or [])
    summary = entry.get("test_summary")
    if isinstance(summary, dict) and summary.get("status"):
        status = _status(summary["status"])
        # the summary's warnings are the test's, for every GPU (DCGM 4 adds them there)
        if status in FAILED and not any(r.warnings for r in results):
            results += (_result({**summary, "entity_id": -1, "entity_group": "NONE"}),)
    else:
        status = _worst([r.status for r in results])
    return DiagTest(category, str(entry["name"]), status, results)


def parse_diag(text: str) -> Diag:
    """``dcgmi diag -r N -j`` (DCGM 3 or 4)."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        line = next((x.strip() for x in text.splitlines() if x.strip()), "no output")
        raise ParseError(f"not dcgmi's JSON: {line[:200]}")
    root = next((data[k] for k in ROOTS if isinstance(data.get(k), dict)), None)
    if root is None:
        raise ParseError(f"no {' or '.join(repr(k) for k in ROOTS)} object in dcgmi's JSON")
    version = str((data.get("metadata") or {}).get("version") or root.get("version") or "")
    tests = tuple(_test(str(cat.get("category", "")), t)
                  for cat in root.get("test_categories", []) or [] if isinstance(cat, dict)
                  for t in cat.get("tests", []) or [])
    return Diag(tests, str(root.get("runtime_error", "") or "").strip(), version)


def _where(r: DiagResult) -> str:
    return f" on GPU {r.gpu}" if r.gpu >= 0 else ""


def _failure(t: DiagTest) -> str:
    bad = [r for r in t.results if r.status in FAILED] or list(t.results)
    warned = [f"{t.name}{_where(r)}: {r.warnings[0]}" for r in bad if r.warnings]
    if warned:
        return "; ".join(warned)
    gpus = sorted({r.gpu for r in bad if r.gpu >= 0})
    return f"{t.name} failed" + (f" on GPU {', '.join(map(str, gpus))}" if gpus else "")


def diag_verdict(level: int) -> Callable[[Diag], Outcome]:
    """Every test DCGM ran at ``level`` passed (a warning passes, named); a runtime error, a
    failed test or no test at all fails; every test skipped says SKIP."""
    def verdict(d: Diag) -> Outcome:
        if d.runtime_error:
            return Outcome("FAIL", f"level {level}: dcgmi could not run the diagnostic: {d.runtime_error}")
        if not d.tests:
            return Outcome("FAIL", f"level {level}: dcgmi ran no test")
        failed = [t for t in d.tests if t.status in FAILED]
        if failed:
            return Outcome("FAIL", f"level {level}: " + "; ".join(_failure(t) for t in failed))
        ran = [t.name for t in d.tests if t.status != "skip"]
        if not ran:
            return Outcome("SKIP", f"level {level}: DCGM skipped every test")
        warned = [t.name for t in d.tests if t.status == "warn"]
        note = f" (warnings: {', '.join(warned)})" if warned else ""
        skipped = len(d.tests) - len(ran)
        more = f", {skipped} skipped" if skipped else ""
        return Outcome("PASS", f"level {level}: {len(ran)} tests passed ({', '.join(ran)}){more}{note}")
    return verdict


def diag_judge(level: int) -> Judge:
    """SKIP where the command said DCGM or a GPU is missing; else dcgmi's JSON judged (dcgmi
    exits non-zero when a test fails: the JSON says which)."""
    verdict = diag_verdict(level)

    def judge(out: Output) -> Outcome:
        if out.error:
            return Outcome("FAIL", out.error)
        first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        if first.startswith(SKIP_MARK):
            return Outcome("SKIP", first.removeprefix(SKIP_MARK))
        try:
            return verdict(parse_diag(out.stdout))
        except ParseError as exc:
            return Outcome("FAIL", f"{exc}{stderr_hint(out)}")
    return judge


def bound(level: int, command_timeout: int) -> int:
    return max(command_timeout, LEVEL_BOUND_S[level])
