"""The backup area's verify check on the head node: ``backup.age``, the newest backup at the
destination is younger than its schedule allows (docs/verify.md)."""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Callable

from provisioner.areas.backup.decide import CONFIG_FILE, TOOL_FILE, age_verdict, head
from provisioner.manifest.backup import Backup
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node
from provisioner.nodecheck.check import Check, CheckList, NodeChecks, Outcome, judged
from provisioner.nodecheck.parsers import ParseError

COMMAND = f"{shlex.quote(TOOL_FILE)} newest {shlex.quote(CONFIG_FILE)}"


def parse_newest(text: str) -> str:
    """The tool's one line: an ISO time with its zone, or ``none``."""
    line = text.strip()
    if line == "none":
        return line
    try:
        when = dt.datetime.fromisoformat(line)
    except ValueError:
        raise ParseError(f"not a time: {line[:80]!r}") from None
    if when.tzinfo is None:
        raise ParseError(f"a time without its zone: {line!r}")
    return line


def verdict(b: Backup, now: Callable[[], dt.datetime]) -> Callable[[str], Outcome]:
    def judge(newest: str) -> Outcome:
        ok, detail = age_verdict(b, newest, now())
        return Outcome("SKIP" if ok is None else "PASS" if ok else "FAIL", detail)
    return judge


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def checks(m: Manifest, now: Callable[[], dt.datetime] = _utc_now) -> NodeChecks:
    """The head node, when the manifest has a backup section: ``backup.age``."""

    def node_checks(node: Node, drained_by: str) -> list[Check]:
        out = CheckList(node.name, m.verify.command_timeout)
        if m.backup is not None and node.name == head(m).name:
            out.add("backup.age", COMMAND, judged(parse_newest, verdict(m.backup, now)))
        return out.checks

    return node_checks
