"""Host-range syntax: ``gpu[01-16]`` expands to gpu01 .. gpu16 (zero padding kept).

Also used for disk ids (``ata-ST6000_[1-8]``) and node selectors in mounts and partitions.
Addresses of a ranged node entry increment per node: IPv4 by one, MACs by one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

RANGE_RE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<lo>\d+)-(?P<hi>\d+)\](?P<suffix>[^\[\]]*)$")
MAX_RANGE = 4096


class RangeError(ValueError):
    pass


def is_range(text: str) -> bool:
    return "[" in text or "]" in text


def expand(text: str) -> list[str]:
    """Expand one ``prefix[lo-hi]suffix`` pattern; a plain name expands to itself."""
    if not is_range(text):
        return [text]
    m = RANGE_RE.match(text)
    if not m:
        raise RangeError(f"bad range {text!r}: use one range like name[01-16]")
    lo_s, hi_s = m.group("lo"), m.group("hi")
    lo, hi = int(lo_s), int(hi_s)
    if hi < lo:
        raise RangeError(f"bad range {text!r}: {hi_s} is below {lo_s}")
    if hi - lo + 1 > MAX_RANGE:
        raise RangeError(f"range {text!r} is too large (more than {MAX_RANGE} items)")
    width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
    prefix, suffix = m.group("prefix"), m.group("suffix")
    return [f"{prefix}{i:0{width}d}{suffix}" for i in range(lo, hi + 1)]


def split_outside_brackets(text: str) -> list[str]:
    """Split on the commas outside brackets: ``gpu[01-04,07],head`` -> ``gpu[01-04,07]``,
    ``head`` (selectors, disk ids, Slurm's host lists); empty pieces are kept."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def expand_all(items: list[str]) -> list[str]:
    out: list[str] = []
    for item in items:
        out.extend(expand(item))
    return out


_NUMBERED = re.compile(r"^(?P<prefix>[^\[\]]*?)(?P<num>\d+)$")


def contract(names: Sequence[str]) -> list[str]:
    """The reverse of :func:`expand` for display: runs of consecutive names become one range,
    ``gpu01 gpu02 gpu03 head`` -> ``gpu[01-03] head``. :func:`expand` of each item gives
    back exactly the names, in their order (zero padding follows the run's first name)."""
    out: list[str] = []
    i = 0
    while i < len(names):
        first = names[i]
        j = i + 1
        m = _NUMBERED.match(first)
        if m:
            prefix, lo_s = m.group("prefix"), m.group("num")
            width = len(lo_s) if lo_s.startswith("0") and len(lo_s) > 1 else 0
            lo = int(lo_s)
            while j < len(names) and j - i < MAX_RANGE and names[j] == f"{prefix}{lo + j - i:0{width}d}":
                j += 1
            if j - i > 1:
                out.append(f"{prefix}[{lo_s}-{names[j - 1][len(prefix):]}]")
                i = j
                continue
        out.append(first)
        i = j
    return out


MAX_LISTED = 20  # items of a list of node names in a one-line message


def listed(names: Sequence[str], most: int = MAX_LISTED) -> str:
    """Node names for a one-line message: runs contracted (:func:`contract`), at most ``most``
    items, then how many nodes are left out: 2,000 unreachable nodes are not a 20 kB line."""
    items = contract(names)
    if len(items) <= most:
        return ", ".join(items)
    rest = sum(len(expand(item)) for item in items[most:])
    return f"{', '.join(items[:most])} and {rest:,} more"


def range_size(text: str) -> int:
    return len(expand(text))


def add_ip(ip: ipaddress.IPv4Address, offset: int) -> ipaddress.IPv4Address:
    value = int(ip) + offset
    if value > int(ipaddress.IPv4Address("255.255.255.255")):
        raise RangeError(f"{ip} + {offset} leaves the IPv4 address space")
    return ipaddress.IPv4Address(value)


MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def normalize_mac(mac: str) -> str:
    norm = mac.strip().lower().replace("-", ":")
    if not MAC_RE.match(norm):
        raise ValueError(f"{mac!r} is not a MAC address like 52:54:00:12:34:56")
    return norm


def add_mac(mac: str, offset: int) -> str:
    value = int(mac.replace(":", ""), 16) + offset
    if value >= 1 << 48:
        raise RangeError(f"{mac} + {offset} overflows the MAC address space")
    raw = f"{value:012x}"
    return ":".join(raw[i : i + 2] for i in range(0, 12, 2))
