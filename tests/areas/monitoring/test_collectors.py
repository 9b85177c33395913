"""Our textfile collectors (roles/*/files/provision_*_collector.py): their parsing on recorded
sinfo/squeue output (Slurm 22.05) and on nvidia-smi and zpool output in the drivers' formats
(tests/areas/monitoring/data), failures included; what they write passes ``promtool check
metrics``; and a run end to end against stand-in commands on PATH."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

DATA = Path(__file__).parent / "data"
SLURM = DATA / "slurm"
SMI = DATA / "nvidia-smi"
ZPOOL = DATA / "zpool"


def samples(text: str) -> dict[str, float]:
    """'name{labels}' -> value of every sample line of an exposition text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def check_metrics(promtool: str, text: str) -> None:
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def stand_in(folder: Path, name: str, stdout: Path | None, status: int = 0, stderr: Path | None = None) -> None:
    """An executable ``name`` in ``folder`` that prints recorded output and exits with ``status``."""
    folder.mkdir(exist_ok=True)
    lines = ["#!/bin/sh"]
    if stdout is not None:
        lines.append(f"cat '{stdout}'")
    if stderr is not None:
        lines.append(f"cat '{stderr}' >&2")
    lines.append(f"exit {status}")
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)


# =========================================================================== Slurm
def test_sinfo_nodes_once_each_with_base_state_flags_and_reason(slurm_collector: ModuleType) -> None:
    nodes = slurm_collector.parse_sinfo((SLURM / "sinfo-drained-down.txt").read_text())
    assert [(n.name, n.state, n.not_responding, n.reason, n.gpus, n.gpus_allocated) for n in nodes] == [
        ("ghost1", "drained", True, "XID 79 gpu1 fell off the bus", 2, 0),
        ("ghost2", "down", True, "Not responding", 2, 0),
        ("monrec", "allocated", False, "", 2, 1),  # listed twice (two partitions), counted once
    ]
    draining = {n.name: n for n in slurm_collector.parse_sinfo((SLURM / "sinfo-draining.txt").read_text())}
    assert (draining["monrec"].state, draining["monrec"].reason) == ("draining", "bad DIMM, replace Friday")
    mixed = {n.name: n for n in slurm_collector.parse_sinfo((SLURM / "sinfo-mixed-unknown.txt").read_text())}
    assert (mixed["monrec"].state, mixed["monrec"].gpus_allocated) == ("mixed", 1)
    assert (mixed["cpu01"].state, mixed["cpu01"].gpus, mixed["ghost2"].not_responding) == ("unknown", 0, False)


def test_squeue_jobs_gpus_and_pending_reasons(slurm_collector: ModuleType) -> None:
    jobs = slurm_collector.parse_squeue((SLURM / "squeue-pending.txt").read_text())
    assert len(jobs) == 9  # the array's three tasks each
    assert [(j.state, j.partition, j.gpus) for j in jobs if j.state == "running"] == [("running", "gpu", 1)]
    assert sum(j.gpus for j in jobs if j.state == "pending") == 8  # --gpus=2 is tres-per-job
    assert {j.reason for j in jobs if j.state == "pending"} == {
        "Resources", "Priority", "BeginTime", "JobHeldUser",
        "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"}
    assert slurm_collector.parse_squeue((SLURM / "squeue-empty.txt").read_text()) == []


@pytest.mark.parametrize("gres, count", [
    ("gpu:tesla_t4:2", 2), ("gpu:tesla_t4:1(IDX:0)", 1), ("gpu:tesla_t4:0(IDX:N/A)", 0), ("gpu:0", 0),
    ("(null)", 0), ("N/A", 0), ("gres:gpu:2", 2), ("gres:gpu:1", 1), ("gpu:4(S:0-1)", 4),
    ("gpu:a100:2(IDX:0-1),gpu:t4:1(IDX:3)", 3), ("gpu:a100:4(S:0),shard:8", 4), ("gres/gpu:3", 3),
])
def test_gpu_counts_of_gres_strings(slurm_collector: ModuleType, gres: str, count: int) -> None:
    assert slurm_collector.gpu_count(gres) == count


def test_malformed_slurm_output_is_an_error(slurm_collector: ModuleType) -> None:
    with pytest.raises(slurm_collector.CollectError, match="sinfo line 1: expected 5 fields"):
        slurm_collector.parse_sinfo("monrec idle gpu:2\n")
    with pytest.raises(slurm_collector.CollectError, match="squeue line 2"):
        slurm_collector.parse_squeue("12|RUNNING|gpu|N/A|gres:gpu:1|1|None\nbroken\n")


