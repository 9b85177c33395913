"""End to end: `provision apply --rolling` on a real Slurm cluster of systemd containers.

A head (slurmctld) and three compute containers (slurmd; privileged, as in molecule/slurm:
proctrack/cgroup and task/cgroup write their cgroups) are converged by `provision apply`
over SSH with Slurm on. A job is started on rollnode3; then the manifest gives rollnode1 and
rollnode2 (and only them) a node-local change (role_vars: an extra pam limit, which re-runs
their node-local plays) and `provision apply --rolling --batch 1` rolls them: one drained,
applied, verified and resumed before the other is drained (the roll's table, Slurm's own
log and the runs recorded in the state say so), the job on rollnode3 keeps running and then
completes, both end idle, and the roll changed nothing on rollnode3 or the head. Every
apply here runs the default strategy (Mitogen's; the apply end-to-end test runs the
`linear` fallback).

The acceptance gate (``verify.gate: [gpu.dcgm]``) on the same run: rollnode1 gets a device
file /dev/nvidia0 and a stand-in ``dcgmi`` whose first diagnostic fails (DCGM 4's JSON: the
software test on GPU 0, persistence mode off) and whose later ones pass. The first apply
leaves rollnode1 drained with the failing check as the reason while the nodes without a GPU
device (gpu.dcgm says SKIP there) are resumed; ``provision resume`` refuses rollnode1; the
roll then runs it through the gate again (its diagnostic passes) and resumes it.
Needs podman and the test bed image (tests/testbed/setup.sh); skipped with a reason otherwise.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import e2ekit
import pytest
import yaml
from e2ekit import heavy_hosts, podman, state

pytestmark = [pytest.mark.container, pytest.mark.slow]

NET = "provtest-roll"
SUBNET = "10.213.50.0/24"
GATEWAY = "10.213.50.1"
HEAD = "rollhead"
NODES = {HEAD: "10.213.50.10", "rollnode1": "10.213.50.11", "rollnode2": "10.213.50.12",
         "rollnode3": "10.213.50.13"}
ROLLED = ["rollnode1", "rollnode2"]
BUSY = "rollnode3"
LIMITS = "/etc/security/limits.d/90-provision.conf"
RELEASE = "/tmp/roll-e2e-release"  # the job on rollnode3 ends once this file exists
SLURMCTLD_LOG = "/var/log/slurm/slurmctld.log"
GATED = "rollnode1"  # the node with a stand-in dcgmi: fails its first diagnostic, passes after
DCGMI_CALLS = "/var/tmp/dcgmi-stand-in.calls"
DCGMI_FAIL = ('{"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [{"name": "software", '
              '"results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Fail", '
              '"warnings": [{"warning": "Persistence mode for GPU 0 is disabled.", "error_id": 29, '
              '"error_category": 6, "error_severity": 1}]}], "test_summary": {"status": "Fail"}}]}]}, '
              '"metadata": {"version": "4.2.3"}}')
DCGMI_PASS = ('{"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [{"name": "software", '
              '"results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}], '
              '"test_summary": {"status": "Pass"}}]}]}, "metadata": {"version": "4.2.3"}}')
DCGMI_STAND_IN = f"""#!/bin/sh
# stand-in for NVIDIA's dcgmi (tests/e2e/test_rolling_e2e.py): the first diag fails, later ones pass
echo "$*" >> {DCGMI_CALLS}
[ "$1" = diag ] || {{ echo "stand-in dcgmi: diag only" >&2; exit 2; }}
if [ "$(wc -l < {DCGMI_CALLS})" -eq 1 ]; then echo '{DCGMI_FAIL}'; exit 226; fi
echo '{DCGMI_PASS}'
"""
BMC_PASSWORD_ENV = "PROVISION_ROLL_E2E_BMC_PASSWORD"
BMC_PASSWORD = "roll-e2e-Bmc-Secret-4c1d7"
BACKUP_KEY_ENV = "PROVISION_ROLL_E2E_BACKUP_KEY"
BACKUP_KEY = "roll-e2e-Backup-Passphrase-8b2e5"  # the backup role installs it on the head: one more secret
GATE_REASON = "provision gate: gpu.dcgm failed: level 1: software on GPU 0: Persistence mode for GPU 0 is disabled."


def _exec(name: str, *cmd: str) -> str:
    return podman("exec", name, *cmd).stdout


def _cleanup() -> None:
    e2ekit.remove(list(NODES), NET)


def _wait(what: str, probe: Callable[[], str], timeout: float, step: float = 2) -> str:
    """Poll ``probe`` (text, "" for not yet) until it answers, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        last = str(probe())
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _manifest(key: Path, extra_limit: bool) -> dict[str, object]:
    pub = key.with_suffix(".pub").read_text().strip()
    data: dict[str, object] = {
        "version": 1,
        "cluster": {
            "name": "rolle2e",
            "domain": "roll.test",
            "admin_users": [{"name": "ops", "ssh_keys": [pub]}],
            "ssh": {"user": "root", "private_key": str(key)},
        },
        # the BMCs sit on loopback: nothing of this test contacts them (no node installs over
        # PXE); their password is one more secret of the manifest for the leak scan
        "networks": {"management": {"cidr": SUBNET, "gateway": GATEWAY}, "bmc": {"cidr": "127.0.0.0/8"}},
        "nodes": [
            {"name": HEAD, "roles": ["head"], "os": "debian-12",
             "interfaces": {"management": {"ip": NODES[HEAD]}},
             "hardware": {"cpu": {"cores_per_socket": 1}, "memory_gb": 4}},
            # one CPU and 4 GiB: below what any CI machine has, so slurmd's hardware check passes
            {"name": "rollnode[1-3]", "roles": ["compute"], "os": "debian-12",
             "interfaces": {"management": {"ip": NODES["rollnode1"]}},
             "bmc": {"type": "redfish", "address": "127.0.0.11", "port": 9, "user": "admin",
                     "password_env": BMC_PASSWORD_ENV},
             "hardware": {"cpu": {"sockets": 1, "cores_per_socket": 1, "threads_per_core": 1}, "memory_gb": 4}},
        ],
        "docker": {"enabled": False},
        "role_vars": {"all": {"common_packages": []}},  # no convenience packages: a shorter converge
        "slurm": {"accounting": False, "partitions": [{"name": "batch", "nodes": ["@compute"], "default": True}]},
        "verify": {"gate": ["gpu.dcgm"]},
        "backup": {"destination": {"path": "/srv/provision-backups"}, "key_env": BACKUP_KEY_ENV},
    }
    if extra_limit:  # node-local for rollnode1 and rollnode2 only: their common role re-runs
        data["role_vars"] = {"all": {"common_packages": []}, "rollnode[1-2]": {"common_limits": [
            {"domain": "*", "type": "soft", "item": "memlock", "value": "unlimited"},
            {"domain": "*", "type": "hard", "item": "memlock", "value": "unlimited"},
            {"domain": "*", "type": "soft", "item": "nofile", "value": 1048576},
            {"domain": "*", "type": "hard", "item": "nofile", "value": 1048576},
            {"domain": "*", "type": "soft", "item": "core", "value": 0},
        ]}}
    return data


