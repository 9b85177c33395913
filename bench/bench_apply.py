"""Benchmark: ``provision apply`` on the container test bed, with Ansible's linear strategy and
with Mitogen's.

Run: .venv/bin/python bench/bench_apply.py [--strategies linear mitogen] [--json FILE]
     [--doc docs/benchmarks.md]
     .venv/bin/python bench/bench_apply.py --nodes 32 [--strategies linear] [--json FILE] [--doc ...]
     (``--from-json FILE [--doc ...]`` prints or writes the figures of an earlier run)

Needs the test bed (tests/testbed/setup.sh: podman, localhost/provision-base:bookworm, the
host's apt-cacher-ng) and root. It creates the podman network ``bench-apply``
(10.213.30.0/24) and containers named ``bench-*``, and removes them when it ends, also on
failure, Ctrl-C or SIGTERM; every wait has a bound. Takes 7-10 minutes on a 2-core machine (warm apt cache).

Figures, per strategy (fresh containers for each), next to the goals of issue 14:

* the first converge of one node (``provision apply`` of a one-node cluster) against a bare
  ``apt-get update && apt-get install`` of the same packages (the role's own list, read
  from roles/common) in a fresh container, both from the same warm cache (a container
  installs them once before anything is timed);
* adding one node to that converged one-node cluster, and to a converged cluster of 8;
* on the e2e's cluster of 4 (a head and three compute nodes): a no-op re-apply and
  ``apply --full``.

With ``--nodes N`` (issue 35) it measures growth instead, on a cluster with Slurm (a head with
slurmctld, compute nodes with slurmd in privileged containers, as the rolling end-to-end test
has them; no convenience packages): the first converge of a head and one compute node, a node
added to it, grown to 4 and a no-op re-apply of the 4; then, on fresh containers, the first
converge of N (a head and N-1 compute nodes), a no-op re-apply of N, ``apply --full`` of N,
a node added to N, and a rolling change of every compute node (``apply --rolling --batch 8``:
drained, their plays, verify, resumed). Every container shares this machine's cores: the
figures of N say how the controller's cost grows and, by the CPU split, what the nodes cost.

Each apply is timed from the command's start to its end; the per-task times Ansible
recorded (the run's job events) say where the time went and are written to the JSON. Each
apply runs in a cgroup of its own (v1 cpuacct or v2): its CPU time (the SSH masters it
starts included) and its peak memory (the processes' PSS summed, sampled every 0.25 s) are
the controller's; the containers' cgroups give the nodes' CPU time.
Not a test: it asserts nothing about time (it exits 1 only when an apply fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "localhost/provision-base:bookworm"
NETWORK = "bench-apply"
SUBNET = "10.213.30.0/24"
GATEWAY = "10.213.30.1"
PREFIX = "bench-"  # container names
STRATEGIES = ("linear", "mitogen")

APT_CACHE = "http://127.0.0.1:3142"  # the test bed's apt-cacher-ng (the containers' apt proxy)
APPLY_TIMEOUT = 1200  # seconds, one `provision apply`
PODMAN_TIMEOUT = 120
SSH_WAIT = 180
APT_TIMEOUT = 900

GOALS = {  # issue 14
    "noop_s": 15.0,
    "full_s": 60.0,
    "onboard_ratio": 1.2,
    "converge_ratio": 1.3,
}
DOC_BEGIN = "<!-- bench_apply: begin (written by bench/bench_apply.py --doc) -->"
DOC_END = "<!-- bench_apply: end -->"

SCALE_GOALS = {  # issue 35: the cost that grows with the cluster
    "noop_ratio": 2.5,  # no-op re-apply of N / of 4
    "add_ratio": 1.2,  # a node added to N / to 1
    "converge_ratio": 3.0,  # first converge of N / of 1
}
SCALE_APPLY_TIMEOUT = 3600  # seconds, one `provision apply` of the N-node cluster
SCALE_BATCH = 8  # the rolling change's batch
SCALE_DOC_BEGIN = "<!-- bench_apply scale: begin (written by bench/bench_apply.py --nodes N --doc) -->"
SCALE_DOC_END = "<!-- bench_apply scale: end -->"
CGROUP_NAME = "bench-apply-controller"
SAMPLE_EVERY = 0.25  # seconds between two samples of the controller's memory
# the rolling change: node-local for every compute node (their common role re-runs)
CHANGED_LIMITS = [{"domain": "*", "type": "soft", "item": "memlock", "value": "unlimited"},
                  {"domain": "*", "type": "hard", "item": "memlock", "value": "unlimited"}]


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------- the test bed
def run(argv: Sequence[str], timeout: float, check: bool = True, stdin: str | None = None,
        cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=stdin, cwd=cwd,
                           env=env, check=False)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(argv[:4])} ...: no result within {timeout:.0f} s") from None
    if check and r.returncode != 0:
        raise BenchError(f"{' '.join(argv[:6])} ... exited {r.returncode}: {(r.stderr or r.stdout)[-800:]}")
    return r


def podman(*args: str, timeout: float = PODMAN_TIMEOUT, check: bool = True,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], timeout, check=check, stdin=stdin)


def testbed_missing() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (run tests/testbed/setup.sh)"
    if os.geteuid() != 0:
        return "the container test bed needs root"
    if run(["podman", "image", "exists", IMAGE], 60, check=False).returncode != 0:
        return f"{IMAGE} is missing (run tests/testbed/setup.sh)"
    if run(["curl", "-fsS", "-o", "/dev/null", "--max-time", "5", f"{APT_CACHE}/acng-report.html"], 30,
           check=False).returncode != 0:
        # the containers would go straight to the mirror: every figure would time the network
        return f"the host's apt-cacher-ng does not answer at {APT_CACHE} (run tests/testbed/setup.sh)"
    return None


@dataclass
class Testbed:
    """The bench's network and containers; :meth:`close` removes every one of them."""

    key: Path
    containers: list[str] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)
    network: bool = False
    next_host: int = 10
    cgroups: dict[str, Path] = field(default_factory=dict)  # container: its CPU usage file

    def open(self) -> None:
        podman("network", "rm", "-f", NETWORK, check=False)  # a leftover of an interrupted run of ours
        podman("network", "create", "--subnet", SUBNET, "--gateway", GATEWAY, NETWORK)
        self.network = True

    def start(self, names: Sequence[str], privileged: Sequence[str] = ()) -> None:
        """Start a systemd container per node name, each with our key for root; wait for SSH.
        ``privileged``: these run privileged (slurmd's cgroup plugins write their cgroups)."""
        pub = self.key.with_suffix(".pub").read_text()
        for name in names:
            ip = f"10.213.30.{self.next_host}"
            self.next_host += 1
            container = PREFIX + name
            podman("rm", "-f", "-t", "0", container, check=False)
            self.containers.append(container)
            rights = ["--privileged"] if name in privileged else ["--cap-add", "NET_ADMIN"]
            podman("run", "-d", "--name", container, "--hostname", name, "--network", NETWORK, "--ip", ip,
                   "--systemd=always", *rights, IMAGE, "/sbin/init")
            usage = cpu_usage_file(podman("inspect", "--format", "{{.State.CgroupPath}}", container).stdout.strip())
            if usage is not None:
                self.cgroups[container] = usage
            podman("exec", "-i", container, "bash", "-c", "mkdir -p -m 700 /root/.ssh && "
                   "cat > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys", stdin=pub)
            self.addresses[name] = ip
        deadline = time.monotonic() + SSH_WAIT
        for name in names:
            self.wait_ssh(self.addresses[name], deadline)

    def wait_ssh(self, ip: str, deadline: float) -> None:
        while True:
            r = run(["ssh", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                     "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", f"root@{ip}", "true"],
                    30, check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"sshd on {ip} did not answer within {SSH_WAIT} s")
            time.sleep(1)

    def exec(self, name: str, script: str, timeout: float) -> float:
        """Run a shell script in the node's container; its wall time."""
        start = time.perf_counter()
        podman("exec", PREFIX + name, "bash", "-ec", script, timeout=timeout)
        return time.perf_counter() - start

    def nodes_cpu_s(self) -> float | None:
        """CPU seconds the running containers have used so far (None: their cgroups are unknown)."""
        if not self.cgroups:
            return None
        return sum(cpu_seconds(usage) for usage in self.cgroups.values())

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            container = PREFIX + name
            podman("rm", "-f", "-t", "0", container, check=False)
            if container in self.containers:
                self.containers.remove(container)
            self.cgroups.pop(container, None)
            self.addresses.pop(name, None)

    def close(self) -> None:
        for container in list(self.containers):
            podman("rm", "-f", "-t", "0", container, check=False)
        self.containers.clear()
        self.cgroups.clear()
        if self.network:
            podman("network", "rm", "-f", NETWORK, check=False)
            self.network = False


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_CONTAINER = 16  # systemd and its units in one container hold several each