def test_slurm_exposition(slurm_collector: ModuleType, promtool: str) -> None:
    nodes = slurm_collector.parse_sinfo((SLURM / "sinfo-drained-down.txt").read_text())
    jobs = slurm_collector.parse_squeue((SLURM / "squeue-pending.txt").read_text())
    text = slurm_collector.render(nodes, jobs, now=1700000000.25)
    check_metrics(promtool, text)
    got = samples(text)
    assert got['provision_slurm_node_state{slurm_node="ghost1",state="drained",'
               'reason="XID 79 gpu1 fell off the bus"}'] == 1
    assert got['provision_slurm_node_state{slurm_node="monrec",state="allocated"}'] == 1
    assert got['provision_slurm_node_not_responding{slurm_node="ghost2"}'] == 1
    assert got['provision_slurm_node_gpus_allocated{slurm_node="monrec"}'] == 1
    assert got['provision_slurm_jobs{state="pending",partition="gpu"}'] == 7
    assert got['provision_slurm_jobs_pending{partition="gpu",reason="Priority"}'] == 4
    assert got['provision_slurm_job_gpus{state="pending",partition="gpu"}'] == 7
    assert got["provision_slurm_collector_success"] == 1
    assert got["provision_slurm_collector_last_run_timestamp_seconds"] == 1700000000.25


def test_squeue_owners_of_running_jobs(slurm_collector: ModuleType) -> None:
    owners = slurm_collector.parse_owners((SLURM / "squeue-running-owners.txt").read_text())
    assert [(o.job_id, o.user, o.account, o.partition) for o in owners] == [
        ("12", "alice", "research", "gpu"), ("14", "bob", "", "gpu")]  # 14: task 1 of array job 13
    assert slurm_collector.parse_owners("") == []
    with pytest.raises(slurm_collector.CollectError, match="owners"):
        slurm_collector.parse_owners("12|RUNNING|gpu|N/A|gres:gpu:1|1|None\n")


def test_slurm_collector_end_to_end(slurm_collector: ModuleType, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch, promtool: str) -> None:
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "sinfo", SLURM / "sinfo-mixed-unknown.txt")
    stand_in(bin_dir, "squeue", SLURM / "squeue-running.txt")
    # the owners' query (--states=RUNNING) gets its own recording
    (bin_dir / "squeue").write_text(
        f"#!/bin/sh\ncase \"$*\" in *--states=RUNNING*) cat '{SLURM / 'squeue-running-owners.txt'}' ;; "
        f"*) cat '{SLURM / 'squeue-running.txt'}' ;; esac\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "provision_slurm.prom"
    assert slurm_collector.main(["--out", str(out)]) == 0
    check_metrics(promtool, out.read_text())
    got = samples(out.read_text())
    assert got['provision_slurm_node_state{slurm_node="monrec",state="mixed"}'] == 1
    assert got['provision_slurm_jobs{state="running",partition="debug"}'] == 1
    assert got['provision_slurm_job_info{job_id="12",user="alice",account="research",partition="gpu"}'] == 1
    assert got['provision_slurm_job_info{job_id="14",user="bob",partition="gpu"}'] == 1  # no account
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_slurm_collector_reports_a_dead_controller(slurm_collector: ModuleType, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], promtool: str) -> None:
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "sinfo", None, 1, SLURM / "sinfo-controller-down.stderr")
    stand_in(bin_dir, "squeue", None, 1, SLURM / "squeue-controller-down.stderr")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "provision_slurm.prom"
    out.write_text('provision_slurm_node_state{slurm_node="old",state="idle"} 1\n')
    assert slurm_collector.main(["--out", str(out)]) == 1
    got = samples(out.read_text())
    assert got["provision_slurm_collector_success"] == 0
    assert not any(k.startswith("provision_slurm_node_state") for k in got)  # no stale numbers
    assert "Unable to contact slurm controller" in capsys.readouterr().err
    check_metrics(promtool, out.read_text())


