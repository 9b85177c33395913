"""roles/slurm/files/provision_slurm_healthcheck.py (Slurm's HealthCheckProgram): what it finds
wrong with a node, when it drains and resumes, and a run end to end against stand-in sinfo,
scontrol and journalctl on PATH."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "roles" / "slurm" / "files" / "provision_slurm_healthcheck.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("provision_slurm_healthcheck", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


hc = load()
CONFIG = hc.Config(node="gpu01", gpu_count=2, mounts=("/data", "/home/shared"), xids=frozenset({48, 79}))
MOUNTS = frozenset({"/", "/data", "/home/shared"})
KERNEL_LOG = (
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception on GPC 0\n"
    "NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
)


def seen(gpus: set[int] | None = None, mounts: frozenset[str] = MOUNTS,
         xids: tuple[int, ...] | None = ()) -> object:
    return hc.Observed(gpus=frozenset({0, 1} if gpus is None else gpus), mounts=mounts, xids=xids)


def test_healthy_node_has_no_findings() -> None:
    assert hc.findings(CONFIG, seen()) == []
    assert hc.findings(CONFIG, seen(gpus={0, 1, 2})) == []  # more GPUs than promised is no fault


def test_missing_gpu_mount_and_hardware_xid_are_found() -> None:
    found = hc.findings(CONFIG, seen(gpus={0}, mounts=frozenset({"/", "/data"}), xids=(13, 79, 79)))
    assert found == ["1 of 2 GPUs (/dev/nvidia1 missing)", "shared mount /home/shared missing",
                     "XID 79 in the kernel log since boot"]
    # a gap is named, a GPU beyond the manifest's count does not fill it
    assert hc.findings(CONFIG, seen(gpus={1, 2})) == ["1 of 2 GPUs (/dev/nvidia0 missing)"]


def test_xids_of_user_programs_and_unchecked_xids_drain_nothing() -> None:
    assert hc.findings(CONFIG, seen(xids=(13, 31, 43))) == []
    assert hc.findings(CONFIG, seen(xids=None)) == []  # no driver: not checked


def test_parsers() -> None:
    assert hc.parse_xids(KERNEL_LOG) == (13, 79)
    assert hc.parse_xids("") == ()
    assert hc.gpu_indexes(["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"]) == {0, 1}
    assert hc.mount_points("host:/e /data nfs4 rw 0 0\nm /mnt/my\\040disk fuse rw 0 0\n") == {
        "/data", "/mnt/my disk"}
    assert hc.parse_node_state("drained|healthcheck: x\ndrained|healthcheck: x\n") == ("drained", "healthcheck: x")
    assert hc.parse_node_state("idle|none\n") == ("idle", "")
    assert hc.parse_node_state("") == ("", "")
    assert hc.load_config(json.dumps({"node": "n1", "gpu_count": "2", "mounts": ["/d"], "xids": [79]})) == \
        hc.Config(node="n1", gpu_count=2, mounts=("/d",), xids=frozenset({79}))


@pytest.mark.parametrize(("problems", "state", "reason", "kind"), [
    ([], "idle", "", "none"),
    (["1 of 2 GPUs (/dev/nvidia1 missing)"], "idle", "", "drain"),
    (["1 of 2 GPUs (/dev/nvidia1 missing)"], "mixed", "", "drain"),  # jobs finish, no new ones start
    # already drained for this: nothing to do; for something else of ours: the new reason
    (["1 of 2 GPUs (/dev/nvidia1 missing)"], "drained", "healthcheck: 1 of 2 GPUs (/dev/nvidia1 missing)", "none"),
    (["shared mount /data missing"], "drained", "healthcheck: 1 of 2 GPUs (/dev/nvidia1 missing)", "drain"),
    # an operator's (or Slurm's) drain is never touched, healthy or not
    (["shared mount /data missing"], "drained", "maintenance", "none"),
    ([], "drained", "maintenance", "none"),
    ([], "draining", "Kill task failed", "none"),
    # our own drain, all well again: resume
    ([], "drained", "healthcheck: 1 of 2 GPUs (/dev/nvidia1 missing)", "resume"),
    ([], "draining", "healthcheck: shared mount /data missing", "resume"),
])
def test_decide(problems: list[str], state: str, reason: str, kind: str) -> None:
    action = hc.decide(problems, state, reason)
    assert action.kind == kind
    if kind == "drain":
        assert action.reason == "healthcheck: " + "; ".join(problems)


def test_long_reason_is_cut() -> None:
    reason = hc.reason_text([f"shared mount /very/long/path/{i} missing" for i in range(20)])
    assert len(reason) == hc.MAX_REASON and reason.startswith("healthcheck: ") and reason.endswith("...")


def test_scontrol_arguments() -> None:
    assert hc.scontrol_args("gpu01", hc.Action("drain", reason="healthcheck: x y")) == [
        "scontrol", "update", "nodename=gpu01", "state=drain", "reason=healthcheck: x y"]
    assert hc.scontrol_args("gpu01", hc.Action("resume")) == [
        "scontrol", "update", "nodename=gpu01", "state=resume"]


# --------------------------------------------------------------------------- end to end
def stand_ins(folder: Path, sinfo: str) -> Path:
    """sinfo printing ``sinfo``, scontrol and journalctl recording their arguments."""
    folder.mkdir(parents=True)
    log = folder / "calls"
    for name, body in (("sinfo", f"printf '%s\\n' '{sinfo}'"),
                       ("scontrol", f'echo "scontrol $*" >> {log}'),
                       ("journalctl", f"cat <<'EOF'\n{KERNEL_LOG}EOF")):
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return log


def run_check(tmp_path: Path, sinfo: str, devices: list[str], driver: bool) -> tuple[str, str]:
    bin_dir = tmp_path / "bin"
    log = stand_ins(bin_dir, sinfo)
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in devices:
        (dev / name).touch()
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\nhead:/data /data nfs4 rw 0 0\n")
    config = tmp_path / "hc.json"
    config.write_text(json.dumps({"node": "gpu01", "gpu_count": 2, "mounts": ["/data"], "xids": [79]}))
    driver_dir = tmp_path / "driver"
    if driver:
        driver_dir.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", str(config), "--dev", str(dev), "--mounts", str(mounts),
         "--driver", str(driver_dir)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), log.read_text() if log.exists() else ""


def test_run_drains_a_node_missing_a_gpu(tmp_path: Path) -> None:
    out, calls = run_check(tmp_path, "idle|none", ["nvidia0", "nvidiactl"], driver=False)
    reason = "healthcheck: 1 of 2 GPUs (/dev/nvidia1 missing)"
    assert calls == f"scontrol update nodename=gpu01 state=drain reason={reason}\n"
    assert out == (f"gpu01: 1 of 2 GPUs (/dev/nvidia1 missing); XID: skipped (no NVIDIA driver loaded); "
                   f"drained ({reason})")


def test_run_drains_on_a_hardware_xid_where_the_driver_is_loaded(tmp_path: Path) -> None:
    out, calls = run_check(tmp_path, "idle|none", ["nvidia0", "nvidia1"], driver=True)
    reason = "healthcheck: XID 79 in the kernel log since boot"
    assert calls == f"scontrol update nodename=gpu01 state=drain reason={reason}\n"
    assert "XID: checked" in out


def test_run_resumes_its_own_drain_and_leaves_others(tmp_path: Path) -> None:
    out, calls = run_check(tmp_path / "a", "drained|healthcheck: 1 of 2 GPUs (/dev/nvidia1 missing)",
                           ["nvidia0", "nvidia1"], driver=False)
    assert calls == "scontrol update nodename=gpu01 state=resume\n" and out.endswith("; resumed")
    out, calls = run_check(tmp_path / "b", "drained|maintenance", ["nvidia0", "nvidia1"], driver=False)
    assert calls == "" and out.endswith("no change (all checks pass)")
