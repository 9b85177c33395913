"""``yaml.safe_dump`` text of plain data, fast: the install seeds of every node are rendered
on each ``provision inventory`` and ``plan`` (2,000 seeds for a 2,000-node cluster), and
PyYAML spends most of that time in its pure-Python representer, serializer and emitter.

:func:`dump` builds the event stream PyYAML's SafeRepresenter and Serializer would build,
remembering how each scalar resolves (most keys and many values repeat from node to node),
and hands the events to libyaml's emitter. It writes exactly ``yaml.safe_dump(data,
sort_keys=False, ...)``'s text; the test compares the two on generated data. Whatever that
shortcut does not cover takes PyYAML's own path: data with other types than dict, list,
str, int, bool and None, a container that occurs twice (PyYAML writes an anchor and an
alias), a string that is not printable ASCII (libyaml folds long escaped strings
differently), an empty or long key (PyYAML writes it as a complex key, libyaml does not),
data that is not a mapping at the top, or a PyYAML built without libyaml.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.events import (
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from yaml.nodes import ScalarNode

STR_TAG = "tag:yaml.org,2002:str"
INT_TAG = "tag:yaml.org,2002:int"
BOOL_TAG = "tag:yaml.org,2002:bool"
NULL_TAG = "tag:yaml.org,2002:null"
MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"

EMITTER: type[yaml.SafeDumper] | None = getattr(yaml, "CSafeDumper", None)
_resolve: Callable[[type[ScalarNode], str, tuple[bool, bool]], str] = yaml.resolver.Resolver().resolve
_SCALARS: dict[tuple[str, str], ScalarEvent] = {}
_STRINGS: dict[str, ScalarEvent] = {}  # printable ASCII strings seen: their events
_REMEMBER_MAX = 1 << 16  # scalars remembered (a long-lived process must not grow without bound)


class _Unsupported(Exception):
    """The data needs PyYAML's own path."""


def _scalar(value: str, tag: str) -> ScalarEvent:
    """The Serializer's event for a scalar; its ``implicit`` flags say whether the value may
    be written plain, or quoted, without a tag. The emitter only reads events, so one event
    serves every occurrence of the same scalar."""
    key = (value, tag)
    event = _SCALARS.get(key)
    if event is None:
        plain_ok = _resolve(ScalarNode, value, (True, False)) == tag
        quoted_ok = _resolve(ScalarNode, value, (False, True)) == tag
        event = ScalarEvent(None, tag, (plain_ok, quoted_ok), value, style=None)
        if len(_SCALARS) < _REMEMBER_MAX:
            _SCALARS[key] = event
    return event


def _string(value: str) -> ScalarEvent:
    event = _STRINGS.get(value)
    if event is None:
        if not (value.isascii() and value.isprintable()):
            raise _Unsupported
        event = _scalar(value, STR_TAG)
        if len(_STRINGS) < _REMEMBER_MAX:
            _STRINGS[value] = event
    return event


def _events(data: Any, out: list[Event], seen: set[int]) -> None:
    kind = type(data)
    if kind is str:
        out.append(_string(data))
    elif kind is dict or kind is list:
        if id(data) in seen:  # PyYAML would write an anchor and an alias
            raise _Unsupported
        seen.add(id(data))
        strings = _STRINGS
        if kind is dict:
            out.append(MappingStartEvent(None, MAP_TAG, True, flow_style=False))
            for key, value in data.items():
                if type(key) is str and not 0 < len(key) < 128:  # PyYAML writes a complex key (?)
                    raise _Unsupported
                # strings seen before inline (most keys and many values): no call per scalar
                event = strings.get(key) if type(key) is str else None
                if event is None:
                    _events(key, out, seen)
                else:
                    out.append(event)
                event = strings.get(value) if type(value) is str else None
                if event is None:
                    _events(value, out, seen)
                else:
                    out.append(event)
            out.append(MappingEndEvent())
        else:
            out.append(SequenceStartEvent(None, SEQ_TAG, True, flow_style=False))
            for item in data:
                event = strings.get(item) if type(item) is str else None
                if event is None:
                    _events(item, out, seen)
                else:
                    out.append(event)
            out.append(SequenceEndEvent())
    elif kind is bool:
        out.append(_scalar("true" if data else "false", BOOL_TAG))
    elif kind is int:
        out.append(_scalar(str(data), INT_TAG))
    elif data is None:
        out.append(_scalar("null", NULL_TAG))
    else:
        raise _Unsupported


def dump(data: Any, width: int | None = None) -> str:
    """``yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=width)``."""
    if EMITTER is not None and type(data) is dict:  # a scalar at the root: PyYAML ends the document ("...")
        events: list[Event] = [StreamStartEvent(encoding=None), DocumentStartEvent(explicit=False)]
        try:
            _events(data, events, set())
        except _Unsupported:
            pass
        else:
            events += [DocumentEndEvent(explicit=False), StreamEndEvent()]
            text: str = yaml.emit(events, Dumper=EMITTER, width=width)
            return text
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=width)
