"""The usage report's parsers and arithmetic (provisioner/areas/monitoring/usage.py), against
numbers computed by hand from data/usage/ (its README describes the jobs), gaps and partial
data included; then the same numbers from a real Prometheus loaded with the raw DCGM and
nvidia-smi series (``promtool tsdb create-blocks-from openmetrics``) and asked over HTTP.

The hand computation, T0 = 1700000040, window T0 .. T0 + 7200 s, step 60 s (the manifest's
scrape interval); a point at t stands for the step (t - 60, t]:

* 101 alice/ml, gpu01 (A100, 2.00 per GPU-h), 2 GPUs, T0 .. T0+3600: DCGM series, GPU 0 at
  100 %, GPU 1 at 50 %, 300 W and 200 W. Held 2 GPU-h, measured 2, used 1 + 0.5 = 1.5,
  energy 0.5 kWh, cost 4.00.
* 102 bob/ml, gpu02 (L40S: 8766 over 1 year = 1.00 per GPU-h, power 0.50 per kWh), 4 GPUs,
  T0+1800 .. T0+5400: nvidia-smi series for two of its GPUs only, 0 % and 100 W, with no
  sample from T0+2390 to T0+3530: Prometheus' 5 minute look-back fills the points up to
  T0+2580, so points T0+2640 .. T0+3540 (16) are missing. Per series 60 - 16 = 44 points =
  2640 s; held 4 GPU-h, measured 5280 s = 1.4667, used 0, unmeasured 2.5333, energy
  2 x 100 W x 2640 s = 0.14667 kWh, cost 4 x 1.00 + 0.14667 x 0.5 = 4.07333.
* 103 carol/vision, gpu01, 1 GPU, T0-1800 .. T0+600: held 600 s in the window = 0.16667
  GPU-h, no series at all, cost 0.33333.
* 104 (array task 99_3) alice/vision, gpu01, 1 GPU, T0+6000, still running (the window ends
  at T0+7200): nvidia-smi series at 25 %, no power. Held 1200 s = 0.33333, used 300 s =
  0.08333, cost 0.66667.
* 105 (no GPU), 106 (pending), 107 (ended before the window): not in the report.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.areas.monitoring import usage, usage_render
from provisioner.areas.monitoring import usage_sources as sources
from provisioner.areas.monitoring.usage_sources import Job, Series, Window
from provisioner.errors import ManifestError, ProvisionError
from provisioner.manifest import Manifest
from provisioner.prometheus import query_range
from provisioner.validate import load_manifest

HERE = Path(__file__).parent
DATA = HERE / "data" / "usage"
ROOT = HERE.parents[2]
T0 = 1_700_000_040
WIN = Window(T0, T0 + 7200)
STEP = 60.0
MISSING_102 = range(44, 60)  # points T0 + 60 k with no value (the gap)

# Hand-computed (module docstring), by user: allocated, measured, used, unmeasured GPU-h,
# idle share, kWh, cost
EXPECTED_BY_USER = {
    "bob": (4.0, 1.466667, 0.0, 2.533333, 1.0, 0.146667, 4.073333),
    "alice": (2.333333, 2.333333, 1.583333, 0.0, 1 - 5700 / 8400, 0.5, 4.666667),
    "carol": (0.166667, 0.0, 0.0, 0.166667, None, 0.0, 0.333333),
}
EXPECTED_TOTAL = (6.5, 3.8, 1.583333, 2.7, 7 / 12, 0.646667, 9.073333)


@pytest.fixture(scope="module")
def m() -> Manifest:
    return load_manifest(DATA / "cluster.yaml").manifest


def sacct_text() -> str:
    return (DATA / "sacct.txt").read_text()


def points(job: str, node: str, gpu: str, ks: Iterator[int] | range, value: float) -> Series:
    return Series(job, node, gpu, tuple((T0 + 60.0 * k, value) for k in ks))


def hand_series() -> tuple[list[Series], list[Series]]:
    """The points Prometheus answers for the raw series (the docstring's jobs)."""
    k102 = [k for k in range(31, 91) if k not in MISSING_102]
    util = [points("101", "gpu01", "0", range(1, 61), 1.0), points("101", "gpu01", "1", range(1, 61), 0.5),
            points("102", "gpu02", "0", iter(k102), 0.0), points("102", "gpu02", "1", iter(k102), 0.0),
            points("104", "gpu01", "1", range(101, 121), 0.25)]
    power = [points("101", "gpu01", "0", range(1, 61), 300.0), points("101", "gpu01", "1", range(1, 61), 200.0),
             points("102", "gpu02", "0", iter(k102), 100.0), points("102", "gpu02", "1", iter(k102), 100.0)]
    return util, power


def as_tuple(row: usage.Row) -> tuple[float | None, ...]:
    return (row.allocated_h, row.measured_h, row.used_h, row.unmeasured_h, row.idle_share, row.energy_kwh, row.cost)


def assert_hand_computed(report: usage.Report) -> None:
    assert [r.key for r in report.rows] == ["bob", "alice", "carol"]  # most GPU-hours first
    for row in report.rows:
        assert as_tuple(row) == pytest.approx(EXPECTED_BY_USER[row.key], abs=1e-5), row.key
    assert as_tuple(report.total) == pytest.approx(EXPECTED_TOTAL, abs=1e-5)
    assert report.total.jobs == 4 and [r.jobs for r in report.rows] == [1, 2, 1]
    assert report.capacity_h == pytest.approx(12.0)  # 6 GPUs x 2 h
    assert [(i.job_id, i.user, i.gpus) for i in report.top_idle] == [("102", "bob", 4), ("101", "alice", 2),
                                                                      ("99_3", "alice", 1)]
    assert [x for i in report.top_idle for x in (i.held_h, i.mean_utilization, i.idle_gpu_h)] == pytest.approx(
        [1.0, 0.0, 1.466667, 1.0, 0.75, 0.5, 0.333333, 0.25, 0.25], abs=1e-5)
    assert report.notes == (
        "1 job (0.17 GPU-h) has no GPU series in Prometheus: used GPU-hours and energy unknown (103)",
        "1 job has gaps in GPU series: 2.53 GPU-h of theirs unmeasured (102)",
        "1 job has no GPU power series: energy unknown (99_3)",
    )


# --------------------------------------------------------------------------- sacct
def test_sacct_lines_become_the_jobs_that_held_gpus() -> None:
    jobs, problems = sources.parse_sacct(sacct_text())
    assert problems == []
    assert [j.job_id for j in jobs] == ["101", "102", "103", "104", "107"]  # 105: no GPU, 106: never started
    by_id = {j.job_id: j for j in jobs}
    assert by_id["101"] == Job("101", "101", "alice", "ml", "gpu", ("gpu01",), 2, 1700000040.0, 1700003640.0,
                               "COMPLETED")
    assert (by_id["104"].shown_id, by_id["104"].gpus, by_id["104"].end) == ("99_3", 1, None)  # typed gres only
    assert by_id["103"].state == "CANCELLED"
    assert by_id["107"].nodes == ("gpu01", "gpu02")


def test_sacct_lines_it_cannot_read_are_named_with_their_line() -> None:
    text = ("101|101|alice|ml|gpu|gpu01|gres/gpu=2|1700000040|1700003640|COMPLETED\n"
            "not sacct output\n\n"
            "102|102|bob|ml|gpu|gpu02|gres/gpu=1|2026-11-01T08:00:00|Unknown|RUNNING\n"
            "103|103|bob|ml|gpu|gpu[0x-2]|gres/gpu=1|1700000040|Unknown|RUNNING\n")
    jobs, problems = sources.parse_sacct(text)
    assert [j.job_id for j in jobs] == ["101"]
    assert problems[0].startswith("sacct line 2: 1 fields, not 10")
    assert problems[1] == "sacct line 4: time '2026-11-01T08:00:00' is not epoch seconds (SLURM_TIME_FORMAT=%s)"
    assert problems[2] == "sacct line 5: bad hostlist item 'gpu[0x-2]'"


@pytest.mark.parametrize(("text", "names"), [
    ("gpu01", ("gpu01",)),
    ("gpu[01-03]", ("gpu01", "gpu02", "gpu03")),
    ("gpu[08-10,12],head", ("gpu08", "gpu09", "gpu10", "gpu12", "head")),
    ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
    ("None assigned", ()),
])
def test_slurm_host_lists_expand(text: str, names: tuple[str, ...]) -> None:
    assert sources.hostlist(text) == names


@pytest.mark.parametrize(("tres", "gpus"), [
    ("billing=2,cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=16G,node=1", 2),
    ("cpu=1,gres/gpu:a100=1,gres/gpu:t4=2", 3),
    ("cpu=8,mem=4G,node=1", 0),
    ("", 0),
])
def test_allocated_gpus_come_from_alloc_tres(tres: str, gpus: int) -> None:
    assert sources.tres_gpus(tres) == gpus


def test_the_sacct_command_asks_a_wider_window_relative_to_the_controller_s_clock() -> None:
    now = T0 + 10_000
    cmd = sources.sacct_command(WIN, now)
    assert cmd.startswith("SLURM_TIME_FORMAT=%s sacct --allusers --allocations --parsable2 --noheader ")
    assert "--format=JobIDRaw,JobID,User,Account,Partition,NodeList,AllocTRES,Start,End,State" in cmd
    assert cmd.endswith(" --starttime=now-10060 --endtime=now-2740")  # 10,000 s + 60; 2,800 s - 60
    assert sources.sacct_command(Window(T0, T0 + 7200), T0 + 7200).endswith(" --endtime=now")


# --------------------------------------------------------------------------- the window
def test_since_and_until_take_durations_and_dates() -> None:
    now = 1_800_000_000.0
    assert sources.parse_when("7d", now, "--since") == now - 7 * 86400
    assert sources.parse_when("90m", now, "--since") == now - 5400
    assert sources.parse_when("now", now, "--until") == now
    assert sources.parse_when("2026-11-01T08:00+00:00", now, "--since") == 1_793_520_000.0
    assert sources.window("2w", "1w", now) == Window(now - 14 * 86400, now - 7 * 86400)
    assert sources.window("1h", "2030-01-01T00:00+00:00", now).until == now  # never past now
    with pytest.raises(sources.UsageError, match=r"--since 'yesterday': give a duration"):
        sources.parse_when("yesterday", now, "--since")
    with pytest.raises(sources.UsageError, match="the window is empty"):
        sources.window("1h", "2h", now)


def test_long_windows_are_asked_in_pieces_prometheus_accepts() -> None:
    win = Window(T0, T0 + 60 * 25_000)
    pieces = sources.query_points(win, 60)
    assert pieces == [(T0 + 60, T0 + 60 * 10_000), (T0 + 60 * 10_001, T0 + 60 * 20_000),
                      (T0 + 60 * 20_001, T0 + 60 * 25_000)]
    assert sources.query_points(Window(T0 + 1, T0 + 119), 60) == [(T0 + 60, T0 + 120)]


def test_the_queries_are_the_recording_rules_expressions() -> None:
    """The report asks for the expressions of the prometheus role's per-job rules (the rules
    do not cover history before they existed nor data loaded afterwards): the same text."""
    rules = yaml.safe_load((ROOT / "roles" / "prometheus" / "files" / "provision-records.yml").read_text())
    exprs = {r["record"]: " ".join(r["expr"].split()) for g in rules["groups"] for r in g["rules"]}
    assert exprs["provision:gpu_job_utilization_ratio"] == usage.UTILIZATION_EXPR
    power = exprs["provision:gpu_power_watts"].replace("(node, gpu)", "(node, gpu, hpc_job)")
    power = power.replace("(DCGM_FI_DEV_POWER_USAGE)", '(DCGM_FI_DEV_POWER_USAGE{hpc_job!=""})')
    power = power.replace("(provision_gpu_power_watts)", '(provision_gpu_power_watts{hpc_job!=""})')
    assert power == usage.POWER_EXPR


# --------------------------------------------------------------------------- the arithmetic
def test_the_report_matches_the_hand_computed_numbers(m: Manifest) -> None:
    jobs, _ = sources.parse_sacct(sacct_text())
    util, power = hand_series()
    assert_hand_computed(usage.build(m, jobs, util, power, WIN, "user", STEP))


@pytest.mark.parametrize(("by", "allocated"), [
    ("node", {"gpu02": 4.0, "gpu01": 2.5}),
    ("account", {"ml": 6.0, "vision": 0.5}),
    ("partition", {"gpu": 6.5}),
])
def test_other_groupings_share_the_same_totals(m: Manifest, by: str, allocated: dict[str, float]) -> None:
    jobs, _ = sources.parse_sacct(sacct_text())
    util, power = hand_series()
    report = usage.build(m, jobs, util, power, WIN, by, STEP)
    assert {r.key: r.allocated_h for r in report.rows} == pytest.approx(allocated)
    assert as_tuple(report.total) == pytest.approx(EXPECTED_TOTAL, abs=1e-5)


def test_a_job_on_two_nodes_splits_its_allocation_and_prices_each_node_s_gpus(m: Manifest) -> None:
    job = Job("7", "7", "dave", "ml", "gpu", ("gpu01", "gpu02"), 2, T0, T0 + 3600, "COMPLETED")
    util = [points("7", "gpu01", "0", range(1, 61), 1.0), points("7", "gpu02", "0", range(1, 61), 0.5)]
    power = [points("7", "gpu02", "0", range(1, 61), 360.0)]  # 360 W for 1 h = 0.36 kWh
    report = usage.build(m, [job], util, power, WIN, "node", STEP)
    rows = {r.key: r for r in report.rows}
    assert (rows["gpu01"].allocated_h, rows["gpu01"].used_h, rows["gpu01"].cost) == pytest.approx((1.0, 1.0, 2.0))
    # gpu02: 1 GPU-h x 1.00 + 0.36 kWh x 0.50
    assert (rows["gpu02"].allocated_h, rows["gpu02"].used_h, rows["gpu02"].cost) == pytest.approx((1.0, 0.5, 1.18))
    assert report.total.idle_share == pytest.approx(0.25)


def test_more_series_than_gpus_never_count_more_than_was_held(m: Manifest) -> None:
    job = Job("8", "8", "dave", "ml", "gpu", ("gpu01",), 1, T0, T0 + 3600, "COMPLETED")
    util = [points("8", "gpu01", "0", range(1, 61), 1.0), points("8", "gpu01", "1", range(1, 61), 0.0)]
    report = usage.build(m, [job], util, [], WIN, "user", STEP)
    assert (report.total.allocated_h, report.total.measured_h, report.total.used_h) == pytest.approx((1.0, 1.0, 0.5))


def test_without_prometheus_the_report_says_so_and_keeps_the_allocations(m: Manifest) -> None:
    def down(expr: str, start: float, end: float, step: float) -> dict[str, str]:
        raise sources.UsageError("connection refused")

    report = usage.gather(m, WIN, "user", T0 + 7200, lambda _cmd: sacct_text(), down, "http://10.30.0.10:9090")
    assert report.total.allocated_h == pytest.approx(6.5)
    assert (report.total.measured_h, report.total.used_h, report.total.idle_share) == (0.0, 0.0, None)
    assert report.notes == ("Prometheus at http://10.30.0.10:9090 did not answer (connection refused): used "
                            "GPU-hours, idle share and energy are unknown",)
    assert report.top_idle == ()


def test_an_unpriced_gpu_model_is_named_not_guessed(m: Manifest) -> None:
    cheap = m.model_copy(update={"cost": m.cost.model_copy(update={"gpus": {"A100": m.cost.gpus["A100"]}})})
    jobs, _ = sources.parse_sacct(sacct_text())
    util, power = hand_series()
    report = usage.build(cheap, jobs, util, power, WIN, "user", STEP)
    assert report.total.cost == pytest.approx(4.0 + 0.333333 + 0.666667, abs=1e-5)  # gpu01's jobs only
    assert report.total.unpriced_h == pytest.approx(4.0)
    assert report.notes[-1] == "GPU model 'L40S' has no price in cost.gpus: 4.00 GPU-h without a cost"


def test_without_a_cost_section_no_cost_is_reported_or_missed(m: Manifest) -> None:
    jobs, _ = sources.parse_sacct(sacct_text())
    util, power = hand_series()
    report = usage.build(m.model_copy(update={"cost": None}), jobs, util, power, WIN, "user", STEP)
    assert (report.currency, report.total.cost, len(report.notes)) == ("", 0.0, 3)  # the three series notes
    assert re.search(r"^total\s+4\s+6\.50\s+1\.58\s+58%\s+2\.70\s+0\.65\s+-$", usage_render.to_table(report), re.M)


def test_the_timeline_holds_allocated_and_used_gpus_per_account(m: Manifest) -> None:
    jobs, _ = sources.parse_sacct(sacct_text())
    util, power = hand_series()
    t = usage.build(m, jobs, util, power, WIN, "user", STEP).timeline  # 120 bins of 60 s
    assert len(t.edges) == 121 and t.edges[0] == T0 and t.edges[-1] == T0 + 7200
    ml, vision = t.allocated["ml"], t.allocated["vision"]
    assert (ml[0], ml[45], ml[75], ml[100]) == pytest.approx((2, 6, 4, 0))  # 101 alone, 101 + 102, 102 alone
    assert (vision[0], vision[9], vision[10], vision[110]) == pytest.approx((1, 1, 0, 1))  # 103, then 104
    assert (t.used["ml"][0], t.used["ml"][75], t.used["vision"][110]) == pytest.approx((1.5, 0, 0.25))


# --------------------------------------------------------------------------- rendering
def report_of(m: Manifest) -> usage.Report:
    jobs, _ = sources.parse_sacct(sacct_text())
    util, power = hand_series()
    return usage.build(m, jobs, util, power, WIN, "user", STEP)


def test_json_csv_and_table_carry_the_same_numbers(m: Manifest) -> None:
    report = report_of(m)
    data = json.loads(usage_render.to_json(report))
    assert [r["user"] for r in data["rows"]] == ["bob", "alice", "carol"]
    assert data["total"]["gpu_h_allocated"] == 6.5 and data["total"]["cost"] == 9.07
    assert data["total"]["gpu_h_capacity"] == 12.0 and data["total"]["allocated_share"] == pytest.approx(0.5417)
    assert data["rows"][2]["idle_share"] is None  # carol: nothing measured
    assert data["top_idle_jobs"][0] == {"job": "102", "user": "bob", "account": "ml", "gpus": 4, "hours_held": 1.0,
                                        "mean_utilization": 0.0, "idle_gpu_h": 1.4667}
    assert len(data["unknown"]) == 3
    rows = list(csv.reader(io.StringIO(usage_render.to_csv(report))))
    assert rows[0] == ["user", *usage_render.COLUMNS]
    assert rows[-1][:3] == ["total", "4", "6.5"] and rows[3][0] == "carol" and rows[3][6] == ""
    table = usage_render.to_table(report)
    assert re.search(r"^bob\s+1\s+4\.00\s+0\.00\s+100%\s+2\.53\s+0\.15\s+4\.07 EUR$", table, re.M), table
    assert re.search(r"^total\s+4\s+6\.50\s+1\.58\s+58%\s+2\.70\s+0\.65\s+9\.07 EUR$", table, re.M), table
    assert "held 6.50 of 12.00 GPU-h" in table and "- 1 job has gaps in GPU series" in table


def test_the_html_report_is_one_file_with_a_plot_per_account(m: Manifest) -> None:
    page = usage_render.to_html(report_of(m))
    assert page.startswith("<!DOCTYPE html>") and "<title>GPU usage of usagetest</title>" in page
    assert "<script" not in page and "<link" not in page and "src=" not in page  # nothing to fetch
    assert re.findall(r"http[s]?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * 2  # the SVG namespace
    assert page.count("<svg") == 2 and "<figcaption>ml: GPUs held" in page and "<figcaption>vision:" in page
    assert page.count('class="held"') == 2 and page.count('class="used"') == 2
    assert "<td>bob</td>" in page and "2.53 GPU-h of theirs unmeasured" in page


# --------------------------------------------------------------------------- the manifest's cost section
def write(tmp_path: Path, cost: str) -> Path:
    text = (DATA / "cluster.yaml").read_text()
    text = text[:text.index("cost:")] + cost
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("cost", "message"), [
    ("cost:\n  gpus:\n    A100: {price_per_gpu_hour: 2, purchase_price: 9000}\n",
     r"cluster.yaml:\d+:\d+: cost.gpus.A100: .*give either price_per_gpu_hour, or purchase_price"),
    ("cost:\n  gpus:\n    A100: {purchase_price: 9000, depreciation_years: 3}\n",
     r"cluster.yaml:\d+:\d+: cost.gpus.A100: .*\(missing: power_price_per_kwh\)"),
    ("cost:\n  gpus:\n    A100: {price_per_gpu_hour: -1}\n",
     r"cluster.yaml:\d+:\d+: cost.gpus.A100.price_per_gpu_hour: .*greater than 0"),
    ("cost:\n  gpus:\n    A100: {price_per_gpu_hour: 2}\n    A10O: {price_per_gpu_hour: 1}\n",
     r"cluster.yaml:54:5: cost.gpus.A10O: no node has GPU model 'A10O' \(the nodes' hardware.gpu.model: "
     r"'A100', 'L40S'\)"),
])
def test_a_bad_cost_section_is_an_error_with_its_line(tmp_path: Path, cost: str, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(write(tmp_path, cost))
    lines = [d.format() for d in info.value.diagnostics if d.severity == "error"]
    assert any(re.search(message, line) for line in lines), lines


def test_a_gpu_model_without_a_price_is_a_warning(tmp_path: Path) -> None:
    loaded = load_manifest(write(tmp_path, "cost:\n  currency: USD\n  gpus:\n    A100: {price_per_gpu_hour: 2}\n"))
    assert [d.format().split(": ", 1)[1] for d in loaded.warnings if "cost" in d.path] == [
        "warning: cost.gpus: no price for GPU model 'L40S': the usage report shows no cost for the GPU-hours "
        "held there"]


# --------------------------------------------------------------------------- a real Prometheus
def openmetrics() -> str:
    """The raw series behind hand_series(): DCGM's for job 101 (percent), the nvidia-smi
    collector's for 102 (with the gap) and 104, a GPU without a job, samples 10 s before each
    step's end; Prometheus' own evaluation turns them into the points."""
    def family(name: str, rows: list[tuple[dict[str, str], list[int], float]]) -> list[str]:
        out = [f"# TYPE {name} gauge"]
        for labels, ks, value in rows:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out += [f"{name}{{{text}}} {value:g} {T0 + 60 * k - 10}" for k in ks]
        return out

    dcgm = {"job": "dcgm", "instance": "gpu01", "node": "gpu01", "hpc_job": "101"}
    smi = {"job": "node", "instance": "gpu02", "node": "gpu02", "hpc_job": "102"}
    k102 = [k for k in range(31, 91) if not 40 <= k < 60]  # no sample T0+2390 .. T0+3530
    k104 = list(range(101, 121))
    smi104 = {"job": "node", "instance": "gpu01", "node": "gpu01", "hpc_job": "104"}
    lines = family("DCGM_FI_DEV_GPU_UTIL", [
        ({**dcgm, "gpu": "0", "UUID": "GPU-a0"}, list(range(1, 61)), 100),
        ({**dcgm, "gpu": "1", "UUID": "GPU-a1"}, list(range(1, 61)), 50),
        ({"job": "dcgm", "instance": "gpu02", "node": "gpu02", "gpu": "3", "UUID": "GPU-l3"}, list(range(1, 121)), 0),
    ])
    lines += family("DCGM_FI_DEV_POWER_USAGE", [
        ({**dcgm, "gpu": "0", "UUID": "GPU-a0"}, list(range(1, 61)), 300),
        ({**dcgm, "gpu": "1", "UUID": "GPU-a1"}, list(range(1, 61)), 200),
    ])
    lines += family("provision_gpu_utilization_ratio", [
        ({**smi, "gpu": "0", "uuid": "GPU-l0"}, k102, 0),
        ({**smi, "gpu": "1", "uuid": "GPU-l1"}, k102, 0),
        ({**smi104, "gpu": "1", "uuid": "GPU-a1"}, k104, 0.25),
    ])
    lines += family("provision_gpu_power_watts", [
        ({**smi, "gpu": "0", "uuid": "GPU-l0"}, k102, 100),
        ({**smi, "gpu": "1", "uuid": "GPU-l1"}, k102, 100),
    ])
    return "\n".join([*lines, "# EOF"]) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def prometheus(tmp_path: Path, promtool: str, prometheus_binary: str) -> Iterator[str]:
    """A real Prometheus on a loopback port, its TSDB made by promtool from openmetrics()."""
    data = tmp_path / "tsdb"
    source = tmp_path / "series.om"
    source.write_text(openmetrics())
    proc = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen([prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y",
                               f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("Prometheus did not become ready: " + (tmp_path / "prometheus.log").read_text()[-2000:])
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        log.close()


def test_a_real_prometheus_gives_the_hand_computed_numbers(m: Manifest, prometheus: str) -> None:
    asked: list[str] = []

    def sacct(command: str) -> str:
        asked.append(command)
        return sacct_text()

    report = usage.gather(m, WIN, "user", T0 + 7200, sacct, query_range(prometheus, 30), prometheus)
    assert asked == [sources.sacct_command(WIN, T0 + 7200)]
    assert_hand_computed(report)
    util = usage.fetch_series(query_range(prometheus, 30), usage.UTILIZATION_EXPR, WIN, STEP)
    assert {(s.job_id, s.node, s.gpu) for s in util} == {("101", "gpu01", "0"), ("101", "gpu01", "1"),
                                                        ("102", "gpu02", "0"), ("102", "gpu02", "1"),
                                                        ("104", "gpu01", "1")}
    gap = [t for t, _ in next(s for s in util if s.job_id == "102").samples]
    assert T0 + 60 * 43 in gap and T0 + 60 * 44 not in gap and T0 + 60 * 59 not in gap and T0 + 3600 in gap


def test_a_prometheus_error_answer_is_reported(prometheus: str) -> None:
    query = query_range(prometheus, 30)
    with pytest.raises(ValueError, match="bad_data"):
        sources.parse_matrix(query("max by (", T0, T0 + 60, 60))
    with pytest.raises(ProvisionError, match=r"127\.0\.0\.1:1"):
        query_range("http://127.0.0.1:1", 5)("up", T0, T0 + 60, 60)


def test_the_example_page_in_docs_is_the_report_of_this_data(m: Manifest) -> None:
    """docs/usage-example.html is what --html writes for the data above (hand series), so that
    a reader sees the page without a cluster; PROVISION_UPDATE_EXAMPLE=1 rewrites it."""
    report = dataclasses.replace(report_of(m), sources={"slurm": "sacct on head01",
                                                        "prometheus": "http://10.30.0.10:9090"})
    page = usage_render.to_html(report)
    example = ROOT / "docs" / "usage-example.html"
    if os.environ.get("PROVISION_UPDATE_EXAMPLE") == "1":
        example.write_text(page)
    assert example.read_text() == page, "docs/usage-example.html is stale: PROVISION_UPDATE_EXAMPLE=1 rewrites it"


def test_many_jobs_without_series_are_counted_and_the_first_ten_named(m: Manifest) -> None:
    jobs = [Job(str(i), str(i), "eve", "ml", "gpu", ("gpu01",), 1, T0, T0 + 360, "COMPLETED") for i in range(1, 13)]
    report = usage.build(m, jobs, [], [], WIN, "user", STEP)
    assert report.notes == ("12 jobs (1.20 GPU-h) have no GPU series in Prometheus: used GPU-hours and energy "
                            "unknown (1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 2 more)",)


def test_a_real_sacct_output_of_slurm_22_05() -> None:
    """data/usage/sacct-slurm-22.05.txt: sacct_command's output on the molecule slurm
    scenario's slurmdbd after its jobs: the long job (running, no GPU), jobs without GPUs, and
    GPU jobs of 0-4 s; the last two are its verifier's 2 GPUs x sleep 4 and 1 GPU x sleep 2.
    Slurm 22.05 writes only the untyped gres/gpu count into AllocTRES there."""
    text = (DATA / "sacct-slurm-22.05.txt").read_text()
    jobs, problems = sources.parse_sacct(text)
    assert problems == []
    assert [(j.job_id, j.nodes, j.gpus) for j in jobs] == [
        ("3", ("slurm-gpu02",), 1), ("4", ("slurm-gpu03",), 2), ("6", ("slurm-gpu03",), 1),
        ("8", ("slurm-gpu02",), 1), ("9", ("slurm-gpu02",), 2), ("10", ("slurm-gpu03",), 1)]
    assert "|Unknown|RUNNING" in text.splitlines()[0]  # the long job: running, no GPU, left out
    scenario = load_manifest(ROOT / "molecule" / "slurm" / "manifests" / "added.yml").manifest
    report = usage.build(scenario, jobs, None, None, Window(1795725731, 1795725860), "node", STEP)
    # slurm-gpu02: 1 GPU x 1 s (job 3) + 2 GPUs x 4 s (job 9); slurm-gpu03: 1 GPU x 2 s (job 10);
    # the jobs of 0 s held nothing
    assert [(r.key, r.jobs) for r in report.rows] == [("slurm-gpu02", 2), ("slurm-gpu03", 1)]
    assert [r.allocated_h * 3600 for r in report.rows] == pytest.approx([9.0, 2.0])
    assert report.notes == ()  # no Prometheus asked (None), no cost section: nothing else to say
