"""provisioner.manifest.source: YAML with positions, and every bad file as a diagnostic."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from provisioner.errors import Diagnostic, ManifestError
from provisioner.manifest import source as source_mod
from provisioner.manifest.source import Source, dotted, parse_text, read_source

NESTED = """\
version: 1
cluster:
  name: x
  admin_users:
    - name: ops
      ssh_keys:
        - key1
        - key2
nodes: [{name: a, roles: [head]}]
"""


def _diags(text: str, file: str = "f.yaml") -> list[Diagnostic]:
    with pytest.raises(ManifestError) as info:
        parse_text(text, file)
    return info.value.diagnostics


def _one(text: str, file: str = "f.yaml") -> Diagnostic:
    diags = _diags(text, file)
    assert len(diags) == 1, [d.format() for d in diags]
    return diags[0]


def _read_error(path: Path) -> Diagnostic:
    with pytest.raises(ManifestError) as info:
        read_source(path)
    assert len(info.value.diagnostics) == 1
    return info.value.diagnostics[0]


# --------------------------------------------------------------------------- positions
def test_positions_of_nested_keys_and_values() -> None:
    src = parse_text(NESTED, "f.yaml")
    assert src.key_positions[("version",)] == (1, 1)
    assert src.positions[("version",)] == (1, 10)
    assert src.key_positions[("cluster",)] == (2, 1)
    assert src.key_positions[("cluster", "name")] == (3, 3)
    assert src.positions[("cluster", "name")] == (3, 9)
    assert src.key_positions[("cluster", "admin_users", 0, "ssh_keys")] == (6, 7)
    assert src.positions[()] == (1, 1)


def test_positions_of_list_items_block_and_flow() -> None:
    src = parse_text(NESTED, "f.yaml")
    assert src.positions[("cluster", "admin_users", 0)] == (5, 7)
    assert src.positions[("cluster", "admin_users", 0, "ssh_keys", 0)] == (7, 11)
    assert src.positions[("cluster", "admin_users", 0, "ssh_keys", 1)] == (8, 11)
    assert src.positions[("nodes", 0)] == (9, 9)
    assert src.key_positions[("nodes", 0, "roles")] == (9, 19)
    assert src.positions[("nodes", 0, "roles", 0)] == (9, 27)


def test_where_prefers_the_key_and_falls_back_to_the_closest_parent() -> None:
    src = parse_text(NESTED, "f.yaml")
    assert src.where(("cluster", "name")) == (3, 3)  # the key, not the value
    assert src.where(("cluster", "admin_users", 0, "ssh_keys", 1)) == (8, 11)
    assert src.where(("cluster", "admin_users", 0, "uid")) == (5, 7)  # missing: the list item
    assert src.where(("cluster", "nope", "deeper")) == (2, 1)
    assert src.where(("nothing",)) == (1, 1)
    assert Source("x", {}).where(("a",)) == (0, 0)


def test_diag_formats_file_line_col_path_message() -> None:
    src = parse_text(NESTED, "dir/m.yaml")
    d = src.diag(("cluster", "admin_users", 0, "ssh_keys", 1), "bad key")
    assert d == Diagnostic("dir/m.yaml", 8, 11, "cluster.admin_users[0].ssh_keys[1]", "bad key")
    assert d.format() == "dir/m.yaml:8:11: cluster.admin_users[0].ssh_keys[1]: bad key"
    w = src.diag(("cluster",), "hmm", "warning")
    assert w.format() == "dir/m.yaml:2:1: warning: cluster: hmm"


def test_dotted() -> None:
    assert dotted(()) == ""
    assert dotted(("nodes", 0, "bmc", "address")) == "nodes[0].bmc.address"
    assert dotted(("a", 1, 2, "b")) == "a[1][2].b"


def test_diagnostic_format_without_position_or_path() -> None:
    assert Diagnostic("m.yaml", 0, 0, "", "no such file").format() == "m.yaml: no such file"
    assert Diagnostic("m.yaml", 4, 0, "a", "x").format() == "m.yaml:4:1: a: x"


def test_manifest_error_sorts_diagnostics_by_position() -> None:
    late = Diagnostic("m.yaml", 9, 1, "b", "late")
    early = Diagnostic("m.yaml", 2, 5, "a", "early")
    err = ManifestError([late, early])
    assert err.diagnostics == [early, late]
    assert str(err).splitlines() == [early.format(), late.format()]


# --------------------------------------------------------------------------- duplicates, tabs
def test_duplicate_key_names_the_first_line() -> None:
    text = "version: 1\ncluster:\n  name: a\n  domain: x.org\n  name: b\n"
    d = _one(text)
    assert (d.line, d.col) == (5, 3)
    assert d.path == "cluster.name"
    assert "duplicate key (first defined on line 3)" in d.message


def test_duplicate_key_inside_a_list_item() -> None:
    text = "nodes:\n  - name: a\n    roles: [x]\n\n    name: b\n"
    d = _one(text)
    assert (d.line, d.path) == (5, "nodes[0].name")
    assert "first defined on line 2" in d.message


def test_every_duplicate_is_reported() -> None:
    text = "a: 1\nb: 2\na: 3\nb: 4\n"
    assert [(d.line, d.path) for d in _diags(text)] == [(3, "a"), (4, "b")]


def test_tab_indentation_is_a_positioned_error_with_a_hint() -> None:
    d = _one("version: 1\ncluster:\n\tname: x\n")
    assert d.line == 3
    assert "tabs" in d.message
    assert d.message.startswith("YAML syntax error")


def test_syntax_error_is_positioned() -> None:
    d = _one("version: 1\ncluster: {name: x\nnodes: []\n")
    assert (
        d.format() == "f.yaml:3:6: YAML syntax error: expected ',' or '}', but got ':' (while parsing a flow mapping)"
    )


# --------------------------------------------------------------------------- empty, odd documents
@pytest.mark.parametrize("text", ["", "   ", "\n\n\n", " \t\n  \n"])
def test_empty_or_whitespace_only(text: str) -> None:
    d = _one(text)
    assert "empty" in d.message
    assert d.format().startswith("f.yaml: ")


def test_comments_only_has_no_document() -> None:
    assert "no YAML document" in _one("# just a comment\n# another\n").message


def test_multi_document_points_at_the_second_document() -> None:
    d = _one("a: 1\n---\nb: 2\n")
    assert d.line == 3
    assert "more than one YAML document" in d.message


def test_leading_document_marker_is_fine() -> None:
    assert parse_text("---\na: 1\n", "f").data == {"a": 1}


@pytest.mark.parametrize(
    ("text", "kind"),
    [("- a\n- b\n", "list"), ("just a string\n", "str"), ("42\n", "int"), ("~\n", "nothing")],
)
def test_top_level_must_be_a_mapping(text: str, kind: str) -> None:
    d = _one(text)
    assert d.message == f"a manifest must be a YAML mapping, found {kind}"
    assert (d.line, d.col) == (1, 1)


def test_merge_keys_are_rejected_with_their_line() -> None:
    text = "base: &b {x: 1}\nother:\n  y: 2\n  <<: *b\n"
    d = _one(text)
    assert d.line == 4
    assert "merge keys" in d.message


def test_anchors_and_aliases_without_merge_work() -> None:
    src = parse_text("a: &x {u: 1}\nb: *x\n", "f")
    assert src.data == {"a": {"u": 1}, "b": {"u": 1}}
    assert src.key_positions[("b", "u")] == (1, 8)  # the alias' values come from the anchor


def test_alias_bomb_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    start = time.monotonic()
    d = _one("\n".join(lines) + "\n")
    assert time.monotonic() - start < 10
    assert "values" in d.message


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    depth = 5000
    d = _one("a: " + "[" * depth + "]" * depth + "\n")
    assert d.format().startswith("f.yaml")


@pytest.mark.parametrize(
    "text",
    [
        "a: !!bool foo\n",
        "a: !!int ''\n",
        "a: !!float ''\n",
        "a: !!timestamp foo\n",
        "a: 2024-13-45\n",
        "a: !!python/object:os.system x\n",
        "a: !custom x\n",
        "a: !!omap x\n",
        "a: [1, !!set x]\n",
    ],
)
def test_bad_tagged_scalars_are_one_line_diagnostics(text: str) -> None:
    d = _one("version: 1\n" + text)
    assert d.line == 2
    assert d.message.startswith("bad value")
    assert "\n" not in d.format()


@pytest.mark.parametrize("text", ["[a]: 1\n", "{a: 1}: 2\n", "~: 1\n", "true: 1\n", "2020-01-01: 1\n"])
def test_mapping_keys_must_be_plain(text: str) -> None:
    d = _one("version: 1\n" + text)
    assert d.line == 2
    assert "mapping keys" in d.message


def test_numeric_keys_become_strings() -> None:
    assert parse_text("1: a\n2.5: b\n", "f").data == {"1": "a", "2.5": "b"}


def test_yaml11_off_is_a_bool_at_the_source_level() -> None:
    data = parse_text("atime: off\nsync: on\nx: yes\ny: 'off'\n", "f").data
    assert data == {"atime": False, "sync": True, "x": True, "y": "off"}


# --------------------------------------------------------------------------- files
def test_read_source_ok(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\n")
    src = read_source(path)
    assert src.file == str(path)
    assert src.data == {"version": 1}


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(b"\xef\xbb\xbfversion: 1\nname: caf\xc3\xa9\n")
    assert read_source(path).data == {"version": 1, "name": "café"}


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    d = _read_error(path)
    assert d.format() == f"{path}: no such file"


def test_directory(tmp_path: Path) -> None:
    assert "directory" in _read_error(tmp_path).message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\n")
    path.chmod(0)
    assert "permission denied" in _read_error(path).message


def test_binary_file_with_nul(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(b"version: 1\n\x00\x01\x02")
    assert "binary" in _read_error(path).message


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(b"version: 1\ncluster:\n  name: caf\xe9\n")
    d = _read_error(path)
    assert d.line == 3
    assert "UTF-8" in d.message
    assert d.format().startswith(f"{path}:3:1: ")


def test_too_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_mod, "MAX_MANIFEST_BYTES", 16)
    path = tmp_path / "m.yaml"
    path.write_text("version: 1\ncluster: {name: abcdef}\n")
    assert "too large" in _read_error(path).message


def test_parse_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("a: 1\na: 2\n")
    d = _read_error(path)
    assert d.format().startswith(f"{path}:2:1: a: duplicate key")


# --------------------------------------------------------------------------- endless and blocking inputs
def test_an_endless_stream_stops_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_mod, "MAX_MANIFEST_BYTES", 1024 * 1024)
    start = time.monotonic()
    d = _read_error(Path("/dev/zero"))  # endless: the cap is checked while reading, not after
    assert d.format() == "/dev/zero: file is too large for a manifest (over 1 MiB)"
    assert time.monotonic() - start < 5


def test_a_fifo_without_a_writer_fails_within_the_read_timeout(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_mod, "READ_TIMEOUT", 0.5)
    fifo = tmp_path / "m.yaml"
    os.mkfifo(fifo)
    start = time.monotonic()
    d = _read_error(fifo)
    assert time.monotonic() - start < 5
    assert d.format().startswith(f"{fifo}: no end of the file after 0.5 s (a FIFO or pipe with no writer")


def test_a_fifo_whose_writer_never_closes_fails_within_the_read_timeout(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_mod, "READ_TIMEOUT", 0.5)
    fifo = tmp_path / "m.yaml"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # holds the write end open (O_RDWR does not block on a FIFO)
    try:
        os.write(writer, b"version: 1\n")
        assert "no end of the file after 0.5 s" in _read_error(fifo).message
    finally:
        os.close(writer)


def test_a_fifo_with_a_writer_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "m.yaml"
    os.mkfifo(fifo)
    # the writer's open blocks until the reader is there; then it writes and closes
    writer = subprocess.Popen(["sh", "-c", 'printf "version: 1\\ncluster: {name: x}\\n" > "$1"', "sh", str(fifo)])
    try:
        assert read_source(fifo).data == {"version": 1, "cluster": {"name": "x"}}
    finally:
        writer.kill()
        writer.wait(timeout=10)


# --------------------------------------------------------------------------- libyaml and the pure-Python loader
@pytest.mark.parametrize("name", ["llm-200k.yaml", "music-lab.yaml"])
def test_libyaml_gives_the_same_data_and_positions(kit: object, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big manifests compose with libyaml (3x faster, issue 27 item 15); what they give must
    be exactly what the pure-Python loader gives."""
    assert source_mod._FAST_LOADER is not None  # PyYAML built with libyaml (its wheels are)
    text = (Path(__file__).resolve().parents[2] / "examples" / name).read_text()
    fast = parse_text(text, name)
    monkeypatch.setattr(source_mod, "_FAST_LOADER", None)
    slow = parse_text(text, name)
    assert (fast.data, fast.positions, fast.key_positions) == (slow.data, slow.positions, slow.key_positions)


def test_a_file_libyaml_refuses_gets_the_pure_python_message() -> None:
    d = _one("a: [1\nb: 2\n")
    assert "expected ',' or ']', but got ':'" in d.message  # libyaml: "did not find expected ',' or ']'"
