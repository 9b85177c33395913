"""YAML text of plain data, fast. Every node's install seed is rendered on each ``provision
inventory`` and ``plan``, and the inventory writes a file per node: for 2,000 nodes PyYAML
spent seconds, most of them in its pure-Python representer and serializer.

Both functions build the event stream PyYAML's SafeRepresenter and Serializer would build,
with one event per distinct scalar (how a scalar resolves is worked out once: most keys and
many values repeat from node to node), and hand it to libyaml's emitter:

* :func:`safe_dump` writes exactly ``yaml.safe_dump(data, sort_keys=False,
  default_flow_style=False, width=width)``, PyYAML's own emitter's text. libyaml's emitter
  writes the same text except in cases this module leaves to PyYAML: a string that is not
  printable ASCII (long escaped strings are folded differently), an empty or 128+ character
  key (PyYAML writes a complex key, ``? ...``), data that is not a mapping at the top
  (PyYAML ends a root scalar's document with ``...``).
* :func:`libyaml_dump` writes exactly ``yaml.dump(data, Dumper=dumper, ...)`` for a dumper
  on libyaml's emitter (``yaml.CSafeDumper``), with representers for ``tagged`` string types.

Either takes PyYAML's own path for what the events do not cover: other types than dict,
list, str, int, bool and None, a container that occurs twice (PyYAML writes an anchor and
an alias), or a PyYAML built without libyaml. The tests compare the texts on generated data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
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

LIBYAML: type[yaml.SafeDumper] | None = getattr(yaml, "CSafeDumper", None)
Tagged = Mapping[type, tuple[str, str | None]]  # a str subclass -> (its tag, its scalar style)

_resolve: Callable[[type[ScalarNode], str, tuple[bool, bool]], str] = yaml.resolver.Resolver().resolve
_SCALARS: dict[tuple[str, str, str | None], ScalarEvent] = {}
_REMEMBER_MAX = 1 << 16  # distinct scalars remembered (a long-lived process must not grow without bound)


class _Unsupported(Exception):
    """The data needs PyYAML's own path."""


def _scalar(value: str, tag: str, style: str | None = None) -> ScalarEvent:
    """The Serializer's event for a scalar; its ``implicit`` flags say whether the value may
    be written plain, or quoted, without its tag. The emitter only reads events, so one
    event serves every occurrence of the same scalar."""
    key = (value, tag, style)
    event = _SCALARS.get(key)
    if event is None:
        plain_ok = _resolve(ScalarNode, value, (True, False)) == tag
        quoted_ok = _resolve(ScalarNode, value, (False, True)) == tag
        event = ScalarEvent(None, tag, (plain_ok, quoted_ok), value, style=style)
        if len(_SCALARS) < _REMEMBER_MAX:
            _SCALARS[key] = event
    return event


_TRUE, _FALSE, _NULL = _scalar("true", BOOL_TAG), _scalar("false", BOOL_TAG), _scalar("null", NULL_TAG)
# Scalars met before, by value, so that a container's loop hands them out without a call:
# plain str (any string; and printable ASCII ones, for safe_dump) and int.
_STRINGS: dict[bool, dict[str, ScalarEvent]] = {False: {}, True: {}}
_INTS: dict[int, ScalarEvent] = {}


