"""The job prolog's DCGM diagnostic on a real Slurm (manifest verify.prolog_diag, role slurm's
prolog.d/20-provision-dcgm-diag). Runs after test_slurm.py: a stand-in ``dcgmi`` on
slurm-gpu03 first passes (the GPU job runs, the diagnostic saw the job's GPU), then fails: the
node is drained with the acceptance gate's reason and the job is requeued, not run. The node
is resumed and the stand-in removed afterwards."""

from __future__ import annotations

import re
import shlex
from typing import Any

from slurmkit import node, wait_for

testinfra_hosts = ["ansible://slurm-head"]

NODE = "slurm-gpu03"
CALLS = "/var/tmp/dcgmi-stand-in.calls"
DCGMI = "/usr/local/bin/dcgmi"
REASON = "provision gate: prolog gpu.dcgm failed: dcgmi diag -r 1 -i "


def stand_in(n: Any, rc: int) -> None:
    script = f'#!/bin/sh\necho "$*" >> {CALLS}\nexit {rc}\n'
    n.check_output(f"printf %s {shlex.quote(script)} > {DCGMI} && chmod 755 {DCGMI}")


def state_and_reason(host: Any) -> tuple[str, str]:
    shown = host.check_output(f"scontrol show node {NODE} --oneliner")
    state = re.search(r"\bState=(\S+)", shown)
    reason = re.search(r"\bReason=(.*?) \[[^\]]*\]", shown)
    return (state.group(1) if state else ""), (reason.group(1) if reason else "")


def test_the_prolog_diagnoses_a_gpu_job_and_a_failure_drains_the_node_and_requeues_it(host: Any) -> None:
    n = node(NODE)
    script = n.file("/etc/slurm/prolog.d/20-provision-dcgm-diag")
    assert script.user == "root" and script.mode == 0o755
    assert state_and_reason(host)[0] == "IDLE"
    job = ""
    try:
        n.check_output(f"rm -f {CALLS}")
        stand_in(n, 0)
        host.check_output(f"srun --time=2 -w {NODE} true")  # no GPU in the job: nothing to check
        assert not n.file(CALLS).exists
        host.check_output(f"srun --time=2 -w {NODE} --gres=gpu:1 true")
        assert re.fullmatch(r"diag -r 1 -i [01]\n", n.file(CALLS).content_string), n.file(CALLS).content_string

        stand_in(n, 226)
        job = host.check_output(f"sbatch --parsable --time=2 -w {NODE} --gres=gpu:1 -o /dev/null --wrap true").strip()
        state, reason = wait_for("the prolog to drain the node",
                                 lambda: (s := state_and_reason(host))[0].count("DRAIN") and s, timeout=60)
        assert "DRAIN" in state and reason.startswith(REASON), (state, reason)
        assert reason.endswith(f"exited 226 (job {job})"), reason

        # requeued: Restarts counts it at once, while the job stays COMPLETING until slurmd
        # has cleaned up the failed launch (seconds on a loaded machine), then PENDING
        def requeued() -> str:
            shown: str = host.check_output(f"scontrol show job {job} --oneliner")
            settled = re.search(r"\bRestarts=[1-9]", shown) and not re.search(r"\bJobState=COMPLETING\b", shown)
            return shown if settled else ""

        shown = wait_for("the job requeued", requeued, timeout=90)
        assert re.search(r"\bJobState=PENDING\b", shown), shown  # requeued, never ran
        assert re.search(r"\bRunTime=00:00:00\b", shown), shown
    except BaseException:  # what slurmd said about the prolog, for the log
        print(n.run("tail -n 40 /var/log/slurm/slurmd.log; systemctl show slurmd -p PrivateTmp -p ProtectSystem "
                    f"-p ReadWritePaths -p Environment; ls -l {DCGMI} {CALLS}; cat {CALLS}").stdout)
        raise
    finally:
        if job:
            host.run(f"scancel {job}")
        n.run(f"rm -f {DCGMI} {CALLS}")
        host.run(f"scontrol update nodename={NODE} state=resume")
    wait_for(f"{NODE} idle again", lambda: state_and_reason(host)[0] == "IDLE", timeout=60)
