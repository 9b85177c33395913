"""What a verify check is: a command for one node and a judge of its output.

The generic part of `provision verify`, below the areas and below :mod:`provisioner.verify`:
each area lists its own checks (``provisioner/areas/<area>/verify.py``) with these types and
helpers, and :mod:`provisioner.verify.catalog` gathers them through the area registry. Pure.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from provisioner.manifest.nodes import Node
from provisioner.nodecheck.parsers import NodeContext, ParseError

Status = Literal["PASS", "FAIL", "SKIP"]
Needs = Literal["", "kernel", "gpu"]


@dataclass(frozen=True)
class Outcome:
    status: Status
    detail: str = ""


@dataclass(frozen=True)
class Output:
    """What a command left: its exit status and text, or ``error`` when it did not run to
    its end (unreachable node, timeout)."""

    rc: int = 0
    stdout: str = ""
    stderr: str = ""
    error: str = ""


@dataclass(frozen=True)
class Command:
    host: str  # the node it runs on (the node checked, or the Slurm controller)
    text: str  # a shell command line
    timeout: int
    # started in the background on another node first (the server of a pair test)
    setup: tuple[str, str] | None = None
    # a pair test whose output says this is measured again, once, server and client: the
    # tool's own failure to measure (not a verdict on the node)
    again_if: str | None = None


Judge = Callable[[Output], Outcome]


@dataclass(frozen=True)
class Check:
    node: str
    name: str
    command: Command | None  # None: decided without running anything (``skip`` says why)
    judge: Judge
    needs: Needs = ""
    skip: str = ""  # a static SKIP: the check applies but cannot run (no peer, no image)


# An area's checks of one node: (node, drained_by) -> its checks. ``drained_by``: a Slurm
# drain whose reason starts with it is expected (``apply --rolling`` verifies the nodes it
# drained itself). An area makes one per manifest (``Area.verify``), deciding once what
# every node's checks share.
NodeChecks = Callable[[Node, str], list[Check]]


def skip_reason(check: Check, ctx: NodeContext) -> str:
    """Why ``check`` cannot run on its node ("" when it can)."""
    if check.skip:
        return check.skip
    if check.needs == "kernel" and ctx.container:
        return f"no kernel access ({ctx.container} container)"
    if check.needs == "gpu" and ctx.container and ctx.gpu_devices == 0:
        return f"no GPU device in this {ctx.container} container"
    return ""


def judged(parse: Callable[[str], object], verdict: Callable[..., Outcome]) -> Judge:
    """A judge that parses stdout first: a failed command or unreadable output fails."""

    def judge(out: Output) -> Outcome:
        if out.error:
            return Outcome("FAIL", out.error)
        try:
            value = parse(out.stdout)
        except ParseError as exc:
            return Outcome("FAIL", f"{exc}{stderr_hint(out)}")
        return verdict(value)

    return judge


def stderr_hint(out: Output) -> str:
    """The last line of a command's stderr (or its exit status), to append to a failure."""
    lines = [line.strip() for line in out.stderr.splitlines() if line.strip()]
    if lines:
        return f" ({lines[-1][:200]})"
    return f" (exit {out.rc})" if out.rc else ""


def not_judged(_: Output) -> Outcome:  # a static SKIP never runs its judge
    return Outcome("SKIP", "not run")


@dataclass
class CheckList:
    """One node's checks as an area lists them: ``add`` a command and its judge, or ``skip``
    one that applies but cannot run. Commands default to the node itself and ``timeout``."""

    node: str
    timeout: int
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, text: str, judge: Judge, needs: Needs = "", host: str | None = None,
            setup: tuple[str, str] | None = None, timeout: int | None = None, again_if: str | None = None) -> None:
        command = Command(host or self.node, text, timeout or self.timeout, setup, again_if)
        self.checks.append(Check(self.node, name, command, judge, needs))

    def skip(self, name: str, why: str) -> None:
        self.checks.append(Check(self.node, name, None, not_judged, skip=why))


class Ring:
    """Nodes in manifest order, each paired with the next one (the last with the first): the
    peers of pair tests, so every link of the ring is measured once per direction."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self._index = {n.name: i for i, n in enumerate(self.nodes)}

    def peer(self, node: Node) -> Node | None:
        """The node after ``node`` (None: ``node`` is not in the ring, or alone in it)."""
        i = self._index.get(node.name)
        if len(self.nodes) < 2 or i is None:
            return None
        return self.nodes[(i + 1) % len(self.nodes)]


def first_of(glob: str) -> str:
    """A shell line that runs the first executable matching ``glob`` (exit 127 when none)."""
    return f'for f in {glob}; do [ -x "$f" ] && exec "$f" "$@"; done; echo "nothing matches {glob}" >&2; exit 127'


def run_first(glob: str, args: str = "") -> str:
    return f"sh -c {shlex.quote(first_of(glob))} sh {args}".rstrip()