def test_slurm_collector_bounds_a_hung_command(slurm_collector: ModuleType, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    nodes, jobs, owners, error = slurm_collector.collect(timeout=0.5)
    assert (nodes, jobs, owners) == (None, None, [])
    assert error == "sinfo did not answer within 0.5s"


# =========================================================================== GPUs (nvidia-smi)
def test_nvidia_smi_gpus(gpu_collector: ModuleType) -> None:
    result = gpu_collector.parse_query((SMI / "a6000-pair.csv").read_text())
    assert result.errors == []
    g0, g1 = result.gpus
    assert (g0.index, g0.uuid, g0.name, g0.pci) == ("0", "GPU-5e0a8b3c-1f2d-4c6e-9a7b-0c1d2e3f4a5b",
                                                    "NVIDIA RTX A6000", "0000:3b:00")
    assert g0.values == {"temperature_celsius": 45.0, "utilization_ratio": 0.97,
                         "memory_used_bytes": 40113 * 2**20, "memory_total_bytes": 49140 * 2**20,
                         "power_watts": 287.52, "ecc_corrected_volatile_total": 0.0,
                         "ecc_uncorrected_volatile_total": 0.0}
    assert (g1.pci, g1.values["ecc_uncorrected_volatile_total"]) == ("0000:af:00", 1.0)


def test_nvidia_smi_recorded_on_an_h100(gpu_collector: ModuleType) -> None:
    result = gpu_collector.parse_query((SMI / "h100-recorded.csv").read_text())
    assert result.errors == []
    (g,) = result.gpus
    assert (g.index, g.name, g.pci) == ("0", "NVIDIA H100 80GB HBM3", "0000:00:06")
    assert g.values["memory_total_bytes"] == 81559 * 2**20
    assert g.values["ecc_uncorrected_volatile_total"] == 0.0


def test_readings_nvidia_smi_cannot_give_are_left_out(gpu_collector: ModuleType) -> None:
    result = gpu_collector.parse_query((SMI / "geforce-no-ecc.csv").read_text())
    g0, g1 = result.gpus
    assert "ecc_uncorrected_volatile_total" not in g0.values and g0.values["temperature_celsius"] == 62
    assert "temperature_celsius" not in g1.values and "power_watts" not in g1.values  # [Unknown Error], [N/A]
    assert result.errors == []


@pytest.mark.parametrize("name, gpus, error", [
    ("gpu-lost", ["0"], "Unable to determine the device handle for GPU0000:AF:00.0: Unknown Error"),
    ("driver-not-loaded", [], "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    ("no-devices", [], "No devices were found"),
])
def test_nvidia_smi_failures(gpu_collector: ModuleType, name: str, gpus: list[str], error: str) -> None:
    result = gpu_collector.parse_query((SMI / f"{name}.csv").read_text())
    assert [g.index for g in result.gpus] == gpus
    assert result.errors and result.errors[0].startswith(error)


def test_xids_from_the_kernel_log(gpu_collector: ModuleType) -> None:
    assert gpu_collector.parse_xids((SMI / "kernel-xid.log").read_text()) == [
        ("0000:3b:00", 13), ("0000:3b:00", 13), ("0000:af:00", 63), ("0000:af:00", 79), ("0000:d8:00", 48)]


@pytest.mark.parametrize("bus_id, key", [("00000000:3B:00.0", "0000:3b:00"), ("0000:af:00", "0000:af:00"),
                                          ("00000001:0A:1F.0", "0001:0a:1f")])
def test_pci_keys(gpu_collector: ModuleType, bus_id: str, key: str) -> None:
    assert gpu_collector.pci_key(bus_id) == key


def test_gpu_exposition_with_xids_and_jobs(gpu_collector: ModuleType, tmp_path: Path, promtool: str) -> None:
    smi = gpu_collector.parse_query((SMI / "gpu-lost.csv").read_text())
    xids = gpu_collector.parse_xids((SMI / "kernel-xid.log").read_text())
    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    (jobs_dir / "0").write_text("4711\n4712\n")
    (jobs_dir / ".0.tmp").write_text("ignored\n")
    jobs = gpu_collector.read_job_map(jobs_dir)
    assert jobs == {"0": ["4711", "4712"]}
    text = gpu_collector.render(smi, xids, jobs, ok=False, now=1700000000.0)
    check_metrics(promtool, text)
    got = samples(text)
    assert got['provision_gpu_info{gpu="0",uuid="GPU-5e0a8b3c-1f2d-4c6e-9a7b-0c1d2e3f4a5b",'
               'name="NVIDIA RTX A6000",pci_bus_id="0000:3b:00"}'] == 1
    # one series per job on the GPU, like DCGM's hpc_job
    uuid = "GPU-5e0a8b3c-1f2d-4c6e-9a7b-0c1d2e3f4a5b"
    assert got[f'provision_gpu_temperature_celsius{{gpu="0",uuid="{uuid}",hpc_job="4711"}}'] == 44
    assert got[f'provision_gpu_temperature_celsius{{gpu="0",uuid="{uuid}",hpc_job="4712"}}'] == 44
    assert got['provision_gpu_last_xid{gpu="0",pci_bus_id="0000:3b:00"}'] == 13
    # the lost GPU is not in nvidia-smi's list: its PCI address stands in for the index
    assert got['provision_gpu_last_xid{gpu="pci:0000:af:00",pci_bus_id="0000:af:00"}'] == 79
    assert got['provision_gpu_xid_errors_total{gpu="pci:0000:af:00",pci_bus_id="0000:af:00",xid="63"}'] == 1
    assert got['provision_gpu_xid_errors_total{gpu="0",pci_bus_id="0000:3b:00",xid="13"}'] == 2
    assert got["provision_gpu_collector_success"] == 0


def test_a_gpu_without_xids_reports_zero(gpu_collector: ModuleType, promtool: str) -> None:
    smi = gpu_collector.parse_query((SMI / "a6000-pair.csv").read_text())
    text = gpu_collector.render(smi, [], {}, ok=True, now=1.0)
    check_metrics(promtool, text)
    got = samples(text)
    assert got['provision_gpu_last_xid{gpu="1",pci_bus_id="0000:af:00"}'] == 0
    assert not any(k.startswith("provision_gpu_xid_errors_total") for k in got)
    assert got['provision_gpu_utilization_ratio{gpu="0",uuid="GPU-5e0a8b3c-1f2d-4c6e-9a7b-0c1d2e3f4a5b"}'] == 0.97


@pytest.mark.parametrize("name", ["a6000-pair", "h100-recorded", "gpu-lost", "driver-not-loaded", "no-devices"])
def test_gpu_collector_end_to_end(gpu_collector: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  promtool: str, name: str) -> None:
    bin_dir = tmp_path / "bin"
    status = int((SMI / f"{name}.exit").read_text())
    stand_in(bin_dir, "nvidia-smi", SMI / f"{name}.csv", status)
    stand_in(bin_dir, "journalctl", SMI / "kernel-xid.log")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "provision_gpu.prom"
    rc = gpu_collector.main(["--out", str(out), "--job-map-dir", str(tmp_path / "none")])
    assert rc == (0 if status == 0 else 1)
    text = out.read_text()
    check_metrics(promtool, text)
    got = samples(text)
    assert got["provision_gpu_collector_success"] == (1 if status == 0 else 0)
    infos = [k for k in got if k.startswith("provision_gpu_info")]
    assert len(infos) == {"a6000-pair": 2, "h100-recorded": 1, "gpu-lost": 1}.get(name, 0)
    assert got['provision_gpu_last_xid{gpu="pci:0000:d8:00",pci_bus_id="0000:d8:00"}'] == 48


def test_gpu_collector_without_nvidia_smi(gpu_collector: ModuleType, tmp_path: Path) -> None:
    result, error = gpu_collector.run_smi(str(tmp_path / "no-such-nvidia-smi"), timeout=5)
    assert (result, error) == (None, f"{tmp_path / 'no-such-nvidia-smi'} is not installed")


# =========================================================================== zpool
def test_zpool_healthy(zpool_collector: ModuleType) -> None:
    (pool,) = zpool_collector.parse_status((ZPOOL / "healthy.txt").read_text())
    assert (pool.name, pool.scrub_errors, pool.repaired_bytes, pool.data_errors, pool.scan_in_progress) == (
        "tank", 0, 0, 0, False)
    assert sorted(pool.devices) == [
        "ata-HGST_HUS726T6TALE6L4_V8G00001", "ata-HGST_HUS726T6TALE6L4_V8G00002",
        "ata-HGST_HUS726T6TALE6L4_V8G00003", "ata-HGST_HUS726T6TALE6L4_V8G00004",
        "ata-Samsung_SSD_870_EVO_1TB_S6PT000001", "nvme-INTEL_SSDPE21D280GA_PHM2000001",
    ]  # disks only: not the pool, mirror-N, logs or cache rows


def test_zpool_degraded_with_scrub_data_and_device_errors(zpool_collector: ModuleType) -> None:
    audio, scratch = zpool_collector.parse_status((ZPOOL / "degraded-errors.txt").read_text())
    assert (audio.scrub_errors, audio.repaired_bytes, audio.data_errors) == (2, int(1.5 * 2**20), 2)
    assert audio.devices["wwn-0x5000c500a0000003"] == (0, 0, 12)
    assert audio.devices["wwn-0x5000c500a0000004"] == (3, 0, 0)
    assert "mirror-0" not in audio.devices and "audio" not in audio.devices
    assert (scratch.name, scratch.repaired_bytes, scratch.scrub_errors, list(scratch.devices)) == (
        "scratch", int(1.21 * 2**30), 0, ["vdb"])


def test_zpool_scrub_in_progress_and_no_pools(zpool_collector: ModuleType) -> None:
    (tank,) = zpool_collector.parse_status((ZPOOL / "scrub-in-progress.txt").read_text())
    assert tank.scan_in_progress and tank.scrub_errors == 0
    assert sorted(tank.devices) == ["sda", "sdb", "sdc", "sdd"]
    assert zpool_collector.parse_status((ZPOOL / "no-pools.txt").read_text()) == []
    with pytest.raises(zpool_collector.CollectError, match="printed no pool"):
        zpool_collector.parse_status("internal error: something broke\n")


def test_zpool_exposition(zpool_collector: ModuleType, promtool: str) -> None:
    pools = zpool_collector.parse_status((ZPOOL / "degraded-errors.txt").read_text())
    text = zpool_collector.render(pools, now=2.5)
    check_metrics(promtool, text)
    got = samples(text)
    assert got['provision_zpool_scrub_errors{zpool="audio"}'] == 2
    assert got['provision_zpool_data_errors{zpool="audio"}'] == 2
    assert got['provision_zpool_device_errors{zpool="audio",device="wwn-0x5000c500a0000003",type="checksum"}'] == 12
    assert got['provision_zpool_device_errors{zpool="audio",device="wwn-0x5000c500a0000004",type="read"}'] == 3
    assert got["provision_zpool_collector_success"] == 1
    failed = samples(zpool_collector.render(None, now=3.0))
    assert failed == {"provision_zpool_collector_success": 0,
                      "provision_zpool_collector_last_run_timestamp_seconds": 3.0}


def test_zpool_collector_end_to_end(zpool_collector: ModuleType, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    stand_in(bin_dir, "zpool", ZPOOL / "healthy.txt")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "provision_zpool.prom"
    assert zpool_collector.main(["--out", str(out)]) == 0
    assert re.search(r'^provision_zpool_scrub_errors\{zpool="tank"\} 0$', out.read_text(), re.M)


# =========================================================================== Slurm prolog/epilog
@pytest.fixture
def job_scripts(tmp_path: Path, renderer: object) -> tuple[Path, Path, Path]:
    jobs = tmp_path / "gpu-jobs"
    scripts = []
    for name in ("gpu-job-map-prolog.sh.j2", "gpu-job-map-epilog.sh.j2"):
        text = renderer.template("gpu_metrics", name, {"gpu_metrics_job_map_dir": str(jobs)})  # type: ignore[attr-defined]
        path = tmp_path / name.removesuffix(".j2")
        path.write_text(text)
        path.chmod(0o755)
        scripts.append(path)
    return jobs, scripts[0], scripts[1]


def run_script(script: Path, **env: str) -> None:
    proc = subprocess.run([str(script)], env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_prolog_and_epilog_keep_the_gpu_job_map(job_scripts: tuple[Path, Path, Path],
                                                gpu_collector: ModuleType) -> None:
    jobs, prolog, epilog = job_scripts
    run_script(prolog, SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    run_script(prolog, SLURM_JOB_ID="102", SLURM_JOB_GPUS="1")
    run_script(prolog, SLURM_JOB_ID="102", SLURM_JOB_GPUS="1")  # a re-run adds nothing
    run_script(prolog, SLURM_JOB_ID="103")  # no GPUs: nothing to record
    assert gpu_collector.read_job_map(jobs) == {"0": ["101"], "1": ["101", "102"]}
    run_script(epilog, SLURM_JOB_ID="101", SLURM_JOB_GPUS="0,1")
    assert gpu_collector.read_job_map(jobs) == {"1": ["102"]}
    assert sorted(p.name for p in jobs.iterdir()) == ["1"]  # GPU 0's file removed, no temporary files
    run_script(epilog, SLURM_JOB_ID="102")
    assert list(jobs.iterdir()) == []


def test_prolog_never_fails(job_scripts: tuple[Path, Path, Path], tmp_path: Path) -> None:
    jobs, prolog, epilog = job_scripts
    jobs.parent.chmod(0o555)  # cannot create the directory (as non-root; root ignores modes)
    try:
        run_script(prolog, SLURM_JOB_ID="7", SLURM_JOB_GPUS="0")
        run_script(prolog, SLURM_JOB_ID="7;rm -rf /", SLURM_JOB_GPUS="0")
        run_script(epilog, SLURM_JOB_ID="7")
        run_script(prolog, SLURM_JOB_ID="8", SLURM_JOB_GPUS="../../etc")
    finally:
        jobs.parent.chmod(0o755)
    assert not (tmp_path / "etc").exists()
