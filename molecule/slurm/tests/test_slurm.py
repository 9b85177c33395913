"""Verify the Slurm cluster the scenario built: real daemons, real jobs.

Runs after converge, idempotence and side_effect: slurm-gpu03 was added to the manifest
while a long job ran on slurm-gpu01 (the job id is in /root/long_job_id on the head).
Every check runs commands on the head (and reads files on the nodes).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from typing import Any

import pytest
from slurmkit import node, wait_for

# testinfra's SSH backend over the inventory's connection (.config/molecule/config.yml)
testinfra_hosts = ["ansible://slurm-head"]

COMPUTE = ["slurm-gpu01", "slurm-gpu02", "slurm-gpu03"]
ALL = ["slurm-head", *COMPUTE]
GRES = "gpu:tesla_t4:2"
ENXIO, EPERM = 6, 1

# Opens both fake GPUs and reports errno per device: 0 or ENXIO (no driver behind the
# device node) = the cgroup lets the job open it; EPERM = fenced by ConstrainDevices.
PROBE = (
    "import json, os\n"
    "res = {}\n"
    "for d in ('/dev/nvidia0', '/dev/nvidia1'):\n"
    "    try:\n"
    "        os.close(os.open(d, os.O_RDWR)); res[d] = 0\n"
    "    except OSError as e:\n"
    "        res[d] = e.errno\n"
    "print(json.dumps({'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), 'open': res,\n"
    "                  'host': os.uname().nodename}))\n"
)


def sinfo(host: Any) -> dict[str, tuple[str, str]]:
    out = host.check_output("sinfo -N --noheader -p gpu -o '%N %t %G'")
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return {r[0]: (r[1], r[2]) for r in rows}


def srun_probe(host: Any, *args: str) -> dict[str, Any]:
    cmd = "srun --time=2 " + " ".join(args) + " python3 -c " + _quote(PROBE)
    return json.loads(host.check_output(cmd).strip().splitlines()[-1])


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def long_job_id(host: Any) -> str:
    return host.file("/root/long_job_id").content_string.strip()


# --- munge -----------------------------------------------------------------------------


def test_munge_key_same_everywhere_and_private() -> None:
    digests = set()
    for name in ALL:
        key = node(name).file("/etc/munge/munge.key")
        assert key.user == "munge" and key.group == "munge" and key.mode == 0o400, name
        assert key.size == 1024, name
        digests.add(node(name).check_output("sha256sum /etc/munge/munge.key").split()[0])
    assert len(digests) == 1


def test_munge_credential_crosses_nodes(host: Any) -> None:
    cred = host.check_output("munge -n -s slurm-test")
    out = node("slurm-gpu03").check_output(f"printf %s {_quote(cred)} | unmunge")
    assert "STATUS:          Success (0)" in out
    assert "slurm-test" in out


# --- daemons and files -----------------------------------------------------------------


def test_head_daemons(host: Any) -> None:
    for svc in ("munge", "mariadb", "slurmdbd", "slurmctld"):
        assert host.service(svc).is_running, svc
        assert host.service(svc).is_enabled, svc
    assert host.socket("tcp://0.0.0.0:6817").is_listening
    assert host.socket("tcp://0.0.0.0:6819").is_listening
    assert not host.service("slurmd").is_running


@pytest.mark.parametrize("name", COMPUTE)
def test_compute_daemons(name: str) -> None:
    n = node(name)
    assert n.service("munge").is_running
    assert n.service("slurmd").is_running and n.service("slurmd").is_enabled
    assert n.socket("tcp://0.0.0.0:6818").is_listening


def test_slurm_conf_identical_and_from_manifest(host: Any) -> None:
    text = host.file("/etc/slurm/slurm.conf").content_string
    digest = hashlib.sha256(text.encode()).hexdigest()
    for name in COMPUTE:
        other = node(name).file("/etc/slurm/slurm.conf").content_string
        assert hashlib.sha256(other.encode()).hexdigest() == digest, name
    lines = text.splitlines()
    assert (
        "NodeName=slurm-gpu[01-03] Sockets=1 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=3072 "
        f"Gres={GRES} State=UNKNOWN"
    ) in lines
    assert "PartitionName=gpu Nodes=slurm-gpu[01-03] Default=YES MaxTime=02:00:00 State=UP" in lines
    assert "SelectType=select/cons_tres" in lines and "GresTypes=gpu" in lines
    assert "SlurmctldHost=slurm-head" in lines


@pytest.mark.parametrize("name", COMPUTE)
def test_gres_and_cgroup_conf(name: str) -> None:
    n = node(name)
    assert "Name=gpu Type=tesla_t4 File=/dev/nvidia[0-1]" in n.file("/etc/slurm/gres.conf").content_string
    cg = n.file("/etc/slurm/cgroup.conf").content_string.splitlines()
    assert {"ConstrainCores=yes", "ConstrainRAMSpace=yes", "ConstrainDevices=yes"} <= set(cg)


def test_slurmdbd_conf_private(host: Any) -> None:
    f = host.file("/etc/slurm/slurmdbd.conf")
    assert f.user == "slurm" and f.mode == 0o600
    assert not [line for line in f.content_string.splitlines() if line.startswith("StoragePass")]


# --- scheduling ------------------------------------------------------------------------


def test_sinfo_nodes_with_gres(host: Any) -> None:
    def ready() -> dict[str, tuple[str, str]] | None:
        rows = sinfo(host)
        ok = (rows.get("slurm-gpu02", ("",))[0] == "idle" and rows.get("slurm-gpu03", ("",))[0] == "idle"
              and rows.get("slurm-gpu01", ("",))[0] in ("alloc", "mix"))
        return rows if ok else None

    rows = wait_for("gpu02/gpu03 idle and gpu01 busy with the long job", ready)
    assert set(rows) == set(COMPUTE)
    for name in COMPUTE:
        assert rows[name][1] == GRES, rows
    debug = host.check_output("scontrol show partition debug")
    assert "Nodes=slurm-gpu01" in debug and "MaxTime=00:10:00" in debug


# Jobs that several tests read (one srun each instead of one per test): a job and its
# prolog and epilog cost seconds on a loaded machine.


@pytest.fixture(scope="module")
def two_node_job(host: Any) -> str:
    """One task on slurm-gpu02 and one on slurm-gpu03 through PMIx, each printing its host,
    PMIx rank and the server's URI (srun -l: "RANK: ...")."""
    out: str = host.check_output(
        "srun --time=2 --mpi=pmix -N2 -n2 -w slurm-gpu02,slurm-gpu03 -l "
        "sh -c 'echo $(hostname) rank=$PMIX_RANK uri=${PMIX_SERVER_URI41:-$PMIX_SERVER_URI4}'"
    )
    return out


