"""Back up the head, wipe it, restore it (issue 31 item 3), on the real slurmctld, slurmdbd
and MariaDB the scenario built: the role backup installed the tool
(provisioner/areas/backup/tool.py) with its configuration and the passphrase.

One test, in order: a finished job (history), an account (association) and a held job
(queued) exist; a backup is made; slurmdbd's database is dropped, slurmctld's state folder
emptied and the munge key deleted; a restore without --yes changes nothing; with --yes all
three come back and the cluster answers again (the long job of side_effect keeps running).
"""

from __future__ import annotations

from typing import Any

from slurmkit import wait_for

testinfra_hosts = ["ansible://slurm-head"]

TOOL = "python3 /usr/local/sbin/provision-backup"
CONFIG = "/etc/provision-backup/config.json"
STATE = "/var/lib/slurm/slurmctld"
ACCOUNT = "backupcheck"


def _registered(host: Any) -> bool:
    shown = host.run("sinfo -h -N -o %t")
    states = shown.stdout.split()
    return shown.rc == 0 and bool(states) and not any("*" in s or s.startswith("unk") for s in states)


def test_backup_wipe_restore_brings_history_associations_and_queue_back(host: Any) -> None:
    done = host.check_output("sbatch --parsable -o /dev/null --wrap true").strip()
    wait_for("the finished job in sacct", lambda: "COMPLETED" in host.run(f"sacct -n -X -P -j {done} -o State").stdout,
             timeout=60)
    host.check_output(f"sacctmgr -i add account {ACCOUNT} description=backup organization=test")
    held = host.check_output("sbatch --parsable --hold -o /dev/null --wrap true").strip()
    key = host.check_output("sha256sum /etc/munge/munge.key").split()[0]
    long_job = host.check_output("cat /root/long_job_id").strip()

    name = host.check_output(f"{TOOL} make {CONFIG}").strip()
    assert name.startswith("provision-backup-slurmtest-")
    listing = host.check_output(f"ls /srv/provision-backups/{name}").split()
    assert sorted(listing) == ["SHA256SUMS", "backup.json", "munge.tar.gz.enc", "slurmctld-state.tar.gz",
                               "slurmdbd.sql.gz"]
    host.check_output(f"cd /srv/provision-backups/{name} && sha256sum -c --quiet SHA256SUMS")
    assert host.run(f"zcat /srv/provision-backups/{name}/slurmdbd.sql.gz | grep -c {ACCOUNT}").stdout.strip() != "0"

    # the head loses its accounting database, its controller state and its identity
    host.check_output("systemctl stop slurmctld slurmdbd")
    host.check_output("mysql -e 'DROP DATABASE slurm_acct_db'")
    host.check_output(f"find {STATE} -mindepth 1 -delete")
    host.check_output("rm -f /etc/munge/munge.key")

    refused = host.run(f"{TOOL} restore {CONFIG} {name}")
    assert refused.rc == 2, refused.stderr
    assert "overwrite database slurm_acct_db from slurmdbd.sql.gz" in refused.stdout
    assert "run again with --yes" in refused.stderr
    assert not host.file("/etc/munge/munge.key").exists

    restored = host.run(f"{TOOL} restore {CONFIG} {name} --yes")
    assert restored.rc == 0, restored.stderr
    assert host.check_output("sha256sum /etc/munge/munge.key").split()[0] == key
    assert host.file("/etc/munge/munge.key").user == "munge"
    wait_for("slurmctld to answer", lambda: host.run("scontrol ping").stdout.count("UP") >= 1, timeout=60)
    wait_for("the job history back in sacct",
             lambda: "COMPLETED" in host.run(f"sacct -n -X -P -j {done} -o State").stdout, timeout=60)
    assert host.check_output(f"sacctmgr -n -P show account {ACCOUNT} format=Account").strip() == ACCOUNT
    assert host.check_output(f"squeue -h -j {held} -o %T").strip() == "PENDING"
    assert host.check_output(f"squeue -h -j {long_job} -o %T").strip() == "RUNNING"
    # registered again: not unknown (the restarted controller has not heard from it) nor not responding (*)
    wait_for("every node to register with slurmctld again", lambda: _registered(host), timeout=120)

    host.check_output(f"scancel {held}")
    host.check_output(f"sacctmgr -i delete account {ACCOUNT}")
