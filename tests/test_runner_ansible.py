"""provisioner.runner with a real ansible-playbook (no containers): hosts with
``ansible_connection: local`` stand in for nodes, 127.0.0.1 port 1 for a node that cannot
be reached. Each test runs one short playbook (a few seconds)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import proctree
from provisioner.runner import Tracker, run_playbook
from provisioner.state import StateDir


def local(**extra: Any) -> dict[str, Any]:
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **extra}


def write(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path




def test_a_failed_or_unreachable_node_does_not_end_the_others_plays(tmp_path: Path) -> None:
    """Issue 18 item 6: a new node that fails (here: one unreachable, one whose task fails)
    is often the only host of a node-local play; Ansible then ended the whole playbook, so
    the cluster-wide plays after it (/etc/hosts, slurm.conf) ran nowhere, yet the recap
    showed the other nodes ok. Each node's result must be what ran on it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    inventory = write(tmp_path / "hosts.yml", {"all": {
        "hosts": {"l1": local(), "l2": local(), "broken": local(),
                  "gone": {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_ssh_retries": 0}},
        "children": {"provision_targets": {"hosts": {"gone": None}}},
    }})
    playbook = write(tmp_path / "site.yml", [
        {"name": "heavy - only the new node", "hosts": "all:&{{ provision_targets | default('all') }}",
         "gather_facts": False, "tasks": [{"name": "Reach it", "ansible.builtin.ping": None}]},
        {"name": "heavy - a node whose task fails", "hosts": "broken", "gather_facts": False,
         "tasks": [{"name": "Fail", "ansible.builtin.fail": {"msg": "disk on fire"}}]},
        {"name": "light - cluster-wide file", "hosts": "all", "gather_facts": False,
         "tasks": [{"name": "Render", "ansible.builtin.copy": {
             "content": "ok\n", "dest": f"{marks}/{{{{ inventory_hostname }}}}", "mode": "0644"}}]},
    ])
    state = StateDir(tmp_path / "state")
    state.ensure()
    hosts = ["l1", "l2", "broken", "gone", "idle"]  # idle: in the run, in no play of it
    tracker = Tracker(hosts)
    result = run_playbook(state=state, run_id="r1", playbook=playbook, inventory=inventory, hosts=hosts,
                          extravars={"provision_targets": "provision_targets"}, tracker=tracker,
                          stall_timeout=60)
    assert sorted(p.name for p in marks.iterdir()) == ["l1", "l2"]  # the light play ran for the others
    outcome = {h: result.result_of(h) for h in hosts}
    assert outcome == {"l1": "ok", "l2": "ok", "broken": "failed", "gone": "unreachable", "idle": "not run"}
    assert result.finished and result.log.is_file()
    assert "connection refused" in tracker.hosts["gone"].errors[0].lower()
    assert "disk on fire" in tracker.hosts["broken"].errors[0]


def test_the_stall_cap_bounds_tasks_that_carry_a_larger_timeout_of_their_own(tmp_path: Path) -> None:
    """Issue 12: `apply --stall-timeout N` bounds every task by N, also a step whose role
    gives it a larger `timeout:` (the common role's apt steps: 900 s, which a stalled mirror
    ran into); a smaller bound of the task's own stays, templated per host."""
    inventory = write(tmp_path / "hosts.yml", {"all": {"hosts": {
        "large": local(own_bound=600), "small": local(own_bound=1), "none": local()}}})
    playbook = write(tmp_path / "site.yml", [
        {"name": "steps with bounds of their own", "hosts": "all", "gather_facts": False, "tasks": [
            {"name": "Wait for the mirror", "ansible.builtin.command": "sleep 30", "changed_when": False,
             "timeout": "{{ own_bound | default(omit) }}"}]},
    ])
    state = StateDir(tmp_path / "state")
    state.ensure()
    hosts = ["large", "small", "none"]
    tracker = Tracker(hosts)
    start = time.monotonic()
    result = run_playbook(state=state, run_id="r1", playbook=playbook, inventory=inventory, hosts=hosts,
                          tracker=tracker, stall_timeout=4)
    took = time.monotonic() - start
    assert {h: result.result_of(h) for h in hosts} == {"large": "failed", "small": "failed", "none": "failed"}
    assert "Wait for the mirror: stalled: not finished after 4 s" in tracker.hosts["large"].errors[0]
    assert "stalled: not finished after 1 s" in tracker.hosts["small"].errors[0]
    assert "stalled: not finished after 4 s" in tracker.hosts["none"].errors[0]
    assert took < 25, took  # not the 30 s of the sleep, let alone the 600 s of the role's bound