def make_inotify_room(containers: int) -> None:
    """Every container's systemd takes inotify instances from root's one budget; at the usual
    128 the 17th container's init exits at once (255, no log). Raise the budget for this many."""
    need = 128 + INOTIFY_PER_CONTAINER * containers
    have = int(INOTIFY_INSTANCES.read_text())
    if have < need:
        INOTIFY_INSTANCES.write_text(f"{need}\n")
        print(f"bench_apply: fs.inotify.max_user_instances {have} -> {need} for {containers} containers",
              flush=True)


# --------------------------------------------------------------------------- CPU and memory
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").is_file()


def cpu_usage_file(cgroup: str) -> Path | None:
    """The file with a cgroup's CPU usage (``cgroup``: its path below the hierarchy's root)."""
    if not cgroup:
        return None
    rel = cgroup.lstrip("/")
    usage = CGROUP_ROOT / rel / "cpu.stat" if cgroup_v2() else CGROUP_ROOT / "cpuacct" / rel / "cpuacct.usage"
    return usage if usage.is_file() else None


def cpu_seconds(usage: Path) -> float:
    """CPU seconds from a cgroup's cpu.stat (v2: usage_usec) or cpuacct.usage (v1: nanoseconds)."""
    try:
        text = usage.read_text()
    except OSError:  # the container went away
        return 0.0
    if usage.name == "cpu.stat":
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return 0.0
    return int(text.strip() or 0) / 1e9


