"""Run the checks: a context probe per node, then each check's command, judged.

The order and the failure rules are here, with the command runner passed in (``Execute``),
so they are unit-tested with fakes; :mod:`provisioner.verify.remote` is the SSH edge.

* Nodes run side by side; a node's checks run one after another, each command bounded.
* A node that cannot be reached fails in one row, ``reach``, which says why and how many of
  its checks did not run.
* After a command on a host timed out, the later commands for that host fail at once
  ("not run: ... stalled") instead of waiting out their bounds one by one: a stalled node
  fails its checks while the others finish.
* A command shared by several checks (nvidia-smi's query) runs once per node.
* A pair test (a command with a peer side, ib_write_bw) holds both of its nodes while it runs:
  no node serves one pair test while it is the client of another, so no two measurements share
  an HCA (their results would halve; on soft-RoCE under load, the second one failed outright).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from provisioner.nodecheck import parsers
from provisioner.nodecheck.check import Check, Command, Outcome, Output, Status, skip_reason
from provisioner.nodecheck.parsers import NodeContext, ParseError

Execute = Callable[[str, str, int], Output]  # (host, shell text, timeout seconds) -> Output
# A pair test whose tool says it could not measure (perftest's clock calibration on a node
# starved of CPU: seen twice in a row in the VM lab beside other work) runs this often at most.
PAIR_TRIES = 3
# Before the n-th try again, n times this many seconds: the tool could not measure because the
# node's CPU was busy (verify's other checks on it, a disk write test), which takes a while to
# pass; tries back to back met the same load three times in a lab run.
PAIR_RETRY_WAIT_S = 5.0
TIMED_OUT = "timed out after"  # the start of Output.error for a command that ran past its bound
MAX_PARALLEL = 16


@dataclass(frozen=True)
class Result:
    node: str
    check: str
    status: Status
    detail: str = ""
    seconds: float = 0.0


def context_outcome(out: Output) -> tuple[NodeContext | None, Outcome]:
    """The ``reach`` row from the context probe, and the context (None: unreachable)."""
    if out.error:
        return None, Outcome("FAIL", out.error)
    if out.rc != 0:
        hint = (out.stderr.strip().splitlines() or [f"exit {out.rc}"])[-1]
        return None, Outcome("FAIL", f"the context probe failed: {hint}")
    try:
        ctx = parsers.parse_context(out.stdout)
    except ParseError as exc:
        return None, Outcome("FAIL", f"the context probe: {exc}")
    where = f"{ctx.container} container" if ctx.container else "no container"
    return ctx, Outcome("PASS", f"{where}, {ctx.gpu_devices} GPU device files")


class Stalls:
    """Hosts on which a command ran past its bound (shared by the node workers)."""

    def __init__(self) -> None:
        self._hosts: dict[str, str] = {}
        self._lock = threading.Lock()

    def note(self, host: str, out: Output) -> None:
        if out.error.startswith(TIMED_OUT):
            with self._lock:
                self._hosts.setdefault(host, out.error)

    def why(self, host: str) -> str:
        with self._lock:
            return self._hosts.get(host, "")


class Pairs:
    """One lock per node, shared by the node workers: a pair test takes both of its nodes'
    (in name order, so two tests never wait on each other crosswise). Each holder runs bounded
    commands only, so a wait is bounded too."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, node: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(node, threading.Lock())

    @contextmanager
    def holding(self, *nodes: str) -> Iterator[None]:
        with ExitStack() as held:
            for node in sorted(set(nodes)):
                held.enter_context(self.lock(node))
            yield


def verify_node(node: str, checks: list[Check], execute: Execute, context_timeout: int, stalls: Stalls,
                pairs: Pairs, clock: Callable[[], float] = time.monotonic) -> list[Result]:
    start = clock()
    ctx, reach = context_outcome(execute(node, parsers.CONTEXT_COMMAND, context_timeout))
    if ctx is None:  # one row says it: a row per check would only repeat "unreachable" (5 nodes: 111 rows)
        detail = reach.detail + (f" ({len(checks)} check{'s' if len(checks) != 1 else ''} not run)" if checks else "")
        return [Result(node, "reach", "FAIL", detail, clock() - start)]
    results = [Result(node, "reach", reach.status, reach.detail, clock() - start)]
    outputs: dict[tuple[str, str], Output] = {}
    for check in checks:
        start = clock()
        why = skip_reason(check, ctx)
        if why or check.command is None:
            results.append(Result(node, check.name, "SKIP", why or "nothing to run"))
            continue
        out = run_command(check.command, execute, stalls, outputs, pairs)
        outcome = check.judge(out)
        results.append(Result(node, check.name, outcome.status, outcome.detail, clock() - start))
    return results


def run_command(cmd: Command, execute: Execute, stalls: Stalls, cache: dict[tuple[str, str], Output],
                pairs: Pairs) -> Output:
    key = (cmd.host, cmd.text)
    if key in cache:
        return cache[key]
    stalled = stalls.why(cmd.host)
    if stalled:
        return Output(rc=-1, error=f"not run: an earlier command on {cmd.host} {stalled}")
    if cmd.setup is None:
        out = execute(cmd.host, cmd.text, cmd.timeout)
    else:
        with pairs.holding(cmd.host, cmd.setup[0]):
            out = _pair_command(cmd, cmd.setup, execute, stalls)
    stalls.note(cmd.host, out)
    cache[key] = out
    return out


def _pair_command(cmd: Command, setup: tuple[str, str], execute: Execute, stalls: Stalls) -> Output:
    """The peer side first (it returns once it serves), then the command; again, both, up to
    :data:`PAIR_TRIES` times in all, while the command's output says the tool itself could
    not measure (``again_if``), each time after a longer wait (:data:`PAIR_RETRY_WAIT_S`)."""
    out = _pair_once(cmd, setup, execute, stalls)
    for attempt in range(1, PAIR_TRIES):
        if cmd.again_if is None or cmd.again_if not in out.stdout + out.stderr:
            break
        time.sleep(PAIR_RETRY_WAIT_S * attempt)
        out = _pair_once(cmd, setup, execute, stalls)
    return out


def _pair_once(cmd: Command, setup: tuple[str, str], execute: Execute, stalls: Stalls) -> Output:
    host, text = setup
    if stalls.why(host):
        return Output(rc=-1, error=f"not run: {host} {stalls.why(host)}")
    started = execute(host, text, min(cmd.timeout, 30))
    stalls.note(host, started)
    if started.error or started.rc != 0:
        return Output(rc=-1, error=f"could not start the peer side on {host}: "
                                   f"{started.error or started.stderr.strip() or f'exit {started.rc}'}")
    return execute(cmd.host, cmd.text, cmd.timeout)


def verify(checks: list[Check], nodes: list[str], execute: Execute, context_timeout: int) -> list[Result]:
    """Every node's results, in the order of ``nodes``."""
    by_node: dict[str, list[Check]] = {n: [] for n in nodes}
    for c in checks:
        by_node.setdefault(c.node, []).append(c)
    stalls, pairs = Stalls(), Pairs()
    if not by_node:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(by_node))) as pool:
        per_node = list(pool.map(
            lambda n: verify_node(n, by_node[n], execute, context_timeout, stalls, pairs), by_node))
    return [r for rs in per_node for r in rs]