@pytest.fixture(scope="module")
def one_gpu_job(host: Any) -> tuple[dict[str, Any], str, str]:
    """A one-GPU job on slurm-gpu02: the device probe (PROBE), then the job's id and the
    gpu_metrics job-map file that holds that id (the prolog wrote it before the job ran)."""
    script = 'python3 -c "$1"; echo "$SLURM_JOB_ID"; grep -lx "$SLURM_JOB_ID" /run/provision/gpu-jobs/*'
    out = host.check_output(f"srun --time=2 -w slurm-gpu02 --gres=gpu:1 sh -c {_quote(script)} sh {_quote(PROBE)}")
    *_, probe, job, path = out.strip().splitlines()
    return json.loads(probe), job.strip(), path.strip()


def test_srun_two_nodes(two_node_job: str) -> None:
    hosts = [line.split(": ", 1)[1].split()[0] for line in two_node_job.splitlines() if ": " in line]
    assert sorted(hosts) == ["slurm-gpu02", "slurm-gpu03"], two_node_job


def test_one_gpu_job_sees_one_device_and_cannot_open_the_other(one_gpu_job: tuple[dict[str, Any], str, str]) -> None:
    res = one_gpu_job[0]
    assert res["host"] == "slurm-gpu02"
    assert res["cvd"] is not None and len(res["cvd"].split(",")) == 1, res
    errnos = sorted(res["open"].values())
    # exactly one device usable (no driver: ENXIO), the other fenced by the cgroup
    assert errnos == sorted([ENXIO, EPERM]), res


def test_two_gpu_job_opens_both(host: Any) -> None:
    res = srun_probe(host, "-w slurm-gpu03", "--gres=gpu:2")
    assert res["cvd"] is not None and len(res["cvd"].split(",")) == 2, res
    assert set(res["open"].values()) == {ENXIO}, res


