"""Benchmark: ``provision apply`` on the container test bed, with Ansible's linear strategy and
with Mitogen's.

Run: .venv/bin/python bench/bench_apply.py [--strategies linear mitogen] [--json FILE]
     [--doc docs/benchmarks.md]
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

Each apply is timed from the command's start to its end; the per-task times Ansible
recorded (the run's job events) say where the time went and are written to the JSON.
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
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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

    def open(self) -> None:
        podman("network", "rm", "-f", NETWORK, check=False)  # a leftover of an interrupted run of ours
        podman("network", "create", "--subnet", SUBNET, "--gateway", GATEWAY, NETWORK)
        self.network = True

    def start(self, names: Sequence[str]) -> None:
        """Start a systemd container per node name, each with our key for root; wait for SSH."""
        pub = self.key.with_suffix(".pub").read_text()
        for name in names:
            ip = f"10.213.30.{self.next_host}"
            self.next_host += 1
            container = PREFIX + name
            podman("rm", "-f", "-t", "0", container, check=False)
            self.containers.append(container)
            podman("run", "-d", "--name", container, "--hostname", name, "--network", NETWORK, "--ip", ip,
                   "--systemd=always", "--cap-add", "NET_ADMIN", IMAGE, "/sbin/init")
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

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            container = PREFIX + name
            podman("rm", "-f", "-t", "0", container, check=False)
            if container in self.containers:
                self.containers.remove(container)
            self.addresses.pop(name, None)

    def close(self) -> None:
        for container in list(self.containers):
            podman("rm", "-f", "-t", "0", container, check=False)
        self.containers.clear()
        if self.network:
            podman("network", "rm", "-f", NETWORK, check=False)
            self.network = False


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


def provision_exe() -> str:
    script = Path(sys.executable).parent / "provision"
    if not script.is_file():
        raise BenchError(f"{script} is missing (scripts/install.sh)")
    return str(script)


def where_time_went(state_dir: Path, run_id: str) -> dict[str, Any]:
    """From the run's job events: seconds until Ansible's first task started, and the tasks
    that took longest (summed over hosts; a task runs on the hosts at once)."""
    events_dir = state_dir / "runs" / run_id / "artifacts" / "artifacts" / "job_events"
    events = []
    for path in events_dir.glob("*.json"):
        try:
            events.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    events.sort(key=lambda e: e.get("counter", 0))
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

    @property
    def path(self) -> Path:
        return self.folder / "cluster.yaml"

    def write(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.folder.mkdir(parents=True, exist_ok=True)
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
        start = time.perf_counter()
        r = run(argv, APPLY_TIMEOUT, check=False, cwd=self.folder)
        seconds = time.perf_counter() - start
        state = json.loads((self.folder / ".provision" / "state.json").read_text())
        last = state["runs"][-1]
        if r.returncode != 0:
            raise BenchError(f"apply {' '.join(extra)} on {self.name} failed (exit {r.returncode}): "
                             + (r.stdout + r.stderr)[-1500:])
        return {
            "seconds": round(seconds, 2),
            "targets": last.get("targets", []),
            "changed": sum(last.get("changed", {}).values()),
            **where_time_went(self.folder / ".provision", last["id"]),
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


def one_strategy(bed: Testbed, work: Path, strategy: str, out: dict[str, Any],
                 on_result: Callable[[], None] | None = None, keep: Path | None = None) -> None:
    """Every apply figure with one strategy, on fresh containers, into ``out``; ``on_result``
    after each figure; ``keep``: copy each cluster's run artifacts there."""
    tag = "l" if strategy == "linear" else "m"

    def note(key: str, result: dict[str, Any]) -> None:
        out[key] = result
        if on_result is not None:
            on_result()
        print(f"[{strategy}] {key}: {result['seconds']:.1f} s, {result['changed']} changed, "
              f"targets {result['targets']}", flush=True)

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
            rows.append((f"{strategy}: the rest", "an apply failed: " + str(got["error"])[:100].replace("|", "/"),
                         "", "NOT measured"))
    return rows


def markdown(result: dict[str, Any]) -> str:
    mach = result["machine"]
    lines = [
        f"Measured {mach['date']} on {mach['cpus']} cores ({mach['cpu_model'] or 'unknown CPU'}), load average "
        f"{mach['load_1m_start']} at the start and {mach['load_1m_end']} at the end; containers from {IMAGE}, apt "
        f"{mach.get('apt', 'through the host apt-cacher-ng (warm)')}; one run.",
        "",
        "| figure | measured | goal | |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in figures(result)),
        "",
        "Every timed apply (seconds; changed tasks; the slowest task and its seconds):",
        "",
        "| strategy | apply | seconds | changed | slowest task |",
        "|---|---|---:|---:|---|",
    ]
    for strategy, got in result["strategies"].items():
        for key, value in got.items():
            if isinstance(value, dict):
                slow = value["slowest_tasks_s"][0] if value["slowest_tasks_s"] else ["-", 0, 0]
                lines.append(f"| {strategy} | {key} | {value['seconds']:.1f} | {value['changed']} | "
                             f"{slow[0]} ({slow[1]:.1f} s) |")
    return "\n".join(lines)


def write_doc(doc: Path, block: str) -> None:
    text = doc.read_text()
    start, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no block between {DOC_BEGIN!r} and {DOC_END!r} to refresh")
    doc.write_text(text[: start + len(DOC_BEGIN)] + "\n" + block + "\n" + text[end:])


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "load_1m_start": round(os.getloadavg()[0], 2),
            "date": time.strftime("%Y-%m-%d %H:%M")}


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
    args = parser.parse_args(argv)
    if args.from_json:
        return report(json.loads(args.from_json.read_text()), args.doc)
    missing = testbed_missing()
    if missing:
        print(f"bench_apply: {missing}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"machine": machine(), "packages": role_packages(), "strategies": {}}
    failed = False
    with terminated_cleanly(), tempfile.TemporaryDirectory(prefix="bench-apply-") as tmp:
        work = Path(tmp)
        key = work / "id_ed25519"
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], 60)
        bed = Testbed(key)
        try:
            bed.open()
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
                    one_strategy(bed, work, strategy, got, save, args.keep_runs)
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
    rows = figures(result)
    width = max((len(r[0]) for r in rows), default=10)
    for figure, measured, goal, verdict in rows:
        print(f"{figure:<{width}}  {measured:<32} {goal:<9} {verdict}")
    if doc:
        write_doc(doc, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
