"""Load YAML while remembering where every value came from.

PyYAML's composer gives us nodes with marks; we build plain Python data from them and a
``positions`` map from a path tuple (keys and list indexes) to a (line, col) pair, so that a
pydantic error location can be turned back into ``file:line:col``. Duplicate keys, tabs,
binary or empty files and YAML syntax errors become diagnostics, never tracebacks.
"""

from __future__ import annotations

import os
import select
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import Diagnostic, ManifestError

PathKey = tuple[str | int, ...]

MAX_MANIFEST_BYTES = 2 * 1024 * 1024  # 3x the largest cluster we plan for (2,000 nodes written out: 0.63 MiB)
# A manifest that is not a regular file (a FIFO, a pipe) must have ended by then.
READ_TIMEOUT = 10.0
# Aliases let a few lines expand to billions of values ("billion laughs"); stop well before.
MAX_VALUES = 200_000
_STR = "tag:yaml.org,2002:str"  # what YAML resolves most manifest values to


@dataclass
class Source:
    """A parsed YAML document together with the position of every value and key."""

    file: str
    data: Any
    positions: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    key_positions: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: PathKey) -> tuple[int, int]:
        """Best position for ``path``: the key if it exists, else the closest parent."""
        probe = tuple(path)
        while True:
            if probe in self.key_positions:
                return self.key_positions[probe]
            if probe in self.positions:
                return self.positions[probe]
            if not probe:
                return (0, 0)
            probe = probe[:-1]

    def diag(self, path: PathKey, message: str, severity: str = "error") -> Diagnostic:
        line, col = self.where(path)
        return Diagnostic(self.file, line, col, dotted(path), message, severity)


def one_line(text: str) -> str:
    """Collapse whitespace and newlines: a diagnostic is always printed on one line."""
    return " ".join(text.split())


class _TooManyValues(Exception):
    pass


def dotted(path: PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part) or not str(part).isprintable() or any(c in str(part) for c in " .[]"):
            out += f"[{str(part)!r}]"  # an odd key: quoted, escaped, still on one line
        else:
            out += ("." if out else "") + str(part)
    return out


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.positions: dict[PathKey, tuple[int, int]] = {}
        self.key_positions: dict[PathKey, tuple[int, int]] = {}
        self.errors: list[Diagnostic] = []
        self._constructor = yaml.constructor.SafeConstructor()
        self._count = 0

    def build(self, node: yaml.Node, path: PathKey) -> Any:
        self._count += 1
        if self._count > MAX_VALUES:
            raise _TooManyValues
        self.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self.errors.append(self._at(key_node, path, "YAML merge keys (<<) are not supported"))
                    continue
                key = self._scalar(key_node)
                if not isinstance(key, (str, int, float, bool)) or isinstance(key, bool):
                    self.errors.append(self._at(key_node, path, "mapping keys must be plain strings"))
                    continue
                skey = str(key)
                if skey in out:
                    first = self.key_positions.get((*path, skey), (0, 0))
                    self.errors.append(
                        self._at(key_node, (*path, skey), f"duplicate key (first defined on line {first[0]})")
                    )
                    continue
                key_path = (*path, skey)
                self.key_positions[key_path] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                out[skey] = self.build(value_node, key_path)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node)

    def _scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return None
        if node.tag == _STR:  # most values: SafeConstructor would return node.value, at 5 calls' cost
            return node.value
        try:
            return self._constructor.construct_object(node, deep=True)
        except Exception as exc:  # SafeConstructor raises KeyError, IndexError, ... on bad tagged scalars
            tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            message = f"bad value: cannot read {str(node.value)[:60]!r} as {tag}"
            if isinstance(exc, (yaml.YAMLError, ValueError)):
                message += f" ({getattr(exc, 'problem', None) or exc})"
            self.errors.append(self._at(node, (), one_line(message)))
            return None

    def _at(self, node: yaml.Node, path: PathKey, message: str) -> Diagnostic:
        return Diagnostic(
            self.file, node.start_mark.line + 1, node.start_mark.column + 1, dotted(path), message
        )


def _yaml_error(file: str, exc: yaml.YAMLError) -> Diagnostic:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    message = f"YAML syntax error: {problem}"
    if context and context not in problem:
        message += f" ({context})"
    if "\\t" in message or "'\\t'" in message or "tab" in str(problem):
        message += "; indent with spaces, not tabs"
    if mark is not None:
        return Diagnostic(file, mark.line + 1, mark.column + 1, "", one_line(message))
    return Diagnostic(file, 0, 0, "", one_line(message))


# libyaml's composer (3x faster: the pure-Python scanner was 90% of validating a big manifest)
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)


