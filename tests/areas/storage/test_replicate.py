"""provisioner.areas.storage.replicate and the manifest's ``replicate``: which snapshots a run
sends (full, incremental from the newest common one, resume), when it refuses, what the
target prunes (never what is not ours), what a request over SSH may do, the metrics, the
validation messages at their lines, the role variables and the key; and the file run as the
node program on both sides, against a fake ``zfs`` and a fake ``ssh`` that runs ``serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.areas.storage import replicate, replication_key, snapshots
from provisioner.areas.storage.replicate import Listing, Refused, Snap
from provisioner.areas.storage.rolevars import node_vars
from provisioner.areas.storage.zfs import replications
from provisioner.plan import cluster_fingerprint, compute, node_sections
from provisioner.state import NodeState, State

SRC, DST = "tank/data", "backup/data"
H = [f"provision-hourly-20251127T{h:02d}0000Z" for h in range(24)]


def src(*names: str) -> list[Snap]:
    return [Snap(f"{SRC}@{n}", f"g-{n}") for n in names]


def dst(*names: str) -> Listing:
    return Listing(True, tuple(Snap(f"{DST}@{n}", f"g-{n}") for n in names))


# --------------------------------------------------------------------------- what to send
def test_a_missing_replica_gets_a_full_send_of_our_newest() -> None:
    step = replicate.plan(SRC, src(H[1], "operator", H[2]), DST, Listing(False))
    assert (step.kind, step.send) == ("full", ("send", f"{SRC}@{H[2]}"))


def test_an_incremental_runs_from_the_replica_s_newest_to_our_newest() -> None:
    # the operator's snapshot after ours is not what we send up to; -I carries those between
    step = replicate.plan(SRC, src(H[1], H[2], "operator", H[3], "later-op"), DST, dst(H[1], H[2]))
    assert (step.kind, step.send) == ("incremental", ("send", "-I", f"{SRC}@{H[2]}", f"{SRC}@{H[3]}"))


def test_nothing_to_send_when_the_replica_has_our_newest_or_we_have_none() -> None:
    assert replicate.plan(SRC, src(H[1], H[2], "operator"), DST, dst(H[1], H[2])).kind == "none"
    assert replicate.plan(SRC, src("operator"), DST, Listing(False)).kind == "none"


def test_an_interrupted_receive_is_resumed_first() -> None:
    listing = Listing(True, dst(H[1]).snaps, "1-abc-def")
    step = replicate.plan(SRC, src(H[1], H[2]), DST, listing)
    assert (step.kind, step.send) == ("resume", ("send", "-t", "1-abc-def"))
    listing = replicate.parse_listing(replicate.listing_text(True, "", f"{DST}@{H[1]}\tg-{H[1]}\n"))
    assert replicate.plan(SRC, src(H[1], H[2]), DST, listing).kind == "incremental"


def test_refusals_instead_of_destroying_on_the_target() -> None:
    with pytest.raises(Refused, match="newer than backup/data@provision-hourly-20251127T010000Z"):
        replicate.plan(SRC, src(H[1], H[2]), DST, dst(H[1], "operator-on-target"))
    with pytest.raises(Refused, match="no snapshot in common"):
        replicate.plan(SRC, src(H[5], H[6]), DST, dst(H[1], H[2]))
    with pytest.raises(Refused, match="holds no snapshot"):
        replicate.plan(SRC, src(H[1]), DST, Listing(True))
    # the same name is not the same snapshot: guids decide
    other = Listing(True, (Snap(f"{DST}@{H[1]}", "elsewhere"),))
    with pytest.raises(Refused, match="no snapshot in common"):
        replicate.plan(SRC, src(H[1], H[2]), DST, other)


def test_a_stale_resume_token_is_aborted_only_for_a_send_that_cannot_work() -> None:
    assert replicate.send_is_stale(1, "cannot resume send: 'tank/data@x' used in the initial send no longer exists")
    assert replicate.send_is_stale(255, "cannot resume send: invalid resume token")
    assert not replicate.send_is_stale(1, "broken pipe")
    assert not replicate.send_is_stale(0, "no longer exists")


# --------------------------------------------------------------------------- the target
def test_the_target_prunes_only_ours_beyond_the_retention_and_keeps_its_newest() -> None:
    names = [f"{DST}@{n}" for n in ("operator", H[1], H[2], H[3], "provision-hourly-x", H[4])]
    daily = f"{DST}@provision-daily-20251126T000000Z"
    assert replicate.to_prune(DST, [*names, daily], {"hourly": 2, "daily": 1}) == [f"{DST}@{H[1]}", f"{DST}@{H[2]}"]
    # a policy that keeps 0 of a frequency (dropped since) prunes none of that frequency
    assert replicate.to_prune(DST, [*names, daily], {"hourly": 0, "daily": 1}) == []
    # the newest of ours stays even where its frequency's count would let it go
    assert replicate.to_prune(DST, [f"{DST}@{H[1]}", daily], {"hourly": 1, "daily": 1}) == []


def test_a_request_over_ssh_is_one_verb_on_one_replica_of_this_node() -> None:
    allowed = [DST, "backup/home"]
    assert replicate.parse_request(f"recv {DST}", allowed) == ("recv", DST)
    assert replicate.parse_request(f"list {DST}", allowed) == ("list", DST)
    for bad, why in ((f"destroy {DST}", "only list, recv, abort"), ("recv backup/other", "not a replica"),
                     (f"recv {DST}; rm -rf /", "only list, recv, abort"), ("", "only list"),
                     (f"recv {DST} -F", "only list")):
        with pytest.raises(ValueError, match=why):
            replicate.parse_request(bad, allowed)


def test_delegation_is_asked_for_only_where_permissions_are_missing() -> None:
    shown = ("---- Permissions on backup ------\nLocal+Descendent permissions:\n"
             "\tuser zfsrecv create,mount,receive\n\tuser zfsrecvx destroy\n")
    assert replicate.missing_permissions(shown, "zfsrecv") == ["destroy"]
    assert replicate.missing_permissions(shown.replace("mount,", "destroy,mount,"), "zfsrecv") == []
    assert replicate.missing_permissions("", "zfsrecv") == list(replicate.PERMISSIONS)


def test_the_authorized_key_allows_the_forced_command_alone() -> None:
    line = replicate.authorized_key_line("ssh-ed25519 AAAA k\n", "/p.py", "/c.json", ["10.0.2.10", "10.0.2.12"])
    assert line == ('restrict,from="10.0.2.10,10.0.2.12",command="/usr/bin/python3 /p.py serve --config /c.json" '
                    "ssh-ed25519 AAAA k")


def test_listing_round_trip_and_metrics_round_trip() -> None:
    text = replicate.listing_text(True, "1-tok", f"{DST}@{H[1]}\t11\n{DST}@{H[2]}\t12\n")
    assert replicate.parse_listing(text) == Listing(True, (Snap(f"{DST}@{H[1]}", "11"), Snap(f"{DST}@{H[2]}", "12")),
                                                    "1-tok")
    assert replicate.parse_listing("absent\n") == Listing(False)
    with pytest.raises(ValueError):
        replicate.parse_listing("Permission denied\n")
    rows = {(SRC, f"store01:{DST}"): {"success": 1.0, "last_success": 1764226800.0, "newest": 1764223200.0,
                                      "max_age": 7200.0}}
    prom = replicate.metrics_text(rows)
    assert f'provision_zfs_replication_run_success{{dataset="{SRC}",target="store01:{DST}"}} 1' in prom
    assert replicate.read_metrics(prom) == rows


def test_the_timer_runs_after_the_shortest_frequency_s_snapshots() -> None:
    assert replicate.calendar("hourly") == "*-*-* *:10:00"
    assert replicate.calendar("monthly") == "*-*-01 00:10:00"


# --------------------------------------------------------------------------- the manifest
def two_nodes(kit: Any) -> dict[str, Any]:
    """head01's tank replicated to store01's pool backup (both on the data network)."""
    data = kit.add_backup_store(kit.base(storage=True))
    data["zfs"]["pools"].append({"name": "backup", "node": "store01", "datasets": [{"name": "sets"}],
                                 "vdevs": {"type": "mirror", "width": 2, "disks": ["ata-BACKUP_[1-2]"]}})
    tank = data["zfs"]["pools"][0]
    tank["snapshots"] = {"hourly": 24, "daily": 7}
    tank["replicate"] = {"to": "store01", "pool": "backup"}
    tank["datasets"] = [{"name": "data"}, {"name": "home", "replicate": {"to": "store01", "pool": "backup",
                                                                          "dataset": "sets/home"}}]
    return data


def test_replications_per_dataset_or_the_pool_s_default(kit: Any) -> None:
    m = kit.load(two_nodes(kit)).manifest
    assert [(r.node, r.source, r.to, r.target, r.host, r.origin) for r in replications(m)] == [
        ("head01", "tank/data", "store01", "backup/data", "10.0.2.11", "10.0.2.10"),
        ("head01", "tank/home", "store01", "backup/sets/home", "10.0.2.11", "10.0.2.10"),
    ]
    sender, receiver = node_vars(m, m.node("head01")), node_vars(m, m.node("store01"))
    assert sender["zfs_replications"][0] == {"source": "tank/data", "to": "store01", "target": "backup/data",
                                             "host": "10.0.2.11", "policy": {"hourly": 24, "daily": 7}}
    assert sender["zfs_replication_calendar"] == "*-*-* *:10:00"
    assert receiver["zfs_replicas"]["backup/sets/home"] == {"parent": "backup/sets", "policy": {"hourly": 24,
                                                                                               "daily": 7}}
    assert receiver["zfs_replica_sources"] == ["10.0.2.10"]
    assert sender["zfs_replication_key_file"].endswith("/secrets/zfs-replication.key")
    assert "zfs_replicas" not in sender and "zfs_replications" not in receiver
    # management where a node is not on the data network
    data = two_nodes(kit)
    del data["nodes"][2]["interfaces"]["data"]
    (rep, _) = replications(kit.load(data).manifest)
    assert (rep.host, rep.origin) == ("10.0.0.11", "10.0.0.10")


def test_a_manifest_without_replication_gives_no_new_variables(kit: Any) -> None:
    m = kit.load(kit.base(storage=True)).manifest
    assert not [k for k in node_vars(m, m.node("head01")) if "replica" in k]


@pytest.mark.parametrize(("change", "needle", "message"), [
    (lambda d: d["zfs"]["pools"][0]["replicate"].update(to="store99"), "to: store99",
     "'store99' is not a node of the manifest"),
    (lambda d: d["zfs"]["pools"][0]["replicate"].update(to="node01"), "to: node01",
     "node01 is not a storage node"),
    (lambda d: d["zfs"]["pools"][0]["replicate"].update(pool="vault"), "pool: vault",
     "store01 has no pool 'vault' (its pools: backup)"),
    (lambda d: d["zfs"]["pools"][0]["datasets"][1]["replicate"].update(to="head01", pool="tank", dataset="home"),
     "to: head01", "tank/home cannot be replicated onto itself"),
    (lambda d: d["zfs"]["pools"][0]["datasets"][1]["replicate"].update(dataset="sets"), "dataset: sets",
     "the replica backup/sets on store01 is a dataset of the manifest"),
    (lambda d: d["zfs"]["pools"][0]["datasets"][1]["replicate"].update(dataset="x/home"), "dataset: x/home",
     "the replica's parent backup/x is not a dataset of store01's pool backup"),
    (lambda d: d["zfs"]["pools"][0]["datasets"][1]["replicate"].update(dataset="data"), "dataset: data",
     "tank/home and tank/data are both replicated to backup/data on store01"),
    (lambda d: d["zfs"]["pools"][0]["datasets"][1].update(snapshots={}), "dataset: sets/home",
     "tank/home takes no snapshots"),
    (lambda d: d["zfs"]["pools"][0]["replicate"].update(dataset="all"), "dataset: all",
     "a pool's replicate cannot name one dataset for all of them"),
])
def test_replication_problems_are_reported_at_their_line(kit: Any, change: Any, needle: str, message: str) -> None:
    data = two_nodes(kit)
    change(data)
    text = kit.dump(data)
    diag = kit.error(text, message)
    assert diag.file == "m.yaml"
    assert diag.line in range(kit.line_of(text, needle) - 3, kit.line_of(text, needle) + 1), (diag.format(), text)


def test_plan_shows_replication_as_a_storage_change_of_both_nodes_alone(kit: Any) -> None:
    data = two_nodes(kit)
    del data["zfs"]["pools"][0]["replicate"], data["zfs"]["pools"][0]["datasets"][1]["replicate"]
    before = kit.load(data).manifest
    state = State(cluster=before.cluster.name, cluster_fingerprint=cluster_fingerprint(before),
                  nodes={n.name: NodeState(lifecycle="configured", fingerprints=node_sections(before, n))
                         for n in before.nodes})
    plan = compute(kit.load(two_nodes(kit)).manifest, state, [])
    nodes = {n.name: n for n in plan.nodes}
    assert nodes["head01"].status == nodes["store01"].status == "changed"
    assert nodes["head01"].sections == nodes["store01"].sections == ["storage"]
    assert nodes["node01"].status == "unchanged" and plan.targets == ["head01", "store01"]


def test_the_key_is_made_once_and_scanned_for(tmp_path: Path) -> None:
    key = tmp_path / "secrets" / replication_key.KEY_NAME
    replication_key.ensure_key(key, "testc")
    first = key.read_text()
    assert (key.stat().st_mode & 0o777) == 0o600 and key.with_name(key.name + ".pub").read_text().startswith(
        "ssh-ed25519 ")
    replication_key.ensure_key(key, "testc")
    assert key.read_text() == first
    key.with_name(key.name + ".pub").unlink()
    with pytest.raises(ValueError, match="without its other half"):
        replication_key.ensure_key(key, "testc")

    class State:
        secrets = tmp_path / "secrets"
    values = replication_key.secret_values(State())  # type: ignore[arg-type]
    assert values and all(v in first and "PRIVATE" not in v for v in values)


# --------------------------------------------------------------------------- the node program
# One fake zfs for both sides: a JSON file of {dataset: [[snapshot, guid], ...]}. A send
# writes the snapshots it carries (JSON) to stdout, a recv reads them and appends them.
FAKE_ZFS = """#!/usr/bin/env python3
import json, os, sys
state = os.environ["FAKE_ZFS_STATE"]
pools = json.load(open(state))
cmd, args = sys.argv[1], sys.argv[2:]
with open(state + ".log", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
def snaps(ds):
    return pools[ds]
if cmd == "list":
    ds = args[-1]
    if ds not in pools:
        sys.exit(f"cannot open '{ds}': dataset does not exist")
    print("\\n".join(f"{ds}@{n}\\t{g}" for n, g in pools[ds]))
elif cmd == "get":
    ds = args[-1]
    if ds not in pools:
        sys.exit(f"cannot open '{ds}': dataset does not exist")
    print(pools.get("token:" + ds, "-"))
elif cmd == "send":
    if args[0] == "-t":
        sys.exit("cannot resume send: 'tank/data@gone' used in the initial send no longer exists")
    if args[0] == "-I":
        ds, base = args[1].split("@"); top = args[2].split("@")[1]
        names = [n for n, _ in snaps(ds)]
        carried = snaps(ds)[names.index(base) + 1 : names.index(top) + 1]
        sys.stdout.write(json.dumps({"base": base, "snaps": carried}))
    else:
        ds, top = args[0].split("@")
        sys.stdout.write(json.dumps({"base": None, "snaps": [s for s in snaps(ds) if s[0] == top]}))
elif cmd == "recv":
    if args[0] == "-A":
        pools.pop("token:" + args[1], None)
    else:
        ds = args[-1]
        stream = json.loads(sys.stdin.read())
        if stream["base"] is None:
            if ds in pools:
                sys.exit("destination exists")
            pools[ds] = []
        elif pools[ds][-1][0] != stream["base"]:
            sys.exit("destination has snapshots after the base")
        pools[ds] += stream["snaps"]
elif cmd == "destroy":
    ds, name = args[0].split("@")
    pools[ds] = [s for s in pools[ds] if s[0] != name]
json.dump(pools, open(state, "w"))
"""

# ssh: the last argument is the request; run the forced command as sshd would
FAKE_SSH = """#!/bin/sh
for last; do :; done
SSH_ORIGINAL_COMMAND="$last" exec "$PY" "$PROGRAM" serve --config "$TARGET_CONFIG"
"""


def node_program(tmp_path: Path, pools: dict[str, Any]) -> Any:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("zfs", FAKE_ZFS), ("ssh", FAKE_SSH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "zfs.json"
    state.write_text(json.dumps(pools))
    policy = {"hourly": 2}
    source = tmp_path / "source.json"
    source.write_text(json.dumps({"key": "/k", "known_hosts": "/kh", "timeout": 60, "replications": [
        {"source": SRC, "to": "store01", "target": DST, "host": "10.0.2.11", "policy": policy}]}))
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"replicas": {DST: {"parent": "backup", "policy": policy}}}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_ZFS_STATE": str(state),
           "PY": sys.executable, "PROGRAM": replicate.__file__, "TARGET_CONFIG": str(target)}
    metrics = tmp_path / "textfile"

    def run() -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
        proc = subprocess.run([sys.executable, replicate.__file__, "run", "--config", str(source), "--textfile-dir",
                               str(metrics)], capture_output=True, text=True, timeout=60, env=env, check=False)
        prom = (metrics / replicate.METRICS_FILE).read_text()
        return proc, json.loads(state.read_text()), prom
    return run


def test_the_program_sends_full_then_incremental_and_the_target_prunes_only_ours(tmp_path: Path) -> None:
    pools: dict[str, Any] = {SRC: [[H[1], "g1"], ["operator", "g-op"], [H[2], "g2"]], "backup": []}
    run = node_program(tmp_path, pools)
    proc, state, prom = run()
    assert proc.returncode == 0, proc.stderr
    assert state[DST] == [[H[2], "g2"]] and "full send" in proc.stdout
    assert f'provision_zfs_replication_run_success{{dataset="{SRC}",target="store01:{DST}"}} 1' in prom
    # new snapshots of ours (and an operator's between them) go over incrementally; the
    # target keeps 2 of ours and the operator's
    pools = {**state, SRC: [*state[SRC], [H[3], "g3"], ["operator2", "g-op2"], [H[4], "g4"]]}
    (tmp_path / "zfs.json").write_text(json.dumps(pools))
    proc, state, prom = run()
    assert proc.returncode == 0, proc.stderr
    assert [n for n, _ in state[DST]] == [H[3], "operator2", H[4]], state[DST]
    assert f"destroyed {DST}@{H[2]}" in proc.stdout
    proc, state2, _ = run()
    assert proc.returncode == 0 and state2 == state and "up to date" in proc.stdout


def test_a_failed_run_says_so_keeps_the_last_success_and_aborts_a_stale_resume(tmp_path: Path) -> None:
    pools: dict[str, Any] = {SRC: [[H[1], "g1"]], "backup": []}
    run = node_program(tmp_path, pools)
    proc, state, prom = run()
    assert proc.returncode == 0, proc.stderr
    first = replicate.read_metrics(prom)[(SRC, f"store01:{DST}")]
    state[f"token:{DST}"] = "1-stale"
    (tmp_path / "zfs.json").write_text(json.dumps(state))
    proc, state, prom = run()
    assert proc.returncode == 1 and "FAILED tank/data" in proc.stderr
    assert f"token:{DST}" not in state  # aborted: the next run plans afresh
    row = replicate.read_metrics(prom)[(SRC, f"store01:{DST}")]
    assert row["success"] == 0 and row["last_success"] == first["last_success"]
    proc, _, prom = run()
    assert proc.returncode == 0 and replicate.read_metrics(prom)[(SRC, f"store01:{DST}")]["success"] == 1


def test_serve_refuses_anything_but_its_verbs(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"replicas": {DST: {"parent": "backup", "policy": {"hourly": 2}}}}))
    proc = subprocess.run([sys.executable, replicate.__file__, "serve", "--config", str(target)],
                          env={**os.environ, "SSH_ORIGINAL_COMMAND": "zfs destroy -r backup"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "refused" in proc.stderr


def test_the_program_imports_snapshots_beside_it_on_a_node(tmp_path: Path) -> None:
    """The role installs both files under these names: the replication program must run
    from there without the package."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "provision_zfs_snapshot.py").write_text(Path(snapshots.__file__).read_text())
    (lib / "provision_zfs_replicate.py").write_text(Path(replicate.__file__).read_text())
    proc = subprocess.run([sys.executable, "-E", "-s", str(lib / "provision_zfs_replicate.py"), "--help"],
                          capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert proc.returncode == 0 and "serve" in proc.stdout, proc.stderr
