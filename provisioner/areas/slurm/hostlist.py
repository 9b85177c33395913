"""Slurm hostlists: node names to the compact ``gpu[01-04]`` form slurm.conf takes, and back."""

from __future__ import annotations

import re
from collections.abc import Iterable

from provisioner.manifest import ranges

_NUM_TAIL = re.compile(r"^(?P<prefix>.*?)(?P<num>\d+)$")
_HOSTLIST_RE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<body>[0-9,\-]+)\](?P<suffix>.*)$")


def _ranges(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def hostlist(names: Iterable[str]) -> str:
    """Compress host names into a Slurm hostlist expression: gpu01..gpu04 -> gpu[01-04].

    Zero-padded numbers (``01``) and unpadded ones (``1``) are kept in separate groups so
    that the expression expands (in Slurm and in :func:`expand_hostlist`) to exactly the
    names given. Groups keep the order in which their first name appears.
    """
    names = list(names)
    # a number as wide as a zero-padded one of its prefix joins that group: gpu0999 and
    # gpu1000 are one run, gpu[0999-1000]
    padded: dict[str, set[int]] = {}
    for name in names:
        m = _NUM_TAIL.match(name)
        if m and m.group("num").startswith("0") and len(m.group("num")) > 1:
            padded.setdefault(m.group("prefix"), set()).add(len(m.group("num")))
    groups: dict[tuple[str, int], list[int]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, int] | str] = []
    for name in names:
        m = _NUM_TAIL.match(name)
        if not m:
            if name not in plain:
                plain[name] = None
                order.append(name)
            continue
        num = m.group("num")
        width = len(num) if len(num) in padded.get(m.group("prefix"), ()) else 0
        key = (m.group("prefix"), width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(num))
    parts: list[str] = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
            continue
        prefix, width = item
        spans = _ranges(groups[item])
        if len(spans) == 1 and spans[0][0] == spans[0][1]:
            parts.append(f"{prefix}{spans[0][0]:0{width}d}")
            continue
        body = ",".join(
            f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in spans
        )
        parts.append(f"{prefix}[{body}]")
    return ",".join(parts)


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression: a[1-3,7],b -> a1 a2 a3 a7 b; rack[1-2]-n[1-2] ->
    rack1-n1 rack1-n2 rack2-n1 rack2-n2. Raises ValueError on a malformed item."""
    return [name for item in ranges.split_outside_brackets(expr) if item for name in _expand_item(item)]


def _expand_item(item: str) -> list[str]:
    m = _HOSTLIST_RE.match(item)
    if not m:
        if "[" in item or "]" in item:
            raise ValueError(f"bad hostlist item {item!r}")
        return [item]
    heads: list[str] = []
    for span in m.group("body").split(","):
        lo_s, _, hi_s = span.partition("-")
        if not lo_s.isdigit() or not (hi_s or lo_s).isdigit():
            raise ValueError(f"bad hostlist item {item!r}")
        width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
        heads += [f"{m.group('prefix')}{i:0{width}d}" for i in range(int(lo_s), int(hi_s or lo_s) + 1)]
    tails = _expand_item(m.group("suffix")) if m.group("suffix") else [""]
    return [head + tail for head in heads for tail in tails]