def own_interpreter(tmp_path: Path, host: str) -> str:
    """A path of this Python of the host's own: Mitogen serves the local-connection hosts that
    share an interpreter from one context, one task at a time; with one each they run side by
    side, as two real nodes do."""
    link = tmp_path / f"python-{host}"
    link.symlink_to(sys.executable)
    return str(link)


@pytest.mark.parametrize("strategy", ["mitogen", "linear"])
def test_a_stopped_run_leaves_no_process_behind(processes_with: Callable[[str], list[int]], tmp_path: Path,
                                                strategy: str) -> None:
    """Issue 18 items 7 and 9: stopping a run (a signal) must end ansible-playbook, its
    workers (each in a session of its own) and what they started, before it returns; under
    either strategy (Mitogen's: its connection processes and their children)."""
    marker = f"{os.getpid() % 1000 + 7001}"  # a sleep length no other test uses
    inventory = write(tmp_path / "hosts.yml", {"all": {"hosts": {
        "a": local(ansible_python_interpreter=own_interpreter(tmp_path, "a")),
        "b": local(ansible_python_interpreter=own_interpreter(tmp_path, "b"))}}})
    playbook = write(tmp_path / "site.yml", [
        {"name": "slow", "hosts": "all", "gather_facts": False,
         "tasks": [{"name": "Wait", "ansible.builtin.command": f"sleep {marker}"},
                   {"name": "Never", "ansible.builtin.command": "true"}]},
    ])
    state = StateDir(tmp_path / "state")
    state.ensure()
    deadline = time.monotonic() + 60

    def stop() -> int | None:  # as the Signals of an apply: a signal number once one came
        assert time.monotonic() < deadline, "the sleep tasks never started"
        return signal.SIGTERM if len(processes_with(f"sleep {marker}")) >= 2 else None

    tracker = Tracker(["a", "b"])
    start = time.monotonic()
    result = run_playbook(state=state, run_id="r1", playbook=playbook, inventory=inventory, hosts=["a", "b"],
                          tracker=tracker, stop=stop, stall_timeout=60, strategy=strategy)
    took = time.monotonic() - start
    assert result.interrupted == signal.SIGTERM and not result.finished
    assert processes_with(f"sleep {marker}") == []
    assert processes_with(str(state.runs / "r1")) == []  # no ansible-playbook of this run either
    assert result.leftovers == []
    assert {h: result.result_of(h) for h in ("a", "b")} == {"a": "interrupted", "b": "interrupted"}
    assert tracker.hosts["a"].task == "Wait" and tracker.hosts["a"].events == 0  # nothing finished there
    assert took < 45, took


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_the_subreaper_adopts_orphans_and_stop_tree_ends_them(processes_with: Callable[[str], list[int]],
                                                               tmp_path: Path) -> None:
    """A grandchild in a session of its own whose parent exited (like an Ansible worker
    after ansible-playbook was killed) is still found and stopped."""
    marker = f"{os.getpid() % 1000 + 8001}"
    with proctree.subreaper() as on:
        assert on
        subprocess.run(["setsid", "-f", "sleep", marker], check=True)  # forks, the parent exits at once
        time.sleep(0.3)
        (orphan,) = processes_with(f"sleep {marker}")
        assert orphan in proctree.descendants()
        assert proctree.stop_tree(grace=0.5, deadline=10) == []
    assert processes_with(f"sleep {marker}") == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_an_ssh_connection_master_is_told_from_other_processes(tmp_path: Path) -> None:
    """After a finished run every process it started is stopped but OpenSSH's connection
    masters (they close themselves, ControlPersist): told by the title OpenSSH gives them."""
    master = subprocess.Popen(["bash", "-c", f'exec -a "ssh: {tmp_path}/cp/3f2a [mux]" sleep 30'])
    client = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        title = Path(f"/proc/{master.pid}/cmdline")
        while not title.read_bytes().startswith(b"ssh: ") and time.monotonic() < deadline:  # until bash exec'd
            time.sleep(0.02)
        assert proctree.ssh_master(master.pid) and not proctree.ssh_master(client.pid)
        assert not proctree.ssh_master(2**22 + 7)  # no such process
    finally:
        for proc in (master, client):
            proc.kill()
            proc.wait()