def _write(work: Path, extra_limit: bool) -> Path:
    path = work / "cluster.yaml"
    path.write_text(yaml.safe_dump(_manifest(work / "id_ed25519", extra_limit), sort_keys=False))
    return path


def _provision(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # COLUMNS: the roll's rows on one line each
    return e2ekit.provision(*args, cwd=cwd, env={"COLUMNS": "200", BMC_PASSWORD_ENV: BMC_PASSWORD,
                                                               BACKUP_KEY_ENV: BACKUP_KEY}, timeout=900)


def _slurm_states(nodes: list[str]) -> dict[str, str]:
    out = _exec(HEAD, "sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T")
    return dict(line.split() for line in out.splitlines() if line.strip())


def _job_state(job: str) -> str:
    out = _exec(HEAD, "scontrol", "show", "job", job, "--oneliner")
    found = re.search(r"\bJobState=(\S+)", out)
    return found.group(1) if found else ""


def _daemon(node: str, unit: str) -> str:
    """A daemon's main PID and start time: unchanged means it was not restarted."""
    return _exec(node, "systemctl", "show", unit, "-p", "MainPID", "-p", "ExecMainStartTimestampMonotonic").strip()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    reason = e2ekit.have_testbed()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("roll")
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    _cleanup()
    podman("network", "create", "--subnet", SUBNET, "--gateway", GATEWAY, NET)
    try:
        pub = key.with_suffix(".pub").read_text()
        for name in [*ROLLED, BUSY, HEAD]:  # compute nodes before the controller
            # compute nodes privileged like molecule/slurm's: Slurm's cgroup plugins write their cgroups
            e2ekit.start(name, NET, NODES[name], pub, ["--cap-add", "NET_ADMIN"] if name == HEAD else ["--privileged"])
        deadline = time.monotonic() + 120
        for ip in NODES.values():
            e2ekit.wait_ssh(ip, key, deadline)
        yield work
    finally:
        _cleanup()


def _secret_forms(work: Path) -> dict[str, bytes]:
    """Every secret value of the manifest, in each form a leak could take: the MUNGE key
    (1024 random bytes, in the state's secrets/ only) raw, base64 (how Ansible carries file
    content in module arguments) and hex; the BMC password (from the environment) as given
    and base64; the backup passphrase (from the environment; the backup role copies it to the
    head) raw, base64 and hex. The manifest has no alert receivers (the monitoring roles'
    converge would cost minutes) and slurmdbd has no database password (unix-socket
    authentication)."""
    key = (work / ".provision" / "secrets" / "munge.key").read_bytes()
    assert len(key) >= 1024  # the secret is there: the scan cannot pass for want of it
    # the passphrase went through the converge: on the head, from the state's secrets/
    assert (work / ".provision" / "secrets" / "backup.key").read_text().strip() == BACKUP_KEY
    assert _exec(HEAD, "cat", "/etc/provision-backup/key").strip() == BACKUP_KEY
    passphrase = BACKUP_KEY.encode()
    return {"munge key raw": key[:48], "munge key base64": base64.b64encode(key[:48]),
            "munge key hex": key[:48].hex().encode(), "BMC password": BMC_PASSWORD.encode(),
            "BMC password base64": base64.b64encode(BMC_PASSWORD.encode()), "backup passphrase": passphrase,
            "backup passphrase base64": base64.b64encode(passphrase),
            "backup passphrase hex": passphrase.hex().encode()}


def _assert_no_secret_leaked(work: Path, outputs: list[str]) -> None:
    """Issue 27: no secret of the manifest (:func:`_secret_forms`) appears in any output of a
    real converge at -vvv, in Ansible's artifacts and logs, anywhere else in the state
    directory, or in the nodes' journals (where Ansible's modules log their arguments)."""
    forms = _secret_forms(work)
    found = [f"{form} in output {i}" for i, text in enumerate(outputs) for form, needle in forms.items()
             if needle in text.encode("utf-8", "surrogateescape")]
    scanned = 0
    for path in (work / ".provision").rglob("*"):
        if path.is_file() and "secrets" not in path.relative_to(work / ".provision").parts:
            blob = path.read_bytes()
            scanned += 1
            found += [f"{form} in {path}" for form, needle in forms.items() if needle in blob]
    assert scanned > 10, scanned  # artifacts, job events, run logs, inventory were read
    invocations = 0
    for node in NODES:
        journal = podman("exec", node, "journalctl", "--no-pager", "-o", "cat", timeout=60).stdout.encode(
            "utf-8", "surrogateescape")
        invocations += journal.count(b"Invoked with")
        found += [f"{form} in {node}'s journal" for form, needle in forms.items() if needle in journal]
    assert invocations > 0  # Ansible's modules logged their arguments there: the scan read them
    assert found == [], found


def _stand_in_dcgmi(work: Path, node: str) -> None:
    """A GPU device file (a privileged container may mknod) and the stand-in dcgmi on ``node``."""
    script = work / "dcgmi"
    script.write_text(DCGMI_STAND_IN)
    podman("cp", str(script), f"{node}:/usr/local/bin/dcgmi")
    _exec(node, "sh", "-c", f"chmod 755 /usr/local/bin/dcgmi && rm -f {DCGMI_CALLS} && "
                            "mknod -m 666 /dev/nvidia0 c 195 0")


def _reason(node: str) -> str:
    """The node's drain reason as slurmctld holds it, without the [user@time] it appends."""
    found = re.search(r"\bReason=(.*?) \[[^\]]*\]", _exec(HEAD, "scontrol", "show", "node", node, "--oneliner"))
    return found.group(1) if found else ""


def test_a_roll_drains_one_node_at_a_time_while_a_job_runs_on_another(cluster: Path) -> None:
    timings: dict[str, float] = {}
    _stand_in_dcgmi(cluster, GATED)
    start = time.monotonic()
    manifest = _write(cluster, extra_limit=False)
    # Ansible's most verbose output (module arguments and results): scanned for secrets below
    r = _provision("apply", str(manifest), "--yes", "-vvv", cwd=cluster)
    converge_output = r.stdout + r.stderr
    # the acceptance gate on the new compute nodes: rollnode1's diagnostic failed, the others said SKIP
    assert r.returncode == 1, converge_output
    gate = dict(re.findall(r"(rollnode\d)\s*│\s*(resumed|held|not gated)\s*│", converge_output))
    assert gate == {GATED: "held", "rollnode2": "resumed", BUSY: "resumed"}, converge_output[-3000:]
    timings["converge"] = time.monotonic() - start
    compute = [*ROLLED, BUSY]
    _wait("rollnode2, rollnode3 idle and rollnode1 drained in Slurm",
          lambda: "yes" if _slurm_states(compute) == {GATED: "drained", "rollnode2": "idle", BUSY: "idle"} else "",
          timeout=90)
    assert _reason(GATED) == GATE_REASON
    r = _provision("resume", str(manifest), GATED, cwd=cluster)
    assert r.returncode == 1 and "held by the acceptance gate" in r.stdout, r.stdout + r.stderr
    assert _slurm_states([GATED]) == {GATED: "drained"} and _reason(GATED) == GATE_REASON
    # verify (the roll's last step before a resume) reads chrony: compute nodes follow the head
    _wait("chrony synchronised on the compute nodes",
          lambda: "yes" if all("Leap status     : Normal" in podman("exec", n, "chronyc", "-n", "tracking",
                                                                          check=False).stdout
                               for n in compute) else "", timeout=120)

    # a job on rollnode3 that ends when the test lets it (bounded: at most 15 minutes)
    job = _exec(HEAD, "sbatch", "--parsable", "-w", BUSY, "--time=15", "-o", "/tmp/roll-e2e-%j.out", "--wrap",
                f"timeout 900 bash -c 'until [ -e {RELEASE} ]; do sleep 1; done'; echo released").strip()
    assert job.isdigit(), job
    _wait(f"job {job} running", lambda: "yes" if _job_state(job) == "RUNNING" else "", timeout=60)

    untouched = {node: _exec(node, "cat", LIMITS) for node in NODES}
    daemons = {HEAD: _daemon(HEAD, "slurmctld"), BUSY: _daemon(BUSY, "slurmd")}
    log_offset = len(_exec(HEAD, "cat", SLURMCTLD_LOG))
    runs_before = len(state(cluster)["runs"])  # type: ignore[arg-type]

    manifest = _write(cluster, extra_limit=True)
    plan = _provision("plan", str(manifest), "--json", cwd=cluster)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert json.loads(plan.stdout)["targets"] == ROLLED

    start = time.monotonic()
    r = _provision("apply", str(manifest), "--rolling", "--batch", "1", "--drain-timeout", "120", "--yes",
                   cwd=cluster)
    timings["roll"] = time.monotonic() - start
    out = r.stdout + r.stderr
    print(out[out.find("rolling "):])  # the roll's table, for the CI log
    assert r.returncode == 0, out
    assert f"rolling {', '.join(ROLLED)} in batches of 1" in out, out

    # the roll's own table: node 1 drained, applied, verified and resumed before node 2 is drained
    events = re.findall(r"(rollnode\d|\(batch\))\s*│\s*(drain|apply|verify|resume|reboot)\s*│\s*(ok|failed)\s*│"
                        r"\s*(.*?)\s*│", out)
    steps = [(node, stage) for node, stage, ok, _ in events]
    one_node = ["drain", "apply", "verify", "resume"]
    assert steps == [("(batch)" if stage == "apply" else node, stage) for node in ROLLED for stage in one_node], out
    assert all(ok == "ok" for _, _, ok, _ in events), out
    details = [(node, stage, detail) for node, stage, _, detail in events]
    assert ("rollnode1", "drain", "drained, no jobs") in details and ("rollnode2", "resume", "resumed") in details

    # Slurm's own account, in order: node 1 drained and resumed, then node 2; node 3 never drained
    log = _exec(HEAD, "cat", SLURMCTLD_LOG)[log_offset:]
    marks = [(m.group(1), m.group(2)) for m in re.finditer(
        r"update_node: node (rollnode\d) (reason set to: provision apply --rolling|state set to IDLE)", log)]
    print("slurmctld during the roll:", marks)
    drained_then_resumed = [(n, "drain" if what.startswith("reason") else "resume") for n, what in marks]
    assert drained_then_resumed == [("rollnode1", "drain"), ("rollnode1", "resume"),
                                    ("rollnode2", "drain"), ("rollnode2", "resume")], log
    assert f"update_node: node {BUSY} " not in log, log

    # the runs the roll recorded: the others first (no node-local plays, nothing changed),
    # then one node at a time, node-local plays only there
    runs = state(cluster)["runs"][runs_before:]  # type: ignore[index]
    assert [(run["limit"], run["targets"], run["result"]) for run in runs] == [
        ([HEAD, BUSY], [], "ok"), (["rollnode1"], ["rollnode1"], "ok"), (["rollnode2"], ["rollnode2"], "ok")], runs
    assert sum(runs[0]["changed"].values()) == 0, runs[0]
    assert runs[1]["finished"] <= runs[2]["started"], runs
    for run, node in zip(runs[1:], ROLLED, strict=True):
        assert heavy_hosts(cluster, run["id"]) == {node}, run

    # the change landed on the rolled nodes only; controller and rollnode3's slurmd not restarted
    for node in ROLLED:
        assert "*\tsoft\tcore\t0" in _exec(node, "cat", LIMITS).replace(" ", "\t"), _exec(node, "cat", LIMITS)
    for node in (HEAD, BUSY):
        assert _exec(node, "cat", LIMITS) == untouched[node]
    assert _daemon(HEAD, "slurmctld") == daemons[HEAD] and _daemon(BUSY, "slurmd") == daemons[BUSY]

    # the job survived the roll (same id, still on rollnode3), and both rolled nodes are idle
    assert _job_state(job) == "RUNNING"
    assert _exec(HEAD, "squeue", "-h", "-j", job, "-o", "%N").strip() == BUSY
    assert _slurm_states(ROLLED) == dict.fromkeys(ROLLED, "idle")
    reasons = _exec(HEAD, "sinfo", "-h", "-R", "-n", ",".join(compute), "-o", "%N %E")
    assert reasons.strip() == "", reasons  # no node left drained
    # rollnode1 went through the gate again in the roll: its second diagnostic passed
    assert _exec(GATED, "cat", DCGMI_CALLS).splitlines() == ["diag -r 1 -j", "diag -r 1 -j"]
    podman("exec", BUSY, "touch", RELEASE)
    _wait(f"job {job} completed", lambda: "yes" if _job_state(job) == "COMPLETED" else "", timeout=60)
    assert _exec(BUSY, "cat", f"/tmp/roll-e2e-{job}.out").strip() == "released"

    _assert_no_secret_leaked(cluster, [converge_output, out])

    # nothing left to do: the plan of the rolled manifest is settled
    plan = _provision("plan", str(manifest), "--detailed-exitcode", cwd=cluster)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    print(f"rolling e2e: converge {timings['converge']:.0f}s, roll of 2 nodes {timings['roll']:.0f}s")