def test_job_without_gpus_opens_none(host: Any) -> None:
    res = srun_probe(host, "-w slurm-gpu02")
    assert set(res["open"].values()) == {EPERM}, res


def test_sbatch_on_new_node_writes_output_and_is_accounted(host: Any) -> None:
    # no `sbatch --wait`: it polls after 2, 10 and 42 s; sacct's COMPLETED (the job ended,
    # its output written, slurmdbd told) is polled every second instead
    job = host.check_output(
        "sbatch --parsable --time=2 -w slurm-gpu03 --gres=gpu:1 -o /root/batch-%j.out "
        "--wrap 'echo ran-on-$(hostname) gpus=$CUDA_VISIBLE_DEVICES'"
    ).strip()

    def accounted() -> str | None:
        rows = host.check_output(f"sacct -n -X -P -j {job} -o JobID,State,NodeList").strip()
        return rows if f"{job}|COMPLETED|slurm-gpu03" in rows else None

    wait_for("sacct to list the batch job completed", accounted, timeout=90)
    out = node("slurm-gpu03").file(f"/root/batch-{job}.out")
    assert out.exists
    assert re.fullmatch(r"ran-on-slurm-gpu03 gpus=\d", out.content_string.strip()), out.content_string
    in_db = host.check_output(
        f"mysql -N -B slurm_acct_db -e 'select id_job, nodelist from slurmtest_job_table where id_job={job}'"
    )
    assert in_db.split() == [job, "slurm-gpu03"]


# --- PMIx and MailProg (no start-up errors) ---------------------------------------------

# What slurmctld/slurmd logged without PMIx's library and without a mail program:
# "error: Configured MailProg is invalid", "error: mpi/pmix_v4: init: ... can not load
# PMIx library", "error: Couldn't load specified plugin name for mpi/pmix_v4".
STARTUP_ERROR = re.compile(r"error.*(MailProg|mpi/|pmix)", re.IGNORECASE)


@pytest.mark.parametrize(("name", "log"), [("slurm-head", "slurmctld"), *((n, "slurmd") for n in COMPUTE)])
def test_no_mailprog_or_pmix_errors_in_the_daemon_logs(name: str, log: str) -> None:
    text = node(name).file(f"/var/log/slurm/{log}.log").content_string
    assert text.strip(), f"{name}: {log}.log is empty"
    assert [line for line in text.splitlines() if STARTUP_ERROR.search(line)] == []


def test_mpi_default_pmix_and_mailprog(host: Any) -> None:
    config = host.check_output("scontrol show config")
    assert re.search(r"^MpiDefault\s+= pmix$", config, re.MULTILINE), config
    assert re.search(r"^MailProg\s+= /bin/true$", config, re.MULTILINE), config
    assert "pmix" in host.check_output("srun --mpi=list 2>&1")


def test_srun_pmix_across_two_nodes(two_node_job: str) -> None:
    # the mpi/pmix plugin's server in slurmstepd gives every task its PMIx rank and URI
    out = two_node_job
    rows = sorted(line.split(": ", 1)[1].split() for line in out.splitlines() if ": " in line)
    assert [r[:2] for r in rows] == [["slurm-gpu02", "rank=0"], ["slurm-gpu03", "rank=1"]], out
    assert all(len(r) == 3 and len(r[2]) > len("uri=") for r in rows), out


# --- node add ----------------------------------------------------------------------------


def _systemd_start(n: Any, unit: str) -> dt.datetime:
    value = n.check_output(f"systemctl show -p ActiveEnterTimestamp --value {unit}")
    return dt.datetime.strptime(value.strip(), "%a %Y-%m-%d %H:%M:%S %Z")


def test_long_job_survived_the_node_add(host: Any) -> None:
    job = long_job_id(host)
    state, nodes, start = host.check_output(f"squeue --noheader -j {job} -o '%T %N %S'").split()
    assert (state, nodes) == ("RUNNING", "slurm-gpu01")
    started = dt.datetime.fromisoformat(start)
    # the node add really restarted the daemons after the job had started
    assert _systemd_start(host, "slurmctld") > started
    assert _systemd_start(node("slurm-gpu01"), "slurmd") > started
    # and the job's process is still the original one on gpu01
    assert node("slurm-gpu01").run("pgrep -f 'sleep 3000'").rc == 0


