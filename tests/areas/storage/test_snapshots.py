"""provisioner.areas.storage.snapshots: which snapshots are ours, which a run destroys (never
one we did not take), lateness, the metrics; and the same file run as the node program
against a fake ``zfs`` that keeps its snapshots in a file."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import snapshots
from provisioner.areas.storage.zfs import snapshot_policies
from provisioner.manifest.storage import SnapshotPolicy

DS = "tank/home"


def at(stamp: str) -> int:
    return calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ"))


def hourly(*hours: int) -> list[str]:
    return [f"{DS}@provision-hourly-20251127T{h:02d}0000Z" for h in hours]


def test_the_model_s_frequencies_are_the_program_s() -> None:
    assert list(SnapshotPolicy.model_fields) == list(snapshots.PERIODS)


def test_snapshot_name_is_utc_and_sorts_by_time() -> None:
    assert snapshots.snapshot_name(DS, "daily", at("20261127T021500Z")) == f"{DS}@provision-daily-20261127T021500Z"
    with pytest.raises(ValueError, match="unknown frequency 'yearly'"):
        snapshots.snapshot_name(DS, "yearly", 0)


def test_ours_are_exactly_our_names_of_this_dataset() -> None:
    names = [
        *hourly(3, 1),
        f"{DS}@manual-before-upgrade",  # an operator's
        f"{DS}@provision-hourly-latest",  # looks like ours, no time
        f"{DS}@provision-hourly-20261399T000000Z",  # not a date
        f"{DS}@provision-yearly-20261127T000000Z",  # not our frequency
        f"{DS}@xprovision-hourly-20261127T000000Z",
        f"{DS}/child@provision-hourly-20261127T000000Z",  # another dataset
        "tank/homes@provision-hourly-20261127T000000Z",
        "tank/home",  # no snapshot at all
    ]
    found = snapshots.ours(DS, names)
    assert [s.name for s in found] == hourly(1, 3)  # oldest first
    assert found[0] == snapshots.Ours(at("20251127T010000Z"), "hourly", hourly(1)[0])


def test_to_destroy_keeps_the_newest_of_that_frequency_and_nothing_else_goes() -> None:
    foreign = [f"{DS}@manual", f"{DS}@provision-hourly-keepme", f"{DS}@syncoid_x_2026-11-27:00:00:00"]
    daily = [f"{DS}@provision-daily-20261101T000000Z"]
    names = [*foreign, *daily, *hourly(5, 1, 4, 2, 3)]
    assert snapshots.to_destroy(DS, names, "hourly", 3) == hourly(1, 2)
    assert snapshots.to_destroy(DS, names, "hourly", 5) == []
    assert snapshots.to_destroy(DS, names, "hourly", 9) == []
    assert snapshots.to_destroy(DS, names, "hourly", 0) == hourly(1, 2, 3, 4, 5)
    assert snapshots.to_destroy(DS, names, "daily", 0) == daily
    everything = set(snapshots.to_destroy(DS, names, "hourly", 0)) | set(snapshots.to_destroy(DS, names, "daily", 0))
    assert not everything & set(foreign)
    with pytest.raises(ValueError):
        snapshots.to_destroy(DS, names, "hourly", -1)


def test_newest_max_age_and_late() -> None:
    assert snapshots.newest(DS, [f"{DS}@manual"]) == 0
    assert snapshots.newest(DS, [*hourly(1, 7), f"{DS}@provision-daily-20251127T000000Z"]) == at("20251127T070000Z")
    assert snapshots.max_age({"hourly": 24, "daily": 7}) == 2 * 3600
    assert snapshots.max_age({"weekly": 8, "monthly": 12}) == 2 * 7 * 86400
    assert snapshots.max_age({"hourly": 0}) == 0
    assert snapshots.shortest({"monthly": 1, "daily": 3}) == "daily"
    assert snapshots.shortest({}) is None
    taken = at("20251127T070000Z")
    assert not snapshots.late({"hourly": 24}, taken, taken + 7200)
    assert snapshots.late({"hourly": 24}, taken, taken + 7201)
    assert snapshots.late({"daily": 1}, 0, taken)  # none at all is late
    assert not snapshots.late({}, 0, taken)


def test_metrics_text_and_reading_back_the_run_results() -> None:
    text = snapshots.metrics_text({DS: 1700000000, "tank/x": 0}, {DS: {"hourly": 2}, "tank/x": {"daily": 1}},
                                  {"hourly": (True, 1700000001.4), "daily": (False, 1699990000.0)})
    assert 'provision_zfs_snapshot_newest_timestamp_seconds{dataset="tank/home"} 1700000000' in text
    assert 'provision_zfs_snapshot_newest_timestamp_seconds{dataset="tank/x"} 0' in text
    assert 'provision_zfs_snapshot_max_age_seconds{dataset="tank/x"} 172800' in text
    assert 'provision_zfs_snapshot_run_success{frequency="daily"} 0' in text
    assert 'provision_zfs_snapshot_run_timestamp_seconds{frequency="hourly"} 1700000001' in text
    assert snapshots.read_results(text) == {"hourly": (True, 1700000001.0), "daily": (False, 1699990000.0)}


def test_parse_policies_refuses_what_the_program_cannot_run() -> None:
    assert snapshots.parse_policies({"datasets": {DS: {"hourly": 2}}}) == {DS: {"hourly": 2}}
    for bad in ({}, {"datasets": []}, {"datasets": {DS: {"yearly": 1}}}, {"datasets": {DS: {"hourly": -1}}}):
        with pytest.raises(ValueError):
            snapshots.parse_policies(bad)


def test_policies_per_dataset_fall_back_to_the_pool_s(kit: Any) -> None:
    data = kit.base(storage=True)
    pool = data["zfs"]["pools"][0]
    pool["snapshots"] = {"daily": 7}
    pool["datasets"] = [{"name": "data"}, {"name": "home", "snapshots": {"hourly": 24, "weekly": 4}},
                        {"name": "scratch", "snapshots": {}}]
    (tank,) = kit.load(data).manifest.zfs.pools
    assert snapshot_policies(tank) == {"tank/data": {"daily": 7}, "tank/home": {"hourly": 24, "weekly": 4}}
    del pool["snapshots"]
    (tank,) = kit.load(data).manifest.zfs.pools
    assert snapshot_policies(tank) == {"tank/home": {"hourly": 24, "weekly": 4}}


def test_a_bad_policy_is_reported_at_its_line(kit: Any) -> None:
    data = kit.base(storage=True)
    data["zfs"]["pools"][0]["datasets"][0]["snapshots"] = {"hourley": 24}
    text = kit.dump(data)
    diag = kit.error(text, "did you mean 'hourly'")
    assert diag.file == "m.yaml" and diag.line == kit.line_of(text, "hourley: 24")
    assert diag.path == "zfs.pools[0].datasets[0].snapshots.hourley"
    data["zfs"]["pools"][0]["datasets"][0]["snapshots"] = {"daily": -1}
    text = kit.dump(data)
    diag = kit.error(text, "greater than or equal to 0")
    assert diag.line == kit.line_of(text, "daily: -1")


# --------------------------------------------------------------------------- the node program
FAKE_ZFS = """#!/usr/bin/env python3
import json, sys
state = sys.argv[0] + ".json"
snaps = json.load(open(state))
cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "list":
    ds = args[-1]
    print("\\n".join(s for s in snaps if s.split("@")[0] == ds))
