"""provisioner.runner (event folding, secret hygiene, Ansible settings) and the pure parts of
provisioner.apply (the targets inventory, recording a run's result)."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.plugins.connection.ssh import Connection

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:  # tests/emulators is imported as "emulators"
    sys.path.insert(0, str(TESTS))

from emulators.ssh import FakeSshServer, StallingProxy, new_host_key, public_line  # noqa: E402

from provisioner.apply import (  # noqa: E402
    TARGETS_GROUP,
    ApplyOptions,
    declared_secret_envs,
    known_secret_values,
    record_result,
    targets_inventory,
    unreachable_now,
)
from provisioner.errors import ProvisionError  # noqa: E402
from provisioner.plan import PlaySpec, cluster_fingerprint, compute, node_sections  # noqa: E402
from provisioner.runner import (  # noqa: E402
    DEFAULT_STALL_TIMEOUT,
    MAX_FORKS,
    HostProgress,
    Reach,
    RunResult,
    SshTarget,
    Tracker,
    ansible_env,
    first_contact,
    forks_for,
    login_verdict,
    probe_reach,
    probe_ssh,
    render_diff,
    scan_for_secrets,
    scrubbed_environ,
    secret_env_names,
    strategy_env,
    unreachable_reason,
)
from provisioner.settings import TASK_CAP_ENV  # noqa: E402
from provisioner.state import NodeState, State, StateDir  # noqa: E402

PLAYS = [
    PlaySpec("common - base", "all:&{{ provision_targets | default('all') }}", "common.yml"),
    PlaySpec("common - hosts", "all", "common.yml"),
]


def ev(kind: str, **data: Any) -> dict[str, Any]:
    return {"event": kind, "event_data": data}


# --------------------------------------------------------------------------- Tracker
def test_tracker_folds_events() -> None:
    seen: list[int] = []
    t = Tracker(["a", "b"], on_change=lambda tr: seen.append(tr.hosts["a"].ok + tr.hosts["a"].changed))
    events = [
        ev("playbook_on_start"),
        ev("playbook_on_play_start", play="common - base"),
        ev("runner_on_start", host="a", task="Install packages", role="common"),
        ev("runner_on_ok", host="a", task="Install packages", res={"changed": True}),
        ev("runner_on_ok", host="a", task="Check", res={"changed": False}),
        ev("runner_on_ok", host="b", res={}),
        ev("runner_on_skipped", host="b", task="Only on GPU"),
        ev("verbose", stdout="noise"),
    ]
    assert all(t.handle(e) is True for e in events)
    a, b = t.hosts["a"], t.hosts["b"]
    assert t.play == "common - base"
    assert (a.ok, a.changed, a.failed, a.skipped) == (1, 1, 0, 0)
    assert (a.role, a.task) == ("common", "Install packages")
    assert (b.ok, b.changed, b.skipped) == (1, 0, 1)
    assert a.status == b.status == "ok"
    assert seen == [0, 0, 1, 2, 2, 2]  # the play start and host events; not playbook_on_start, verbose


def test_tracker_failed_and_unreachable() -> None:
    t = Tracker(["a", "b", "c"])
    t.handle(ev("runner_on_failed", host="a", task="Create pool", res={"msg": "first line\nzpool: no such disk"}))
    t.handle(ev("runner_on_unreachable", host="b", res={"msg": "ssh: connect to host b port 22: Connection refused"}))
    t.handle(ev("runner_on_failed", host="c", task="Optional", ignore_errors=True, res={"msg": "meh"}))
    a, b, c = t.hosts["a"], t.hosts["b"], t.hosts["c"]
    assert (a.failed, a.status, a.errors) == (1, "failed", ["Create pool: zpool: no such disk"])
    assert (b.unreachable, b.status) == (True, "unreachable")
    assert b.errors == ["unreachable: ssh: connect to host b port 22: Connection refused"]
    assert (c.failed, c.status, c.errors) == (0, "ok", [])  # ignore_errors does not fail the host


def test_tracker_hides_censored_no_log_results() -> None:
    t = Tracker(["a"])
    secret = "hunter2-munge-key"
    t.handle(
        ev(
            "runner_on_failed",
            host="a",
            task="Write munge key",
            res={
                "censored": "the output has been hidden due to the fact that 'no_log: true' was specified",
                "msg": f"bad key {secret}",
            },
        )
    )
    assert t.hosts["a"].errors == ["Write munge key: (output hidden: task handles secrets)"]
    assert secret not in repr(t.hosts)


def test_tracker_failure_message_fallbacks() -> None:
    t = Tracker([])
    t.handle(ev("runner_on_failed", host="x", task="T1", res={"stderr": "E: Unable to locate package foo\n"}))
    t.handle(ev("runner_on_failed", host="x", task="T2", res={}))
    t.handle(ev("runner_on_failed", host="x", task="T3", res={"msg": "y" * 1000}))
    t.handle(ev("runner_on_failed", remote_addr="10.0.0.5", task="T4", res={"reason": "timeout"}))
    assert t.hosts["x"].errors[:2] == ["T1: E: Unable to locate package foo", "T2: failed"]
    assert len(t.hosts["x"].errors[2]) == len("T3: ") + 300
    assert t.hosts["10.0.0.5"].errors == ["T4: timeout"]  # hosts not known up front are added


def test_tracker_ignores_events_without_host() -> None:
    t = Tracker(["a"])
    t.handle(ev("runner_on_ok", res={"changed": True}))
    t.handle({"event": "runner_on_ok"})
    t.handle({})
    assert t.hosts == {"a": HostProgress("a")}


def test_run_result_failed_hosts() -> None:
    hosts = {"b": HostProgress("b", failed=1), "a": HostProgress("a", unreachable=True), "c": HostProgress("c")}
    assert RunResult(2, "failed", hosts, Path("/x")).failed_hosts == ["a", "b"]


# --------------------------------------------------------------------------- environment
def test_secret_env_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        monkeypatch.delenv(name)
    secret_like = ["BMC_PASSWORD", "DB_PASSWD", "API_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_PRIVATE_KEY",
                   "LDAP_PASS", "vault_token", "MY_CREDENTIALS"]  # fmt: skip
    harmless = ["HOME", "PATH", "PASSAGE", "COMPASS_DIR", "USER", "BMC_USER"]
    for name in secret_like + harmless + ["PLAIN_NAME"]:
        monkeypatch.setenv(name, "v")
    assert secret_env_names(set()) == set(secret_like)
    assert secret_env_names({"PLAIN_NAME", "NOT_SET_AT_ALL"}) == {*secret_like, "PLAIN_NAME"}


def test_scrubbed_environ_removes_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_PASSWORD", "p1")
    monkeypatch.setenv("KEEP_ME", "k")
    monkeypatch.delenv("NOT_THERE", raising=False)
    with scrubbed_environ({"X_PASSWORD", "NOT_THERE"}):
        assert "X_PASSWORD" not in os.environ
        assert os.environ["KEEP_ME"] == "k"
    assert os.environ["X_PASSWORD"] == "p1"
    assert "NOT_THERE" not in os.environ


def test_scrubbed_environ_restores_after_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_TOKEN", "t")
    with pytest.raises(RuntimeError), scrubbed_environ({"X_TOKEN"}):
        assert "X_TOKEN" not in os.environ
        raise RuntimeError
    assert os.environ["X_TOKEN"] == "t"


def test_scan_for_secrets(tmp_path: Path) -> None:
    (tmp_path / "artifacts" / "job_events").mkdir(parents=True)
    leak = tmp_path / "artifacts" / "job_events" / "3-ok.json"
    leak.write_text('{"stdout": "password is S3cretValue!"}')
    binary = tmp_path / "artifacts" / "blob"
    binary.write_bytes(b"\x00\x01" + b"deadbeefcafe" + b"\xff")
    clean = tmp_path / "artifacts" / "stdout"
    clean.write_text("PLAY RECAP ok=3")
    assert sorted(scan_for_secrets(tmp_path, ["S3cretValue!", "deadbeefcafe"])) == sorted([leak, binary])
    assert scan_for_secrets(tmp_path, ["abc"]) == []  # too short to search for
    assert scan_for_secrets(tmp_path, ["not-present-anywhere"]) == []
    assert scan_for_secrets(tmp_path, []) == []
    assert scan_for_secrets(tmp_path / "missing", ["S3cretValue!"]) == []


@pytest.mark.parametrize(
    ("nodes", "forks"), [(0, 5), (1, 5), (5, 5), (6, 6), (17, 17), (50, 50), (51, 50), (10_000, 50)]
)
def test_forks_for(nodes: int, forks: int) -> None:
    assert forks_for(nodes) == forks
    assert 5 <= forks_for(nodes) <= MAX_FORKS


def test_ansible_env(tmp_path: Path) -> None:
    sd = StateDir(tmp_path / ".provision")
    env = ansible_env(sd, tmp_path / "root", 12, strategy="linear")
    assert env["ANSIBLE_FORKS"] == "12"
    assert env["ANSIBLE_ROLES_PATH"] == str(tmp_path / "root" / "roles")
    assert env["ANSIBLE_CACHE_PLUGIN"] == "jsonfile"
    assert "ANSIBLE_CACHE_PLUGIN_CONNECTION" not in env  # ansible-runner's, per run
    assert env["ANSIBLE_PIPELINING"] == "True"
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert f"UserKnownHostsFile=\"{sd.known_hosts}\"" in env["ANSIBLE_SSH_ARGS"]
    assert "StrictHostKeyChecking=accept-new" in env["ANSIBLE_SSH_ARGS"]
    assert "ControlPersist" in env["ANSIBLE_SSH_ARGS"]
    if "PATH" in env:
        assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert all(isinstance(v, str) for v in env.values())
    assert not any(secret in k for k in env for secret in ("PASSWORD", "TOKEN"))


# --------------------------------------------------------------------------- apply helpers
def test_targets_inventory() -> None:
    text = targets_inventory(["gpu01", "gpu03"])
    assert text.startswith("# ")
    assert yaml.safe_load(text) == {"all": {"children": {TARGETS_GROUP: {"hosts": {"gpu01": None, "gpu03": None}}}}}
    empty = yaml.safe_load(targets_inventory([]))
    assert empty["all"]["children"][TARGETS_GROUP]["hosts"] == {}


def test_declared_and_known_secrets(kit: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = kit.base()
    data["nodes"][0]["bmc"] = {"type": "ipmi", "address": "10.0.1.10", "user": "a", "password_file": "/etc/pw"}
    loaded = kit.load(data)
    assert declared_secret_envs(loaded) == {"TEST_BMC_PASSWORD"}
    sd = StateDir(tmp_path)
    sd.ensure()
    monkeypatch.delenv("TEST_BMC_PASSWORD", raising=False)
    assert known_secret_values(loaded, sd) == []
    monkeypatch.setenv("TEST_BMC_PASSWORD", "bmc-pass-123")
    (sd.secrets / "munge.key").write_bytes(b"\x01\x02\x03\x04")
    assert known_secret_values(loaded, sd) == ["bmc-pass-123", "01020304", "AQIDBA=="]


def _result(hosts: list[str], failed: tuple[str, ...] = (), rc: int | None = None) -> RunResult:
    progress = {h: HostProgress(h, failed=1 if h in failed else 0, changed=2, events=3) for h in hosts}
    return RunResult(
        rc if rc is not None else (2 if failed else 0), "failed" if failed else "successful", progress, Path("/x")
    )


def test_record_result_settles_every_node(kit: Any) -> None:
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State(cluster="testc")
    plan = compute(m, st, PLAYS)
    record_result(st, loaded, plan, _result(m.node_names()), m.node_names(), ApplyOptions())
    for node in m.nodes:
        ns = st.nodes[node.name]
        assert ns.fingerprints == node_sections(m, node)
        assert (ns.lifecycle, ns.last_result) == ("configured", "ok")
        assert ns.applied_at
        assert ns.recorded == {"slurm": "23.11"}  # the release it runs now (ubuntu-24.04's)
    assert st.cluster_fingerprint == cluster_fingerprint(m)
    again = compute(m, st, PLAYS)
    assert not again.has_changes
    assert again.targets == []


def test_record_result_skips_failed_nodes(kit: Any) -> None:
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State()
    plan = compute(m, st, PLAYS)
    record_result(st, loaded, plan, _result(m.node_names(), failed=("node01",)), m.node_names(), ApplyOptions())
    assert st.nodes["node01"].fingerprints == st.nodes["node01"].recorded == {}
    assert st.nodes["node01"].last_result == "failed"
    assert st.nodes["node01"].lifecycle == "new"
    assert st.nodes["node02"].fingerprints == node_sections(m, m.node("node02"))
    assert st.cluster_fingerprint is None  # a failed run does not settle cluster-wide files
    again = compute(m, st, PLAYS)
    assert again.targets == ["node01"]


def test_record_result_with_limit(kit: Any) -> None:
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State()
    opts = ApplyOptions(limit=["node02"])
    plan = compute(m, st, PLAYS, limit=opts.limit)
    record_result(st, loaded, plan, _result(["node02"]), ["node02"], opts)
    assert set(st.nodes) == {"node02"}
    assert st.cluster_fingerprint is None


def test_record_result_records_removed_nodes_only_after_a_clean_full_run(kit: Any) -> None:
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State(nodes={"gone": NodeState(lifecycle="configured", fingerprints={"node": "x"})})
    plan = compute(m, st, PLAYS)
    record_result(st, loaded, plan, _result(m.node_names(), failed=("head01",)), m.node_names(), ApplyOptions())
    assert st.nodes["gone"].lifecycle == "configured"
    plan = compute(m, st, PLAYS)
    record_result(st, loaded, plan, _result(m.node_names()), m.node_names(), ApplyOptions())
    gone = st.nodes["gone"]
    assert (gone.lifecycle, gone.fingerprints) == ("removed", {}) and gone.removed_at
    after = compute(m, st, PLAYS)  # a removal done is no change; the plan still lists it
    assert not after.has_changes and ("gone", "removed", "removed") in [(n.name, n.status, n.lifecycle)
                                                                         for n in after.nodes]


def test_record_result_settles_a_bmc_only_change(kit: Any) -> None:
    """A BMC change runs no node-local play; after the apply the plan must be quiet again."""
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State()
    record_result(st, loaded, compute(m, st, PLAYS), _result(m.node_names()), m.node_names(), ApplyOptions())
    data = kit.base()
    data["nodes"][0]["bmc"]["address"] = "10.0.1.99"
    loaded2 = kit.load(data)
    plan = compute(loaded2.manifest, st, PLAYS)
    assert plan.targets == []
    assert [n.sections for n in plan.nodes if n.status == "changed"] == [["bmc"]]
    record_result(st, loaded2, plan, _result(m.node_names()), m.node_names(), ApplyOptions())
    after = compute(loaded2.manifest, st, PLAYS)
    assert not after.has_changes, after.to_json()
    assert st.nodes["head01"].fingerprints == node_sections(loaded2.manifest, loaded2.manifest.node("head01"))


def test_record_result_does_not_settle_heavy_changes_of_non_targets(kit: Any) -> None:
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State()
    record_result(st, loaded, compute(m, st, PLAYS), _result(m.node_names()), m.node_names(), ApplyOptions())
    data = kit.base()
    data["nodes"][1]["hardware"]["memory_gb"] = 256
    loaded2 = kit.load(data)
    opts = ApplyOptions(limit=["head01"])
    plan = compute(loaded2.manifest, st, PLAYS, limit=opts.limit)
    record_result(st, loaded2, plan, _result(["head01"]), ["head01"], opts)
    assert {n.name for n in compute(loaded2.manifest, st, PLAYS).nodes if n.status == "changed"} == {"node01", "node02"}


# --------------------------------------------------------------------------- stall guard
def test_stall_guard_is_ansibles_task_timeout() -> None:
    env = ansible_env(StateDir(Path("/tmp/x")), Path("/tmp/root"), 3, stall_timeout=45)
    assert env["ANSIBLE_TASK_TIMEOUT"] == "45"
    assert env[TASK_CAP_ENV] == "45"  # given: it caps the roles' own bounds too
    default = ansible_env(StateDir(Path("/tmp/x")), Path("/tmp/root"), 3)
    assert default["ANSIBLE_TASK_TIMEOUT"] == str(DEFAULT_STALL_TIMEOUT)
    assert TASK_CAP_ENV not in default  # not given: the roles' own bounds stand



def test_tracker_names_the_stalled_task_and_its_bound() -> None:
    t = Tracker(["a", "b"])
    t.handle(ev("runner_on_start", host="a", task="common : Update the package lists", role="common"))
    t.handle(ev("runner_on_start", host="b", task="common : Update the package lists", role="common"))
    t.handle(ev("runner_on_ok", host="b", res={"changed": False}))
    # what ansible-core 2.19 reports when a task runs past its timeout
    t.handle(ev("runner_on_failed", host="a", task="common : Update the package lists",
                res={"changed": False, "msg": "Task failed: Timed out after 45 second(s).",
                     "timedout": {"frame": "...", "period": 45}}))
    a, b = t.hosts["a"], t.hosts["b"]
    assert a.status == "failed" and b.status == "ok"
    assert len(a.errors) == 1
    assert a.errors[0].startswith("common : Update the package lists: stalled: not finished after 45 s")
    assert "--stall-timeout" in a.errors[0]


def test_tracker_elapsed_time_and_retries_per_host() -> None:
    now = [100.0]
    t = Tracker(["a"], clock=lambda: now[0])
    t.handle(ev("runner_on_start", host="a", task="Install packages", role="common"))
    now[0] = 112.5
    assert t.hosts["a"].elapsed(t.clock()) == 12.5
    t.handle(ev("runner_retry", host="a", task="Install packages", res={"attempts": 2, "retries": 4}))
    assert t.hosts["a"].attempt == 2
    t.handle(ev("runner_on_ok", host="a", res={"changed": True}))
    assert t.hosts["a"].task_started is None and t.hosts["a"].elapsed(t.clock()) == 0.0
    t.handle(ev("runner_on_start", host="a", task="Next"))
    assert t.hosts["a"].attempt == 0  # a new task starts without retries


def test_strategy_env_linear_and_mitogen() -> None:
    linear = strategy_env("linear")
    assert linear["ANSIBLE_STRATEGY"] == "provision" and linear["PROVISION_STRATEGY_BASE"] == "linear"
    assert (Path(linear["ANSIBLE_STRATEGY_PLUGINS"]) / "provision.py").is_file()
    env = strategy_env("mitogen")
    assert env["ANSIBLE_STRATEGY"] == "provision" and env["PROVISION_STRATEGY_BASE"] == "mitogen_linear"
    assert env["ANSIBLE_TIMEOUT"] == "90"
    ours, mitogen = env["ANSIBLE_STRATEGY_PLUGINS"].split(os.pathsep)
    assert (Path(ours) / "provision.py").is_file() and (Path(mitogen) / "mitogen_linear.py").is_file()
    with pytest.raises(ProvisionError, match="unknown strategy 'fast'"):
        strategy_env("fast")


# --------------------------------------------------------------------------- first contact
FAKE_SSH = """#!/usr/bin/env python3
import sys, pathlib
args = sys.argv[1:]
opts = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
# appended, not read and rewritten: the contacts run in parallel (a rewrite loses a line)
with open(pathlib.Path(__file__).with_name("calls"), "a") as log:
    log.write(" ".join(args) + "\\n")