def test_new_node_joined_the_cluster(host: Any) -> None:
    info = host.check_output("scontrol show node slurm-gpu03")
    assert f"Gres={GRES}" in info and "RealMemory=3072" in info
    assert "State=IDLE" in info or "State=MIXED" in info or "State=ALLOCATED" in info


# --- prolog and epilog ------------------------------------------------------------------


def test_prolog_and_epilog_run_the_gpu_job_map_scripts(host: Any, one_gpu_job: tuple[dict[str, Any], str, str]) -> None:
    n = node("slurm-gpu02")
    config = host.check_output("scontrol show config")
    assert re.search(r"^Prolog\s+= /usr/local/sbin/provision-slurm-prolog$", config, re.MULTILINE), config
    assert re.search(r"^Epilog\s+= /usr/local/sbin/provision-slurm-epilog$", config, re.MULTILINE), config
    for kind in ("prolog", "epilog"):
        runner = n.file(f"/usr/local/sbin/provision-slurm-{kind}")
        assert runner.user == "root" and runner.mode == 0o755
        script = n.file(f"/etc/slurm/{kind}.d/50-provision-gpu-job-map.sh")
        assert script.user == "root" and script.mode == 0o755
    # the prolog wrote the job's id into the file of the GPU it got, before the job ran
    _, job, path = one_gpu_job
    assert job.isdigit() and re.fullmatch(r"/run/provision/gpu-jobs/[01]", path), one_gpu_job
    # and the epilog took it out again
    wait_for("the epilog to forget the job",
             lambda: job not in n.run("cat /run/provision/gpu-jobs/* 2>/dev/null").stdout.split(),
             timeout=30)

# --- health check (last: it drains slurm-gpu02 for a while) ------------------------------


def node_state(host: Any, name: str) -> tuple[str, str]:
    state, _, reason = host.check_output(f"sinfo -h -N -n {name} -o '%T|%E'").splitlines()[0].partition("|")
    return state.strip(), "" if reason.strip() == "none" else reason.strip()


def test_health_check_configured(host: Any) -> None:
    config = host.check_output("scontrol show config")
    assert re.search(r"^HealthCheckProgram\s+= /usr/local/sbin/provision-slurm-healthcheck$", config, re.MULTILINE)
    assert re.search(r"^HealthCheckInterval\s+= 10 sec$", config, re.MULTILINE), config
    n = node("slurm-gpu02")
    program = n.file("/usr/local/sbin/provision-slurm-healthcheck")
    assert program.user == "root" and program.mode == 0o755
    expected = json.loads(n.file("/etc/slurm/provision-healthcheck.json").content_string)
    assert expected["node"] == "slurm-gpu02" and expected["gpu_count"] == 2 and expected["mounts"] == []
    out = n.check_output("provision-slurm-healthcheck --dry-run")
    assert out == ("slurm-gpu02: healthy; XID: skipped (no NVIDIA driver loaded); none (all checks pass)"), out


def test_health_check_leaves_an_operators_drain_alone(host: Any) -> None:
    host.check_output("scontrol update nodename=slurm-gpu03 state=drain reason=maintenance")
    try:
        out = node("slurm-gpu03").check_output("provision-slurm-healthcheck")
        assert out.endswith("no change (all checks pass)"), out
        assert node_state(host, "slurm-gpu03") == ("drained", "maintenance")
    finally:
        host.check_output("scontrol update nodename=slurm-gpu03 state=resume")


def test_health_check_drains_a_node_that_lost_a_gpu_and_resumes_it(host: Any) -> None:
    n = node("slurm-gpu02")
    assert node_state(host, "slurm-gpu02")[0] == "idle"
    n.check_output("rm /dev/nvidia1")
    try:
        # slurmd runs the check every 10 s (HealthCheckInterval of the scenario)
        state = wait_for("slurmd's health check to drain slurm-gpu02",
                         lambda: (s := node_state(host, "slurm-gpu02"))[0].startswith("drain") and s,
                         timeout=60)
        assert state[1] == "healthcheck: 1 of 2 GPUs (/dev/nvidia1 missing)", state
    finally:
        n.check_output("test -e /dev/nvidia1 || mknod -m 0666 /dev/nvidia1 c 195 1")
    wait_for("the health check to resume slurm-gpu02",
             lambda: node_state(host, "slurm-gpu02") == ("idle", ""), timeout=60)