elif cmd == "snapshot":
    if args[0] in snaps or args[0].startswith("tank/broken@"):
        sys.exit("cannot create snapshot: dataset already exists")
    snaps.append(args[0])
elif cmd == "destroy":
    snaps.remove(args[0])
json.dump(snaps, open(state, "w"))
with open(sys.argv[0] + ".log", "a") as log:
    log.write(" ".join(sys.argv[1:3]) + "\\n")
"""


def program(tmp_path: Path, existing: list[str], policies: dict[str, dict[str, int]],
            *args: str) -> tuple[subprocess.CompletedProcess[str], list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "zfs"
    fake.write_text(FAKE_ZFS)
    fake.chmod(0o755)
    Path(f"{fake}.json").write_text(json.dumps(existing))
    config = tmp_path / "policies.json"
    config.write_text(json.dumps({"datasets": policies}))
    metrics = tmp_path / "textfile"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, snapshots.__file__, "--config", str(config), "--textfile-dir",
                           str(metrics), *args], capture_output=True, text=True, timeout=60, env=env, check=False)
    left = json.loads(Path(f"{fake}.json").read_text())
    prom = (metrics / snapshots.METRICS_FILE).read_text() if (metrics / snapshots.METRICS_FILE).exists() else ""
    return proc, left, prom


def test_the_program_takes_prunes_only_ours_and_writes_metrics(tmp_path: Path) -> None:
    foreign = [f"{DS}@manual", f"{DS}@provision-hourly-mine"]
    old = hourly(1, 2, 3)
    daily = [f"{DS}@provision-daily-20200101T000000Z"]
    proc, left, prom = program(tmp_path, [*foreign, *old, *daily, "tank/data@provision-hourly-20200101T000000Z"],
                               {DS: {"hourly": 2, "daily": 1}, "tank/data": {"daily": 3}}, "hourly")
    assert proc.returncode == 0, proc.stderr
    (taken,) = [s for s in left if s not in foreign + old + daily and s.startswith(DS)]
    assert snapshots.ours(DS, [taken])  # our name, now
    assert set(left) == {*foreign, hourly(3)[0], taken, *daily, "tank/data@provision-hourly-20200101T000000Z"}
    assert f"destroyed {hourly(1)[0]}" in proc.stdout and f"destroyed {hourly(2)[0]}" in proc.stdout
    assert 'provision_zfs_snapshot_run_success{frequency="hourly"} 1' in prom
    newest = snapshots.newest(DS, [taken])
    assert f'provision_zfs_snapshot_newest_timestamp_seconds{{dataset="{DS}"}} {newest}' in prom
    # tank/data keeps no hourly snapshots: the run leaves it alone; its newest is from 2020 (late)
    assert f'provision_zfs_snapshot_newest_timestamp_seconds{{dataset="tank/data"}} {at("20200101T000000Z")}' in prom


def test_a_failed_snapshot_fails_the_run_and_says_so_in_the_metrics(tmp_path: Path) -> None:
    proc, left, prom = program(tmp_path, hourly(1), {DS: {"hourly": 1}, "tank/broken": {"hourly": 1}}, "hourly")
    assert proc.returncode == 1
    assert "FAILED tank/broken: zfs snapshot tank/broken@provision-hourly-" in proc.stderr
    assert len(snapshots.ours(DS, left)) == 1 and hourly(1)[0] not in left  # the other dataset still ran
    assert 'provision_zfs_snapshot_run_success{frequency="hourly"} 0' in prom


def test_missing_takes_a_first_snapshot_only_where_there_is_none(tmp_path: Path) -> None:
    proc, left, prom = program(tmp_path, [f"{DS}@manual", "tank/data@provision-daily-20200101T000000Z"],
                               {DS: {"weekly": 2, "daily": 3}, "tank/data": {"daily": 1}}, "--missing")
    assert proc.returncode == 0, proc.stderr
    (took,) = proc.stdout.splitlines()
    assert took.startswith(f"took {DS}@provision-daily-")
    assert len(left) == 3
    assert "provision_zfs_snapshot_run_success{" not in prom  # no frequency ran
    assert f'provision_zfs_snapshot_newest_timestamp_seconds{{dataset="{DS}"}} 0' not in prom
    proc, _, _ = program(tmp_path, left, {DS: {"weekly": 2, "daily": 3}}, "--missing")
    assert proc.stdout == ""  # nothing to do: the role reports no change