dest = args[-2]
if "10.0.0.9" in dest:
    print("ssh: connect to host 10.0.0.9 port 22: No route to host", file=sys.stderr)
    sys.exit(255)
known = pathlib.Path(opts["UserKnownHostsFile"].strip('"'))
host = dest.split("@")[1]
port = args[args.index("-p") + 1]
entry = host if port == "22" else f"[{host}]:{port}"
with open(known, "a") as f:
    f.write(f"{entry} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey{host.replace('.', '')}\\n")
"""


def test_first_contact_records_only_new_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld\n")
    targets = [SshTarget("head", "10.0.0.1"), SshTarget("gpu01", "10.0.0.2", port=2222, private_key="/k"),
               SshTarget("gpu02", "10.0.0.9")]
    failed = first_contact(known, targets)
    assert failed == {"gpu02": "ssh: connect to host 10.0.0.9 port 22: No route to host"}
    calls = (bindir / "calls").read_text().splitlines()
    assert len(calls) == 2  # head was known: not contacted
    gpu01 = next(c for c in calls if "10.0.0.2" in c)  # contacts run in parallel
    assert "StrictHostKeyChecking=accept-new" in gpu01 and "BatchMode=yes" in gpu01
    assert "-i /k" in gpu01 and gpu01.endswith("root@10.0.0.2 true")
    assert "[10.0.0.2]:2222 ssh-ed25519" in known.read_text()
    # a second run meets nobody new (the unreachable node is tried again)
    first_contact(known, targets)
    assert len((bindir / "calls").read_text().splitlines()) == 3


def test_mitogen_runs_without_ssh_multiplexing(tmp_path: Path) -> None:
    sd = StateDir(tmp_path)
    linear = ansible_env(sd, tmp_path, 3, strategy="linear")["ANSIBLE_SSH_ARGS"]
    mitogen = ansible_env(sd, tmp_path, 3, strategy="mitogen")["ANSIBLE_SSH_ARGS"]
    assert ansible_env(sd, tmp_path, 3)["ANSIBLE_SSH_ARGS"] == mitogen  # the default
    assert "ControlMaster=auto" in linear and "ControlPersist=120s" in linear
    assert "ControlMaster=no" in mitogen and "ControlPersist" not in mitogen
    assert f"UserKnownHostsFile=\"{sd.known_hosts}\"" in mitogen


# --------------------------------------------------------------------------- reachability probe
KEXINIT = struct.pack(">IBB", 12, 10, 20) + bytes(10)  # packet length, padding length, SSH_MSG_KEXINIT


class OneShotServer:
    """A TCP server on 127.0.0.1 that answers one connection with ``greeting`` (or nothing,
    holding it open), then, when ``after`` is given, reads the client's identification line
    and sends ``after`` (None: holds the connection open, stalled); then closes."""

    def __init__(self, greeting: bytes | None, after: bytes | None = b"", hold: float = 3,
                 request_first: bool = False) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.greeting = greeting
        self.after = after
        self.hold = hold
        self.request_first = request_first  # a web server: it answers only once a request line came
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.settimeout(self.hold)
                if self.greeting is None:
                    time.sleep(self.hold)
                    return
                if self.request_first and b"\n" not in conn.recv(256):
                    return
                conn.sendall(self.greeting)
                if self.after == b"":
                    return
                conn.recv(256)
                if self.after is None:
                    time.sleep(self.hold)
                    return
                conn.sendall(self.after)
                time.sleep(self.hold)  # stalled after it, as far as the client can tell

    def close(self) -> None:
        self.sock.close()


def test_probe_needs_an_ssh_banner_not_just_a_tcp_answer() -> None:
    """Issue 18 item 2: anything accepting TCP on port 22 (a firewall, NAT, another
    machine) counted as 'answers SSH' and marked a new node installed for good."""
    sshd = OneShotServer(b"Welcome banner of a chatty server\r\nSSH-2.0-OpenSSH_9.2p1 Debian\r\n", KEXINIT)
    web = OneShotServer(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    silent = OneShotServer(None)
    try:
        reach = probe_ssh("127.0.0.1", sshd.port, timeout=5)
        assert reach.ok and reach.banner == "SSH-2.0-OpenSSH_9.2p1 Debian"
        closed = probe_ssh("127.0.0.1", web.port, timeout=5)
        assert not closed.ok and "without an SSH banner" in closed.reason
        quiet = probe_ssh("127.0.0.1", silent.port, timeout=5, banner_timeout=0.5)
        assert not quiet.ok and "sent no SSH banner" in quiet.reason
    finally:
        for server in (sshd, web, silent):
            server.close()
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    refused = probe_ssh("127.0.0.1", free, timeout=5)
    assert not refused.ok and refused.reason == f"connection refused (127.0.0.1:{free})"


def test_unreachable_nodes_fail_at_once_in_words(kit: Any) -> None:
    """Issue 18 item 13: a refused or unroutable node fails before Ansible spends its
    connect timeout and retries on it; the others are left to Ansible."""
    loaded = kit.load(kit.base())
    head = str(loaded.manifest.node("head01").ip)

    def probe(address: str, port: int) -> Reach:
        return Reach(True, banner="SSH-2.0-x") if address == head else Reach(False, "no route to host (x:22)")

    assert unreachable_now(loaded, ["head01", "node01"], probe=probe) == {"node01": "no route to host (x:22)"}
    assert unreachable_now(loaded, [], probe=probe) == {}


def test_unreachable_reason_says_it_once_in_words() -> None:
    res = {"msg": "Task failed: Failed to connect to the host via ssh: [Errno 32] Broken pipe. [Errno 32] Broken pipe"}
    assert unreachable_reason(res) == "broken pipe (the other end closed the connection)"
    res = {"msg": "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.5 port 22: No route to host"}
    assert unreachable_reason(res) == "ssh: connect to host 10.0.0.5 port 22: No route to host"
    assert unreachable_reason({}) == "the host could not be reached over SSH"
    t = Tracker(["a"])
    t.handle(ev("runner_on_unreachable", host="a", res=res))
    assert t.hosts["a"].errors == [f"unreachable: {unreachable_reason(res)}"]
    assert RunResult(4, "failed", t.hosts, Path("/x")).result_of("a") == "unreachable"


# --------------------------------------------------------------------------- what ran where
def test_a_node_gets_a_result_only_from_what_ran_on_it() -> None:
    t = Tracker(["ran", "idle", "bad"])
    t.handle(ev("runner_on_start", host="ran", task="T"))
    t.handle(ev("runner_on_ok", host="ran", res={}))
    t.handle(ev("runner_on_failed", host="bad", task="T", res={"msg": "no"}))
    t.handle(ev("playbook_on_stats"))
    done = RunResult(2, "failed", t.hosts, Path("/x"), finished=t.finished)
    assert {h: done.result_of(h) for h in t.hosts} == {"ran": "ok", "idle": "not run", "bad": "failed"}
    stopped = RunResult(254, "canceled", t.hosts, Path("/x"), finished=False, interrupted=15)
    assert stopped.result_of("ran") == "interrupted" and stopped.result_of("idle") == "not run"


def test_record_result_gives_nodes_that_did_not_run_no_result(kit: Any) -> None:
    """Issue 18 item 6: nodes never contacted were recorded `ok` with a new applied_at."""
    loaded = kit.load(kit.base())
    m = loaded.manifest
    st = State()
    plan = compute(m, st, PLAYS)
    hosts = {"head01": HostProgress("head01", ok=3, events=3), "node01": HostProgress("node01"),
             "node02": HostProgress("node02", unreachable=True, errors=["unreachable: no route to host"])}
    record_result(st, loaded, plan, RunResult(4, "failed", hosts, Path("/r/x/artifacts/artifacts")),
                  m.node_names(), ApplyOptions())
    assert st.nodes["head01"].last_result == "ok" and st.nodes["head01"].applied_at
    for name, word in (("node01", "not run"), ("node02", "unreachable")):
        ns = st.nodes[name]
        assert (ns.last_result, ns.applied_at, ns.fingerprints, ns.lifecycle) == (word, None, {}, "new")
    assert st.cluster_fingerprint is None


# --------------------------------------------------------------------------- --check --diff
def test_check_mode_diffs_are_collected_per_node() -> None:
    t = Tracker(["a"])
    t.handle(ev("runner_on_ok", host="a", task="Render /etc/hosts",
                res={"changed": True, "diff": [{"before": "10.0.0.1 a\n", "after": "10.0.0.1 a\n10.0.0.2 b\n",
                                                "before_header": "/etc/hosts", "after_header": "/etc/hosts"}]}))
    t.handle(ev("runner_item_on_ok", host="a", task="Users", res={"changed": True, "diff": {"prepared": "+ops"}}))
    t.handle(ev("runner_on_ok", host="a", task="Users", res={"changed": True, "results": [{}], "diff": {}}))
    t.handle(ev("runner_on_ok", host="a", task="Unchanged", res={"changed": False, "diff": {"before": "x"}}))
    diffs = t.hosts["a"].diffs
    assert [task for task, _ in diffs] == ["Render /etc/hosts", "Users"]
    assert "--- /etc/hosts\n+++ /etc/hosts\n" in diffs[0][1] and "+10.0.0.2 b\n" in diffs[0][1]
    assert diffs[1][1] == "+ops\n"
    assert render_diff({"before": {"state": "absent"}, "after": {"state": "directory"}}) == (
        '--- before\n+++ after\n@@ -1 +1 @@\n-state: "absent"\n+state: "directory"\n')


# --------------------------------------------------------------------------- paths with spaces
def spaced_known_hosts(tmp_path: Path, key_line: str, port: int) -> Path:
    folder = tmp_path / "cluster dir ä" / ".provision"
    folder.mkdir(parents=True)
    known = folder / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {key_line}\n")
    return known


def test_ansibles_ssh_arguments_survive_a_path_with_spaces(tmp_path: Path) -> None:
    """Issue 18 item 10: `Could not resolve hostname cluster/.provision/known_hosts`. Split
    the arguments as Ansible does and let a real ssh check a real host key against the
    known_hosts file in a folder with a space and a non-ASCII letter."""
    key = new_host_key()
    with FakeSshServer(key) as sshd:
        known = spaced_known_hosts(tmp_path, public_line(key), sshd.port)
        sd = StateDir(known.parent)
        args = Connection._split_ssh_args(ansible_env(sd, tmp_path, 1, strategy="mitogen")["ANSIBLE_SSH_ARGS"])
        r = subprocess.run(["ssh", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", *args,
                            "-p", str(sshd.port), "nobody@127.0.0.1", "true"],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert "Host key verification failed" not in r.stderr, r.stderr  # the right file was read
    assert "Could not resolve hostname" not in r.stderr
    assert "Permission denied" in r.stderr or "closed" in r.stderr.lower(), r.stderr  # it got as far as logging in


def test_first_contact_records_into_a_path_with_spaces(tmp_path: Path) -> None:
    key = new_host_key()
    with FakeSshServer(key) as sshd:
        known = spaced_known_hosts(tmp_path, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld", 1)
        first_contact(known, [SshTarget("n1", "127.0.0.1", sshd.port, "nobody")], timeout=10)
    assert f"[127.0.0.1]:{sshd.port} {public_line(key)}" in known.read_text()


def test_a_path_ssh_cannot_take_is_refused_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match="double quote"):
        ansible_env(StateDir(tmp_path / 'say "hi"'), tmp_path, 1)


# ------------------------------------------------------------------- a node stalling at each step (issue 27 item 9)
STALL_BOUND = 0.5  # the probe's handshake bound in these cases (apply: 10 s)


def _stalled_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full: the kernel drops further SYNs, so a connect
    never completes (a node stalled at the TCP accept)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(server.getsockname())
        fillers.append(c)
    return server, fillers


@pytest.mark.parametrize(("step", "said"), [
    ("accept", "no answer from 127.0.0.1:{port} within 0.5 s"),
    ("banner", "127.0.0.1:{port} accepts connections but sent no SSH banner within 0.5 s: a stalled SSH server, "
               "or not one (a firewall, NAT or another service?)"),
    ("after banner", "127.0.0.1:{port} sent its SSH banner (SSH-2.0-OpenSSH_9.2p1) and then no key exchange "
                     "within 0.5 s: its SSH server is stalled"),
    ("mid packet", "127.0.0.1:{port} sent its SSH banner (SSH-2.0-OpenSSH_9.2p1) and then no key exchange "
                   "within 0.5 s: its SSH server is stalled"),
    ("http", "127.0.0.1:{port} closed the connection without an SSH banner (it said 'HTTP/1.0 400 Bad Request'): "
             "not an SSH server"),
    ("http, kept open", "127.0.0.1:{port} sent no SSH banner within 0.5 s (it said 'HTTP/1.0 400 Bad Request'): "
                        "not an SSH server"),
    ("web server", "127.0.0.1:{port} closed the connection without an SSH banner (it said 'HTTP/1.0 400 Bad "
                   "Request'): not an SSH server"),
    ("not ssh after banner", "127.0.0.1:{port} sent its SSH banner (SSH-2.0-OpenSSH_9.2p1) but no key exchange "
                             "after it: not a working SSH server"),
])
def test_a_node_stalling_at_each_step_is_unreachable_within_the_bound(step: str, said: str) -> None:
    """A node whose sshd sent its banner and stalled took 185 s to be called unreachable
    (Ansible's own waits), and a listener answering `HTTP/1.0 400` 'sent no SSH banner' (a
    web server answers only a request: the probe sends its identification first, as ssh does)."""
    banner = b"SSH-2.0-OpenSSH_9.2p1\r\n"
    http = b"HTTP/1.0 400 Bad Request\r\n\r\n"
    if step == "accept":
        server, fillers = _stalled_listener()
        port = server.getsockname()[1]
        closers = [server, *fillers]
    else:
        one = {"banner": OneShotServer(None), "after banner": OneShotServer(banner, None),
               "mid packet": OneShotServer(banner, KEXINIT[:3]), "http": OneShotServer(http),
               "http, kept open": OneShotServer(http + b"x", None),
               "web server": OneShotServer(http, request_first=True),  # answers the probe's line
               "not ssh after banner": OneShotServer(banner, b"HTTP/1.0 200 OK\r\n")}[step]
        port = one.port
        closers = [one]
    try:
        start = time.monotonic()
        reach = probe_ssh("127.0.0.1", port, timeout=STALL_BOUND, banner_timeout=STALL_BOUND)
        took = time.monotonic() - start
    finally:
        for c in closers:
            c.close()
    assert not reach.ok
    assert reach.reason == said.format(port=port)
    assert took < 2 * STALL_BOUND + 1


LOGIN_BOUND = 2.0  # the probe's bound for the key exchange and authentication here (apply: 30 s)


@pytest.mark.parametrize(("step", "said"), [
    ("none", ""),
    ("kex", "127.0.0.1:{port}: its SSH server stalled in the key exchange: no answer within 2 s"),
    ("auth", "127.0.0.1:{port}: its SSH server stalled after the key exchange, before authentication: no answer "
             "within 2 s"),
])
def test_a_node_stalling_in_the_key_exchange_or_authentication_is_unreachable_within_the_bound(
        step: str, said: str) -> None:
    """The probe stopped at the server's first key exchange packet: a server stalled after it
    was left to Ansible's ssh, 45 s an attempt (ServerAliveInterval 15 x 3), 4 attempts: 185 s
    (issue 27 item 9). A real SSH server (paramiko) behind a relay that stalls at the step."""
    with FakeSshServer(new_host_key()) as sshd:
        proxy = StallingProxy(sshd.port, step) if step != "none" else None
        port = proxy.port if proxy else sshd.port
        try:
            start = time.monotonic()
            reach = probe_reach("127.0.0.1", port, "nobody", timeout=5, banner_timeout=5, login_timeout=LOGIN_BOUND)
            took = time.monotonic() - start
        finally:
            if proxy:
                proxy.close()
    assert (reach.ok, reach.reason) == (not said, said.format(port=port))
    assert reach.banner.startswith("SSH-2.0-paramiko")
    assert took < LOGIN_BOUND + 1.5


def test_a_handshake_that_ends_before_authentication_is_said_in_ssh_words() -> None:
    said = "debug1: Connecting to x [10.0.0.5] port 22.\nUnable to negotiate with 10.0.0.5 port 22: no matching " \
           "host key type found. Their offer: ssh-dss\n"
    assert login_verdict("10.0.0.5:22", 255, said).reason == (
        "10.0.0.5:22: the SSH handshake ended before authentication: Unable to negotiate with 10.0.0.5 port 22: no "
        "matching host key type found. Their offer: ssh-dss")
    assert login_verdict("x:22", 255, "debug1: Authentications that can continue: publickey\n").ok
    assert not login_verdict("x:22", 255, "").ok