def _compose(text: str) -> list[yaml.Node]:
    """The documents' node trees, with libyaml when PyYAML has it. A text libyaml refuses is
    composed again by the pure-Python loader, whose messages (and hints) the diagnostics
    are written for; that costs time only on a broken file."""
    if _FAST_LOADER is not None:
        try:
            return list(yaml.compose_all(text, Loader=_FAST_LOADER))
        except yaml.YAMLError:
            pass
    return list(yaml.compose_all(text, Loader=yaml.SafeLoader))


def parse_text(text: str, file: str) -> Source:
    """Parse YAML text into a :class:`Source`; raise ManifestError on any problem."""
    if not text.strip():
        raise ManifestError([Diagnostic(file, 0, 0, "", "the file is empty; expected a manifest mapping")])
    try:
        documents = _compose(text)
    except yaml.YAMLError as exc:
        raise ManifestError([_yaml_error(file, exc)]) from None
    except (ValueError, RecursionError) as exc:  # pathological input
        raise ManifestError([Diagnostic(file, 0, 0, "", f"cannot parse YAML: {exc}")]) from None
    documents = [d for d in documents if d is not None]
    if not documents:
        raise ManifestError([Diagnostic(file, 0, 0, "", "the file has no YAML document")])
    if len(documents) > 1:
        second = documents[1]
        raise ManifestError(
            [
                Diagnostic(
                    file,
                    second.start_mark.line + 1,
                    1,
                    "",
                    "the file holds more than one YAML document; a manifest is one document",
                )
            ]
        )
    builder = _Builder(file)
    try:
        data = builder.build(documents[0], ())
    except RecursionError:
        raise ManifestError([Diagnostic(file, 0, 0, "", "YAML nesting is too deep")]) from None
    except _TooManyValues:
        message = f"the document expands to more than {MAX_VALUES} values (YAML aliases?)"
        raise ManifestError([Diagnostic(file, 0, 0, "", message)]) from None
    if builder.errors:
        raise ManifestError(builder.errors)
    if not isinstance(data, dict):
        kind = type(data).__name__ if data is not None else "nothing"
        raise ManifestError(
            [Diagnostic(file, 1, 1, "", f"a manifest must be a YAML mapping, found {kind}")]
        )
    return Source(file, data, builder.positions, builder.key_positions)


def read_source(path: str | Path) -> Source:
    """Read and parse a manifest file; every failure is a ManifestError."""
    name = str(path)
    raw = read_bounded(Path(path), name)
    if b"\x00" in raw:
        raise ManifestError([Diagnostic(name, 0, 0, "", "binary file (contains NUL bytes); expected YAML text")])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ManifestError(
            [Diagnostic(name, line, 0, "", "not UTF-8 text; expected a YAML manifest")]
        ) from None
    return parse_text(text, name)


def _too_large(name: str) -> ManifestError:
    size = f"{MAX_MANIFEST_BYTES / (1024 * 1024):g} MiB"
    return ManifestError([Diagnostic(name, 0, 0, "", f"file is too large for a manifest (over {size})")])


def read_bounded(path: Path, name: str) -> bytes:
    """The file's bytes, at most MAX_MANIFEST_BYTES of them, bounded in time too.

    A regular file is read up to one byte past the cap. Anything else (a FIFO, a pipe from
    process substitution, a character device such as /dev/zero) is opened non-blocking
    (opening a FIFO with no writer would block forever) and read with poll() against one
    deadline of READ_TIMEOUT seconds; an endless stream stops at the cap."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ManifestError([Diagnostic(name, 0, 0, "", "no such file")]) from None
    except IsADirectoryError:
        raise ManifestError([Diagnostic(name, 0, 0, "", "is a directory, not a manifest file")]) from None
    except PermissionError:
        raise ManifestError([Diagnostic(name, 0, 0, "", "permission denied")]) from None
    except OSError as exc:
        raise ManifestError([Diagnostic(name, 0, 0, "", f"cannot read: {exc.strerror}")]) from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise ManifestError([Diagnostic(name, 0, 0, "", "is a directory, not a manifest file")])
        raw = _read_capped(fd, name, regular=stat.S_ISREG(os.fstat(fd).st_mode))
    except OSError as exc:
        raise ManifestError([Diagnostic(name, 0, 0, "", f"cannot read: {exc.strerror}")]) from None
    finally:
        os.close(fd)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise _too_large(name)
    return raw


def _read_capped(fd: int, name: str, regular: bool) -> bytes:
    chunks: list[bytes] = []
    total = 0
    deadline = time.monotonic() + READ_TIMEOUT
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    while total <= MAX_MANIFEST_BYTES:
        if not regular:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise ManifestError([Diagnostic(
                    name, 0, 0, "",
                    f"no end of the file after {READ_TIMEOUT:g} s (a FIFO or pipe with no writer, or one that "
                    "never closes?); give a regular file")])
        try:
            chunk = os.read(fd, min(1024 * 1024, MAX_MANIFEST_BYTES + 1 - total))
        except BlockingIOError:  # a writer is there but has sent nothing yet
            continue
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
