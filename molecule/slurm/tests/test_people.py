"""Verify the people the scenario made (role users, playbooks/people.yml): the same uid/gid
on every node, homes made on the NFS server (the head) with their owner, mode and keys,
carol locked by the manifest and bob locked after side_effect took him out, files kept;
the manifest's accounts and QOS in slurmdbd, a job under the user's account and QOS, a QOS
the account lacks refused and a QOS limit holding a job; SSH to a compute node only with a job
there (pam_slurm_adopt: refused without one, into the job's cgroup with one, root always).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from slurmkit import node, wait_for

from provisioner.areas.slurm import verify

testinfra_hosts = ["ansible://slurm-head"]

ALL = ["slurm-head", "slurm-gpu01", "slurm-gpu02", "slurm-gpu03"]
ALICE_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA alice@test"


@pytest.mark.parametrize("name", ALL)
def test_the_same_users_and_groups_on_every_node(name: str) -> None:
    h = node(name)
    assert h.check_output("getent passwd alice bob carol | cut -d: -f1,3,4,5,6,7").splitlines() == [
        "alice:2001:3000:Alice Example:/home/alice:/bin/bash",
        "bob:2002:2002::/home/bob:/bin/bash",
        "carol:2003:2003::/home/carol:/bin/bash",
    ]
    assert h.check_output("getent group vision bob carol | cut -d: -f1,3,4").splitlines() == [
        "vision:3000:bob", "bob:2002:", "carol:2003:"]


def test_homes_are_made_on_the_nfs_server_with_owner_mode_and_keys(host: Any) -> None:
    home = host.file("/export/home/alice")
    assert (home.is_directory, home.uid, home.gid, home.mode) == (True, 2001, 3000, 0o700)
    keys = host.file("/export/home/alice/.ssh/authorized_keys")
    assert (keys.uid, keys.mode, keys.content_string) == (2001, 0o600, ALICE_KEY + "\n")
    assert host.file("/export/home/alice/.bashrc").uid == 2001  # /etc/skel's files
    assert host.file("/export/home/bob").uid == 2002
    # the clients only name the homes (they mount the export; kernel NFS: the lab)
    assert not node("slurm-gpu01").file("/export/home/alice").exists


def _shadow(h: Any, user: str) -> tuple[str, str]:
    """(password field, account expiry in days since 1970) from /etc/shadow."""
    fields = h.check_output(f"getent shadow {user}").split(":")
    return fields[1], fields[7]


@pytest.mark.parametrize("name", ["slurm-head", "slurm-gpu02"])
def test_locked_and_retired_users_are_locked_and_keep_their_files(name: str) -> None:
    h = node(name)
    assert _shadow(h, "alice") == ("*", "")  # no password, key login only, no expiry
    assert _shadow(h, "carol") == ("!*", "1")  # state: locked in the manifest
    assert _shadow(h, "bob") == ("!*", "1")  # taken out of the manifest in side_effect
    assert h.check_output("cat /var/lib/provision/users.json") == '["alice", "bob", "carol"]'
    # login is refused: su runs PAM's account stage, which refuses the expired account
    assert h.run("su -s /bin/sh -c true bob").rc != 0
    assert h.run("su -s /bin/sh -c true alice").rc == 0


# --------------------------------------------------------------------------- fair share
def _as(host: Any, user: str, command: str) -> Any:
    return host.run(f"su -s /bin/sh {user} -c {shlex.quote(command)}")


def _submit(host: Any, user: str, options: str) -> Any:
    return _as(host, user, f"sbatch --parsable --chdir=/tmp -o /dev/null -t 5 {options} --wrap 'sleep 60'")


def test_slurmdbd_holds_the_manifests_tree_and_the_retired_users_association_is_gone(host: Any) -> None:
    assoc = host.check_output("sacctmgr -n -P show assoc cluster=slurmtest format=Account,User,ParentName,Share")
    rows = set(assoc.splitlines())
    assert {"research||root|10", "vision||research|1", "vision|alice||1", "research|alice||1"} <= rows
    assert not [r for r in rows if "|bob|" in r]  # bob left the manifest in side_effect: removed
    assert host.check_output("sacctmgr -n -P show user alice format=DefaultAccount") == "vision"
    qos = host.check_output("sacctmgr -n -P show qos long format=MaxTRESPU,MaxJobsPU,MaxWall")
    assert qos == "gres/gpu=1|2|3-00:00:00"
    conf = host.file("/etc/slurm/slurm.conf").content_string
    assert "PriorityType=priority/multifactor" in conf
    assert "AccountingStorageEnforce=associations,limits,qos" in conf


def test_a_users_job_runs_under_their_default_account_and_qos(host: Any) -> None:
    job = _submit(host, "alice", "")
    assert job.rc == 0, job.stderr
    try:
        shown = host.check_output(f"squeue -h -j {job.stdout.strip()} -o '%u|%a|%q'")
        assert shown == "alice|vision|normal"
    finally:
        host.run(f"scancel {job.stdout.strip()}")


def test_a_qos_the_account_lacks_is_refused_and_a_qos_limit_holds_a_job_over_it(host: Any) -> None:
    refused = _submit(host, "alice", "-A research --qos=long")
    assert refused.rc != 0 and "Invalid qos specification" in refused.stderr
    nobody = _submit(host, "carol", "")  # locked, and no association: refused
    assert nobody.rc != 0
    job = _submit(host, "alice", "-A vision --qos=long --gres=gpu:2")  # long allows 1 GPU per user
    assert job.rc == 0, job.stderr
    try:
        reason = wait_reason(host, job.stdout.strip())
        assert reason.startswith("QOSMax"), reason
    finally:
        host.run(f"scancel {job.stdout.strip()}")


def wait_reason(host: Any, job: str) -> str:
    """Why the pending job waits, once the scheduler has looked at it (not "None")."""
    def pending() -> str:
        shown: str = host.check_output(f"squeue -h -j {job} -o '%T|%r'")
        return shown.split("|", 1)[1] if shown.startswith("PENDING|") and shown != "PENDING|None" else ""

    return wait_for(f"job {job} pending with a reason", pending, timeout=30)


# --------------------------------------------------------------------------- SSH only with a job
# The node's own sshd (port 22 on the scenario's network; Ansible's connection is a separate
# sshd without PAM), reached from the head with a key made here. slurm-gpu02: slurm-gpu01's
# one CPU is held by side_effect's long job, and alice's job must start at once.
NODE = "slurm-gpu02"
KEY = "/root/.ssh/provision-adopt-test"
SSH = (f"timeout 30 ssh -i {KEY} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
       "-o ConnectTimeout=10")
REFUSED = "Access denied by pam_slurm_adopt: you have no active jobs on this node"


@pytest.fixture(scope="module")
def ssh_keys(host: Any) -> Any:
    """The test key in root's and alice's authorized keys on the node. alice's home comes from
    the homes export on a real node (kernel NFS: the lab); here it is made for the test."""
    host.check_output(f"install -d -m 0700 /root/.ssh && (test -f {KEY} || ssh-keygen -q -t ed25519 -N '' -f {KEY})")
    public = host.check_output(f"cat {KEY}.pub")
    target = node(NODE)
    target.check_output(
        f"install -d -m 0700 -o alice -g vision /home/alice /home/alice/.ssh && "
        f"echo {shlex.quote(public)} > /home/alice/.ssh/authorized_keys && "
        "chown alice:vision /home/alice/.ssh/authorized_keys && "
        f"install -d -m 0700 /root/.ssh && echo {shlex.quote(public)} > /root/.ssh/authorized_keys2")
    yield
    target.run("rm -rf /home/alice /root/.ssh/authorized_keys2")


def test_verify_finds_the_admins_then_pam_slurm_adopt_in_sshd_on_a_compute_node() -> None:
    """`provision verify`'s slurm.ssh_adopt on the node. With PROVISION_PAM_CAPTURE=FILE its
    command's output is written to FILE (tests/areas/slurm/data/pam-sshd-debian-12-adopted.txt)."""
    out = node(NODE).run(verify.ADOPT_COMMAND)
    capture = os.environ.get("PROVISION_PAM_CAPTURE")
    if capture:
        Path(capture).write_text(out.stdout)
    assert verify.adopt_verdict(verify.parse_sections(out.stdout)).status == "PASS", out.stdout
    rules = node(NODE).file("/etc/security/access-slurm-adopt.conf").content_string.splitlines()
    assert rules[-2:] == ["+:root:ALL", "-:ALL:ALL"]  # no admin users in this manifest
    assert not node("slurm-head").file("/etc/security/access-slurm-adopt.conf").exists  # the head: no