def pss_kib(pid: int) -> int:
    """A process's proportional set size (shared pages split between their users), KiB."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):  # the process ended between the listing and the read
        pass
    return 0


class Controller:
    """A cgroup of the bench's own for each apply's process tree: its CPU time (the SSH masters
    it leaves running included) and its peak memory (the processes' PSS summed, sampled)."""

    def __init__(self) -> None:
        v2 = cgroup_v2()
        base = CGROUP_ROOT if v2 else CGROUP_ROOT / "cpuacct"
        self.usage = "cpu.stat" if v2 else "cpuacct.usage"  # the file of its CPU time
        self.path: Path | None = base / CGROUP_NAME
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:
            print(f"bench_apply: no cgroup for the controller ({exc}): its CPU and memory are not measured",
                  file=sys.stderr)
            self.path = None
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the cgroup (the shell moves itself in, then execs it)."""
        if self.path is None:
            return list(argv)
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *argv]

    def cpu_s(self) -> float | None:
        if self.path is None:
            return None
        return cpu_seconds(self.path / self.usage)

    def pids(self) -> list[int]:
        if self.path is None:
            return []
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self.peak_kib = max(self.peak_kib, sum(pss_kib(pid) for pid in self.pids()))

    @contextmanager
    def measured(self) -> Iterator[dict[str, float | None]]:
        """Around one apply: yields a dict that holds its CPU seconds and peak MiB afterwards."""
        got: dict[str, float | None] = {}
        before = self.cpu_s()
        self.peak_kib = 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        try:
            yield got
        finally:
            self._stop.set()
            self._thread.join()
            after = self.cpu_s()
            got["controller_cpu_s"] = None if before is None or after is None else round(after - before, 2)
            got["controller_peak_mib"] = round(self.peak_kib / 1024, 1) if self.path is not None else None

    def close(self) -> None:
        """End what is left in the cgroup (the applies' SSH masters), then remove it."""
        if self.path is None:
            return
        for pid in self.pids():
            with suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            self.path.rmdir()
        except OSError as exc:
            print(f"bench_apply: {self.path} stays: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------- clusters
def manifest(name: str, nodes: Sequence[str], addresses: dict[str, str], key: Path) -> dict[str, Any]:
    """The e2e's cluster shape: Debian 12 containers, a head and compute nodes, no Docker or Slurm."""
    pub = key.with_suffix(".pub").read_text().strip()
    return {
        "version": 1,
        "cluster": {
            "name": name,
            "domain": "bench.test",
            "timezone": "Europe/Berlin",
            "admin_users": [{"name": "ops", "ssh_keys": [pub]}, {"name": "viewer", "sudo": False, "ssh_keys": [pub]}],
            "ssh": {"user": "root", "private_key": str(key)},
        },
        "networks": {"management": {"cidr": SUBNET, "gateway": GATEWAY}},
        "nodes": [
            {
                "name": node,
                "roles": ["head"] if i == 0 else ["compute"],
                "os": "debian-12",
                "interfaces": {"management": {"ip": addresses[node]}},
                "hardware": {"cpu": {"cores_per_socket": 2}, "memory_gb": 4},
            }
            for i, node in enumerate(nodes)
        ],
        "docker": {"enabled": False},
        "slurm": {"enabled": False},
    }


def scale_manifest(name: str, nodes: Sequence[str], addresses: dict[str, str], key: Path,
                   changed: Sequence[str] = ()) -> dict[str, Any]:
    """The rolling end-to-end test's shape: Slurm on (no accounting), compute nodes of one CPU and
    4 GiB (slurmd's hardware check passes on any machine), no convenience packages; ``changed``:
    these nodes get a node-local change (pam limits)."""
    data = manifest(name, nodes, addresses, key)
    for node in data["nodes"][1:]:
        node["hardware"] = {"cpu": {"sockets": 1, "cores_per_socket": 1, "threads_per_core": 1}, "memory_gb": 4}
    data["cluster"]["admin_users"] = data["cluster"]["admin_users"][:1]
    data["slurm"] = {"accounting": False, "partitions": [{"name": "batch", "nodes": ["@compute"], "default": True}]}
    data["role_vars"] = {"all": {"common_packages": []}}
    for node in changed:
        data["role_vars"][node] = {"common_limits": CHANGED_LIMITS}
    return data


def provision_exe() -> str:
    script = Path(sys.executable).parent / "provision"
    if not script.is_file():
        raise BenchError(f"{script} is missing (scripts/install.sh)")
    return str(script)


def where_time_went(state_dir: Path, run_ids: Sequence[str]) -> dict[str, Any]:
    """From the runs' job events: how many task results, and the tasks that took longest
    (the longest host's seconds, and the seconds summed over hosts; a task runs on the hosts
    at once)."""
    events = []
    for run_id in run_ids:
        events_dir = state_dir / "runs" / run_id / "artifacts" / "artifacts" / "job_events"
        for path in events_dir.glob("*.json"):
            try:
                events.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    events.sort(key=lambda e: (str(e.get("runner_ident", "")), e.get("counter", 0)))
    per_task: dict[str, float] = defaultdict(float)
    wall_per_task: dict[str, float] = defaultdict(float)
    tasks_run = 0
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped") and data.get("task"):
            name = f"{data.get('role') or '-'}: {data['task']}"
            duration = float(data.get("duration") or 0.0)
            per_task[name] += duration
            wall_per_task[name] = max(wall_per_task[name], duration)
            if event.get("event") != "runner_on_skipped":
                tasks_run += 1
    top = sorted(wall_per_task.items(), key=lambda kv: -kv[1])[:8]
    return {
        "task_results": tasks_run,
        "slowest_tasks_s": [[name, round(s, 2), round(per_task[name], 2)] for name, s in top],
    }


@dataclass
class Cluster:
    """A manifest and its state directory in a folder of its own."""

    name: str
    folder: Path
    bed: Testbed
    strategy: str
    nodes: list[str] = field(default_factory=list)
    scale: bool = False  # the --nodes shape (Slurm on)
    changed: list[str] = field(default_factory=list)  # with scale: nodes with the node-local change
    controller: Controller | None = None  # measures each apply's CPU and memory
    timeout: float = APPLY_TIMEOUT

    @property
    def path(self) -> Path:
        return self.folder / "cluster.yaml"

    @property
    def state_file(self) -> Path:
        return self.folder / ".provision" / "state.json"

    def write(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.scale:
            data = scale_manifest(self.name, self.nodes, self.bed.addresses, self.bed.key, self.changed)
        else:
            data = manifest(self.name, self.nodes, self.bed.addresses, self.bed.key)
        self.path.write_text(yaml.safe_dump(data, sort_keys=False))

    def keep(self, folder: Path | None) -> None:
        """Copy the run artifacts (job events: per-task times) to ``folder``/<strategy>/<cluster>."""
        if folder is not None:
            shutil.copytree(self.folder / ".provision" / "runs", folder / self.strategy / self.name,
                            dirs_exist_ok=True)

    def apply(self, *extra: str) -> dict[str, Any]:
        """One timed ``provision apply``: seconds, what it changed, where the time went."""
        argv = [provision_exe(), "apply", str(self.path), "--yes", "--strategy", self.strategy, *extra]
        runs_before = len(json.loads(self.state_file.read_text())["runs"]) if self.state_file.is_file() else 0
        usage: dict[str, float | None] = {}
        nodes_before = self.bed.nodes_cpu_s()
        start = time.perf_counter()
        if self.controller is None:
            r = run(argv, self.timeout, check=False, cwd=self.folder)
        else:
            with self.controller.measured() as usage:
                r = run(self.controller.wrap(argv), self.timeout, check=False, cwd=self.folder)
        seconds = time.perf_counter() - start
        nodes_after = self.bed.nodes_cpu_s()
        if nodes_before is not None and nodes_after is not None and self.controller is not None:
            usage["nodes_cpu_s"] = round(nodes_after - nodes_before, 2)
        state = json.loads(self.state_file.read_text())
        ran = state["runs"][runs_before:]  # a rolling apply records a run per batch
        if r.returncode != 0:
            raise BenchError(f"apply {' '.join(extra)} on {self.name} failed (exit {r.returncode}): "
                             + (r.stdout + r.stderr)[-1500:])
        return {
            "seconds": round(seconds, 2),
            "targets": sorted({t for one in ran for t in one.get("targets", [])}),
            "changed": sum(sum(one.get("changed", {}).values()) for one in ran),
            "runs": len(ran),
            **usage,
            **where_time_went(self.folder / ".provision", [one["id"] for one in ran]),
        }


# --------------------------------------------------------------------------- the figures
def role_packages() -> list[str]:
    """What the common role installs on Debian 12: its required packages and its default extras."""
    required = yaml.safe_load((ROOT / "roles/common/vars/Debian.yml").read_text())["__common_required_packages"]
    extra = yaml.safe_load((ROOT / "roles/common/defaults/main.yml").read_text())["common_packages"]
    return list(dict.fromkeys([*required, *extra]))


def apt_script(packages: Sequence[str]) -> str:
    return ("export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null; "
            "apt-get install -y -q --no-install-recommends " + " ".join(packages) + " >/dev/null")


def bare_install(bed: Testbed, packages: Sequence[str]) -> dict[str, float]:
    """Warm the cache (one container installs the packages), then time a bare install in another."""
    bed.start(["warmup", "bare"])
    warm = bed.exec("warmup", apt_script(packages), APT_TIMEOUT)
    bare = bed.exec("bare", apt_script(packages), APT_TIMEOUT)
    bed.remove(["warmup", "bare"])
    return {"warmup_s": round(warm, 2), "bare_apt_s": round(bare, 2)}


def recorder(out: dict[str, Any], on_result: Callable[[], None] | None,
             line: Callable[[str, dict[str, Any]], str]) -> Callable[[str, dict[str, Any]], None]:
    """Keeps each figure in ``out`` under its key, calls ``on_result`` (the JSON is saved) and
    prints ``line`` of it."""
    def note(key: str, result: dict[str, Any]) -> None:
        out[key] = result
        if on_result is not None:
            on_result()
        print(line(key, result), flush=True)
    return note


def one_strategy(bed: Testbed, work: Path, strategy: str, out: dict[str, Any],
                 on_result: Callable[[], None] | None = None, keep: Path | None = None) -> None:
    """Every apply figure with one strategy, on fresh containers, into ``out``; ``on_result``
    after each figure; ``keep``: copy each cluster's run artifacts there."""
    tag = "l" if strategy == "linear" else "m"
    note = recorder(out, on_result, lambda key, result: f"[{strategy}] {key}: {result['seconds']:.1f} s, "
                    f"{result['changed']} changed, targets {result['targets']}")

    # one node, then a second
    small = [f"b{tag}one1", f"b{tag}one2"]
    bed.start(small)
    one = Cluster(f"bench{tag}one", work / strategy / "one", bed, strategy)
    one.write(small[:1])
    note("first_converge", one.apply())
    one.write(small)
    note("add_to_1", one.apply())
    one.keep(keep)
    bed.remove(small)

    # the e2e's cluster of 4; then grown to 8; then a ninth node
    big = [f"b{tag}head", *(f"b{tag}n{i}" for i in range(1, 9))]
    bed.start(big)
    four = Cluster(f"bench{tag}four", work / strategy / "four", bed, strategy)
    four.write(big[:4])
    note("converge_4", four.apply())
    note("noop_4", four.apply())
    note("full_4", four.apply("--full"))
    four.write(big[:8])
    note("grow_4_to_8", four.apply())
    four.write(big[:9])
    note("add_to_8", four.apply())
    four.keep(keep)
    bed.remove(big)


def at_scale(bed: Testbed, work: Path, strategy: str, n: int, out: dict[str, Any],
             on_result: Callable[[], None] | None = None, keep: Path | None = None) -> None:
    """The growth figures (``--nodes n``) with one strategy, into ``out``: a small cluster (a head
    and one compute node, one added, grown to 4), then a fresh one of ``n`` nodes (a head and
    n-1 compute nodes): first converge, no-op, --full, one node added, a rolling change."""
    tag = "l" if strategy == "linear" else "m"
    make_inotify_room(n + 1)
    controller = Controller()
    note = recorder(out, on_result, lambda key, result: (
        f"[{strategy} x{n}] {key}: {result['seconds']:.1f} s, {result['changed']} changed, "
        f"{len(result['targets'])} targets, controller CPU {result.get('controller_cpu_s')} s, "
        f"peak {result.get('controller_peak_mib')} MiB, nodes CPU {result.get('nodes_cpu_s')} s"))

    try:
        small = [f"b{tag}sh", *(f"b{tag}s{i}" for i in range(1, 4))]
        bed.start(small, privileged=small[1:])
        one = Cluster(f"bench{tag}small", work / strategy / "small", bed, strategy, scale=True,
                      controller=controller, timeout=SCALE_APPLY_TIMEOUT)
        one.write(small[:2])
        note("first_converge_1", one.apply())
        one.write(small[:3])
        note("add_to_1", one.apply())
        one.write(small)
        note("grow_to_4", one.apply())
        note("noop_4", one.apply())
        one.keep(keep)
        bed.remove(small)

        width = len(str(n))
        compute = [f"b{tag}c{i:0{width}d}" for i in range(1, n + 1)]  # n-1 in the cluster, then one added
        big = [f"b{tag}head", *compute]
        bed.start(big, privileged=compute)
        many = Cluster(f"bench{tag}many", work / strategy / "many", bed, strategy, scale=True,
                       controller=controller, timeout=SCALE_APPLY_TIMEOUT)
        many.write(big[:n])
        note(f"first_converge_{n}", many.apply())
        note(f"noop_{n}", many.apply())
        note(f"full_{n}", many.apply("--full"))
        many.write(big)
        note(f"add_to_{n}", many.apply())
        many.changed = [f"b{tag}c[{1:0{width}d}-{n:0{width}d}]"]  # every compute node: a range
        many.write(big)
        note(f"rolling_{n}", many.apply("--rolling", "--batch", str(SCALE_BATCH)))
        many.keep(keep)
        bed.remove(big)
    finally:
        controller.close()


def failed_row(label: str, error: object) -> tuple[str, str, str, str]:
    """The row of figures an apply's failure left unmeasured (the error, fit for a table cell)."""
    return (label, "an apply failed: " + str(error)[:100].replace("|", "/"), "", "NOT measured")


def timed_applies(result: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], str]]:
    """Every timed apply of a run: strategy, figure, its numbers, its slowest task in words."""
    for strategy, got in result["strategies"].items():
        for key, value in got.items():
            if isinstance(value, dict):
                slow = value["slowest_tasks_s"][0] if value["slowest_tasks_s"] else ["-", 0, 0]
                yield strategy, key, value, f"{slow[0]} ({slow[1]:.1f} s)"


def figures_table(rows: list[tuple[str, str, str, str]]) -> list[str]:
    return ["| figure | measured | goal | |", "|---|---|---|---|",
            *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)]


def scale_nodes(got: dict[str, Any]) -> int | None:
    """N of a --nodes run's figures (from its first_converge_N key)."""
    for key in got:
        if key.startswith("first_converge_") and key != "first_converge_1":
            return int(key.rsplit("_", 1)[1])
    return None


def scale_figures(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, goal, verdict) rows of a --nodes run."""
    rows: list[tuple[str, str, str, str]] = []

    def ratio(label: str, big: dict[str, Any], small: dict[str, Any], goal: float) -> None:
        a, b = float(big["seconds"]), float(small["seconds"])
        rows.append((label, f"{a:.1f} s / {b:.1f} s = {a / b:.2f} x", f"<= {goal} x",
                     "met" if a / b <= goal else "NOT met"))
        ca, cb = big.get("controller_cpu_s"), small.get("controller_cpu_s")
        if ca is not None and cb:
            rows.append((f"{label}, controller CPU", f"{ca:.1f} s / {cb:.1f} s = {ca / cb:.2f} x", "", ""))

    for strategy, got in result["strategies"].items():
        n = scale_nodes(got)
        if n is None:
            if "error" in got:
                rows.append(failed_row(f"{strategy}: the figures", got["error"]))
            continue
        if f"noop_{n}" in got and "noop_4" in got:
            ratio(f"{strategy}: no-op re-apply of {n} / of 4", got[f"noop_{n}"], got["noop_4"],
                  SCALE_GOALS["noop_ratio"])
        if f"add_to_{n}" in got and "add_to_1" in got:
            ratio(f"{strategy}: add 1 node to {n} / to 1", got[f"add_to_{n}"], got["add_to_1"],
                  SCALE_GOALS["add_ratio"])
        if "first_converge_1" in got:
            ratio(f"{strategy}: first converge of {n} / of 1", got[f"first_converge_{n}"], got["first_converge_1"],
                  SCALE_GOALS["converge_ratio"])
        for key, label in ((f"full_{n}", f"`apply --full` of {n}"),
                           (f"rolling_{n}", f"rolling change of {n} compute nodes, batches of {SCALE_BATCH}")):
            if key in got:
                rows.append((f"{strategy}: {label}", f"{float(got[key]['seconds']):.1f} s", "", ""))
        if "error" in got:
            rows.append(failed_row(f"{strategy}: the rest", got["error"]))
    return rows


def measured_on(mach: dict[str, Any], memory: bool = False) -> str:
    """The machine a result was measured on, in the tables' opening sentence."""
    gib = f"{mach.get('memory_gib', '?')} GiB, " if memory else ""
    return (f"Measured {mach['date']} on {mach['cpus']} cores ({mach['cpu_model'] or 'unknown CPU'}), {gib}"
            f"load average {mach['load_1m_start']} at the start and {mach['load_1m_end']} at the end")


def scale_markdown(result: dict[str, Any]) -> str:
    mach = result["machine"]
    lines = [
        f"{measured_on(mach, memory=True)}; containers from {IMAGE}, apt through the host apt-cacher-ng; one run.",
        "",
        *figures_table(scale_figures(result)),
        "",
        "Every timed apply: wall seconds; the controller's CPU seconds (its cgroup: provision, Ansible's "
        "workers, the SSH clients) and peak memory (PSS summed); the nodes' CPU seconds (every container's "
        "cgroup); changed tasks; the slowest task (its longest host):",
        "",
        "| strategy | apply | targets | seconds | controller CPU s | peak MiB | nodes CPU s | changed | slowest task |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for strategy, key, value, slowest in timed_applies(result):
        lines.append(f"| {strategy} | {key} | {len(value['targets'])} | {value['seconds']:.1f} | "
                     f"{value.get('controller_cpu_s')} | {value.get('controller_peak_mib')} | "
                     f"{value.get('nodes_cpu_s')} | {value['changed']} | {slowest} |")
    return "\n".join(lines)


def figures(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, goal, verdict) rows; a figure whose applies failed says so."""
    rows: list[tuple[str, str, str, str]] = []
    bare = result.get("bare_apt_s")

    def verdict(value: float, goal: float) -> str:
        return "met" if value <= goal else "NOT met"

    for strategy, got in result["strategies"].items():
        seconds = {key: float(v["seconds"]) for key, v in got.items() if isinstance(v, dict)}
        if "noop_4" in seconds:
            rows.append((f"{strategy}: no-op re-apply, converged 4 nodes", f"{seconds['noop_4']:.1f} s",
                         f"<= {GOALS['noop_s']:.0f} s", verdict(seconds["noop_4"], GOALS["noop_s"])))
        if "full_4" in seconds:
            rows.append((f"{strategy}: `apply --full`, converged 4 nodes", f"{seconds['full_4']:.1f} s",
                         f"<= {GOALS['full_s']:.0f} s", verdict(seconds["full_4"], GOALS["full_s"])))
        if "add_to_1" in seconds and "add_to_8" in seconds:
            a1, a8 = seconds["add_to_1"], seconds["add_to_8"]
            rows.append((f"{strategy}: add 1 node to 8 / to 1", f"{a8:.1f} s / {a1:.1f} s = {a8 / a1:.2f} x",
                         f"<= {GOALS['onboard_ratio']} x", verdict(a8 / a1, GOALS["onboard_ratio"])))
        if bare and "first_converge" in seconds:
            first = seconds["first_converge"]
            rows.append((f"{strategy}: first converge / bare apt-get", f"{first:.1f} s / {bare:.1f} s = "
                         f"{first / bare:.2f} x", f"<= {GOALS['converge_ratio']} x",
                         verdict(first / bare, GOALS["converge_ratio"])))
        if "error" in got:
            rows.append(failed_row(f"{strategy}: the rest", got["error"]))
    return rows


def markdown(result: dict[str, Any]) -> str:
    mach = result["machine"]
    lines = [
        f"{measured_on(mach)}; containers from {IMAGE}, apt "
        f"{mach.get('apt', 'through the host apt-cacher-ng (warm)')}; one run.",
        "",
        *figures_table(figures(result)),
        "",
        "Every timed apply (seconds; changed tasks; the slowest task and its seconds):",
        "",
        "| strategy | apply | seconds | changed | slowest task |",
        "|---|---|---:|---:|---|",
    ]
    for strategy, key, value, slowest in timed_applies(result):
        lines.append(f"| {strategy} | {key} | {value['seconds']:.1f} | {value['changed']} | {slowest} |")
    return "\n".join(lines)


def write_doc(doc: Path, block: str, begin: str = DOC_BEGIN, end_marker: str = DOC_END) -> None:
    text = doc.read_text()
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no block between {begin!r} and {end_marker!r} to refresh")
    doc.write_text(text[: start + len(begin)] + "\n" + block + "\n" + text[end:])


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(pages * page_size / 2**30, 1),
            "load_1m_start": round(os.getloadavg()[0], 2), "date": time.strftime("%Y-%m-%d %H:%M")}


@contextmanager
def terminated_cleanly() -> Iterator[None]:
    """SIGTERM (as `timeout` sends) unwinds like Ctrl-C, so the test bed is removed."""
    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--doc", type=Path, help="refresh the results block of this Markdown file")
    parser.add_argument("--keep-runs", type=Path, metavar="DIR", help="copy every run's Ansible artifacts here")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="measure nothing: print (and with --doc, write) the figures of an earlier run's --json")
    parser.add_argument("--nodes", type=int, metavar="N",
                        help="measure growth instead: clusters with Slurm of 1, 4 and N nodes (N >= 8; issue 35)")
    args = parser.parse_args(argv)
    if args.nodes is not None and not 8 <= args.nodes <= 200:
        parser.error("--nodes: between 8 and 200 (the bench network's addresses)")
    if args.from_json:
        return report(json.loads(args.from_json.read_text()), args.doc)
    missing = testbed_missing()
    if missing:
        print(f"bench_apply: {missing}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"machine": machine(), "strategies": {}}
    if args.nodes is not None:
        result["nodes"] = args.nodes
    else:
        result["packages"] = role_packages()
    failed = False
    with terminated_cleanly(), tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        work = Path(tmp)
        key = work / "id_ed25519"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], 60)
        bed = Testbed(key)
        try:
            bed.open()
            if args.nodes is None:
                result |= bare_install(bed, result["packages"])
                print(f"bare apt-get install of {len(result['packages'])} packages: {result['bare_apt_s']:.1f} s "
                      f"(warm-up {result['warmup_s']:.1f} s)", flush=True)

            def save() -> None:  # after every figure: a run stopped half-way keeps what it measured
                if args.json:
                    args.json.write_text(json.dumps(result, indent=2) + "\n")

            for strategy in args.strategies:
                got: dict[str, Any] = {}
                result["strategies"][strategy] = got
                try:
                    if args.nodes is None:
                        one_strategy(bed, work, strategy, got, save, args.keep_runs)
                    else:
                        at_scale(bed, work, strategy, args.nodes, got, save, args.keep_runs)
                except BenchError as exc:
                    failed = True
                    got["error"] = str(exc)
                    print(f"[{strategy}] {exc}", file=sys.stderr, flush=True)
                    bed.close()
                    bed.open()
        finally:
            bed.close()
    result["machine"]["load_1m_end"] = round(os.getloadavg()[0], 2)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    report(result, args.doc)
    return 1 if failed else 0


def report(result: dict[str, Any], doc: Path | None) -> int:
    """Print the figures next to their goals; with ``doc``, refresh its results block."""
    print()
    scale = "nodes" in result
    rows = scale_figures(result) if scale else figures(result)
    width = max((len(r[0]) for r in rows), default=10)
    for figure, measured, goal, verdict in rows:
        print(f"{figure:<{width}}  {measured:<32} {goal:<9} {verdict}")
    if doc and scale:
        write_doc(doc, scale_markdown(result), SCALE_DOC_BEGIN, SCALE_DOC_END)
    elif doc:
        write_doc(doc, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
