"""Verify the people the scenario made (role users, playbooks/people.yml): the same uid/gid
on every node, homes made on the NFS server (the head) with their owner, mode and keys,
carol locked by the manifest and bob locked after side_effect took him out, files kept;
the manifest's accounts and QOS in slurmdbd, a job under the user's account and QOS, a QOS
the account lacks refused and a QOS limit holding a job.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Any

import pytest
import testinfra

testinfra_hosts = ["ansible://slurm-head"]

ALL = ["slurm-head", "slurm-gpu01", "slurm-gpu02", "slurm-gpu03"]
ALICE_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2kqf7m7pIo2l8ZpZ5o0rC8m9Qf3c4C3QWv8wq0m2nA alice@test"


def node(name: str) -> Any:
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=os.environ["MOLECULE_INVENTORY_FILE"])


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
    deadline = time.monotonic() + 30
    reason = ""
    while time.monotonic() < deadline:
        reason = host.check_output(f"squeue -h -j {job} -o '%T|%r'")
        if reason.startswith("PENDING|") and reason != "PENDING|None":
            return reason.split("|", 1)[1]
        time.sleep(2)
    return reason