def test_a_user_without_a_job_on_the_node_is_refused_and_root_gets_in(host: Any, ssh_keys: Any) -> None:
    # ssh's own 255 is reported as rc=N on stdout: testinfra takes a 255 for its connection failing
    refused = host.run(f"{SSH} alice@{NODE} true 2>&1; echo rc=$?")
    assert refused.stdout.splitlines()[-1] == "rc=255" and REFUSED in refused.stdout, refused.stdout
    root = host.run(f"{SSH} root@{NODE} cat /proc/self/cgroup")
    assert root.rc == 0, root.stderr
    assert "step_extern" not in root.stdout  # root is never adopted into a job


def test_a_user_with_a_job_on_the_node_lands_in_its_extern_step(host: Any, ssh_keys: Any) -> None:
    job = _as(host, "alice", f"sbatch --parsable --chdir=/tmp -o /dev/null -t 5 -w {NODE} --wrap 'sleep 120'")
    assert job.rc == 0, job.stderr
    job_id = job.stdout.strip()
    try:
        wait_for("alice's job to start", lambda: host.check_output(f"squeue -h -j {job_id} -o %T") == "RUNNING",
                 timeout=30)
        inside = host.run(f"{SSH} alice@{NODE} cat /proc/self/cgroup")
        assert inside.rc == 0, inside.stderr
        assert f"/job_{job_id}/step_extern" in inside.stdout, inside.stdout
    finally:
        host.run(f"scancel {job_id}")