class _Events:
    """Data -> the events of PyYAML's SafeRepresenter + Serializer (no anchors)."""

    def __init__(self, *, sort_keys: bool, ascii_only: bool, tagged: Tagged) -> None:
        self.sort_keys = sort_keys
        self.ascii_only = ascii_only  # strings must be printable ASCII, keys 1..127 characters
        self.tagged = tagged
        self.strings = _STRINGS[ascii_only]
        self.seen: set[int] = set()
        self.out: list[Event] = [StreamStartEvent(encoding=None), DocumentStartEvent(explicit=False)]

    def document(self, data: Any) -> list[Event]:
        self.add(data)
        self.out += [DocumentEndEvent(explicit=False), StreamEndEvent()]
        return self.out

    def known(self, value: Any) -> ScalarEvent | None:
        """The event of a scalar met before (inlined in the loops below: a call per scalar
        is what this module saves)."""
        kind = type(value)
        if kind is str:
            return self.strings.get(value)
        if kind is int:
            return _INTS.get(value)
        if kind is bool:
            return _TRUE if value else _FALSE
        return _NULL if value is None else None

    def add(self, data: Any, key: bool = False) -> None:
        kind = type(data)
        out = self.out
        if kind is str:
            if self.ascii_only and not (data.isascii() and data.isprintable() and (not key or 0 < len(data) < 128)):
                raise _Unsupported
            scalar = _scalar(data, STR_TAG)
            if len(self.strings) < _REMEMBER_MAX and (not key or not self.ascii_only):  # keys: one more check
                self.strings[data] = scalar
            out.append(scalar)
        elif kind is dict:
            self.enter(data)
            out.append(MappingStartEvent(None, MAP_TAG, True, flow_style=False))
            items = list(data.items())
            if self.sort_keys:
                with contextlib.suppress(TypeError):  # keys of mixed types: PyYAML keeps the order
                    items = sorted(items)
            strings, key_ok = self.strings, not self.ascii_only
            event: ScalarEvent | None
            for k, v in items:
                event = strings.get(k) if type(k) is str and (key_ok or 0 < len(k) < 128) else None
                if event is None:
                    self.add(k, key=True)
                else:
                    out.append(event)
                kind = type(v)  # as known(v)
                if kind is str:
                    event = strings.get(v)
                elif kind is int:
                    event = _INTS.get(v)
                elif kind is bool:
                    event = _TRUE if v else _FALSE
                else:
                    event = _NULL if v is None else None
                if event is None:
                    self.add(v)
                else:
                    out.append(event)
            out.append(MappingEndEvent())
        elif kind is list:
            self.enter(data)
            out.append(SequenceStartEvent(None, SEQ_TAG, True, flow_style=False))
            for item in data:
                event = self.strings.get(item) if type(item) is str else self.known(item)
                if event is None:
                    self.add(item)
                else:
                    out.append(event)
            out.append(SequenceEndEvent())
        elif kind is int:
            scalar = _scalar(str(data), INT_TAG)
            if len(_INTS) < _REMEMBER_MAX:
                _INTS[data] = scalar
            out.append(scalar)
        elif kind is bool or data is None:
            out.append(self.known(data) or _NULL)
        elif kind in self.tagged:
            tag, style = self.tagged[kind]
            out.append(_scalar(str(data), tag, style))
        else:
            raise _Unsupported

    def enter(self, container: dict[Any, Any] | list[Any]) -> None:
        if id(container) in self.seen:  # PyYAML would write an anchor and an alias
            raise _Unsupported
        self.seen.add(id(container))


def safe_dump(data: Any, *, width: int | None = None) -> str:
    """``yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=width)``."""
    if LIBYAML is not None and type(data) is dict:
        try:
            events = _Events(sort_keys=False, ascii_only=True, tagged={}).document(data)
        except _Unsupported:
            pass
        else:
            text: str = yaml.emit(events, Dumper=LIBYAML, width=width)
            return text
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=width)


def libyaml_dump(data: Any, *, dumper: type[yaml.SafeDumper], sort_keys: bool, width: int | None,
                 allow_unicode: bool, tagged: Tagged) -> str:
    """``yaml.dump(data, Dumper=dumper, sort_keys=..., default_flow_style=False, width=...,
    allow_unicode=...)``, where ``dumper`` represents each ``tagged`` type as a scalar of
    that tag and style."""
    if LIBYAML is not None and issubclass(dumper, LIBYAML):
        try:
            events = _Events(sort_keys=sort_keys, ascii_only=False, tagged=tagged).document(data)
        except _Unsupported:
            pass
        else:
            text: str = yaml.emit(events, Dumper=dumper, width=width, allow_unicode=allow_unicode)
            return text
    dumped: str = yaml.dump(data, Dumper=dumper, sort_keys=sort_keys, default_flow_style=False, width=width,
                            allow_unicode=allow_unicode)
    return dumped
