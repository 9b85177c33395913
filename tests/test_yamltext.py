"""provisioner.yamltext: the text of yaml.safe_dump / yaml.dump on libyaml, faster."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner import yamltext

# Strings that YAML reads as something else, need quotes, or are folded at the width.
TRICKY = ["", "null", "~", "yes", "No", "on", "0755", "1e3", "0x1f", "1_000", "12:30:00", "2024-01-01", "-",
          "- item", "key: value", "# hash", "a #b", "'q'", '"d"', "{x}", "[y]", "*star", "&amp", "!bang",
          "%pct", "@at", "`tick`", "|", ">", "?", ":", " lead", "trail ", "52:54:00:00:01:03", "10.0.0.1/24",
          "ssh-ed25519 AAAA ops@laptop", "a" * 1200, "x " * 600, "k" * 130, "tab\there", "line\nbreak",
          "two\n\nlines\n", "é", "k€y", "ops@läptop {{ x }}", "\u2028", "\x85"]
SCALARS = st.one_of(
    st.sampled_from(TRICKY), st.text(max_size=40), st.text(alphabet=" :#-'\"{}[]!&*?|>%@`,\\/=~.0a9", max_size=120),
    st.integers(-(10**12), 10**12), st.booleans(), st.none(), st.floats(allow_nan=False),
)
KEYS = st.one_of(st.sampled_from(TRICKY), st.text(max_size=12), st.integers(), st.booleans(), st.none())
DATA = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                     st.dictionaries(KEYS, inner, max_size=5)), max_leaves=30)
TOP = st.one_of(st.dictionaries(KEYS, DATA, max_size=6), DATA)
WIDTHS = st.sampled_from([None, 40, 80, 100, 1000])


class Marked(str):
    """Stands in for the inventory's !unsafe strings."""


class MarkedDumper(yaml.CSafeDumper):
    pass


MarkedDumper.add_representer(Marked, lambda d, v: d.represent_scalar("!marked", str(v), style="|"))


def _marked(data: Any, flip: list[bool]) -> Any:
    """Some strings of ``data`` as Marked."""
    if isinstance(data, dict):
        return {k: _marked(v, flip) for k, v in data.items()}
    if isinstance(data, list):
        return [_marked(v, flip) for v in data]
    if isinstance(data, str):
        flip[0] = not flip[0]
        return Marked(data) if flip[0] else data
    return data


@settings(max_examples=300, deadline=None)  # 20,000 passed once, by hand
@given(data=TOP, width=WIDTHS)
def test_safe_dump_is_pyyamls_text(data: Any, width: int | None) -> None:
    expected = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=width)
    assert yamltext.safe_dump(data, width=width) == expected


@settings(max_examples=300, deadline=None)
@given(data=TOP, width=WIDTHS, sort_keys=st.booleans(), allow_unicode=st.booleans())
def test_libyaml_dump_is_the_dumpers_text(data: Any, width: int | None, sort_keys: bool, allow_unicode: bool) -> None:
    data = _marked(data, [False])
    expected = yaml.dump(data, Dumper=MarkedDumper, sort_keys=sort_keys, default_flow_style=False, width=width,
                         allow_unicode=allow_unicode)
    got = yamltext.libyaml_dump(data, dumper=MarkedDumper, sort_keys=sort_keys, width=width,
                                allow_unicode=allow_unicode, tagged={Marked: ("!marked", "|")})
    assert got == expected


def test_a_shared_container_takes_pyyamls_path() -> None:
    shared = {"a": 1}
    data = {"x": shared, "y": shared, "z": [shared]}
    text = yamltext.safe_dump(data)
    assert "&id001" in text
    assert text == yaml.safe_dump(data, sort_keys=False)


def test_a_seed_with_a_non_ascii_key_comment() -> None:
    """libyaml folds long escaped strings unlike PyYAML: those seeds take PyYAML's path."""
    key = "ssh-rsa " + "A" * 1100 + " jürgen@laptop"
    data = {"autoinstall": {"user-data": {"users": [{"name": "root", "ssh_authorized_keys": [key]}]}}}
    assert yamltext.safe_dump(data, width=1000) == yaml.safe_dump(data, sort_keys=False, width=1000)
    assert yamltext.libyaml_dump(data, dumper=yaml.CSafeDumper, sort_keys=True, width=1000, allow_unicode=False,
                                 tagged={}) == yaml.dump(data, Dumper=yaml.CSafeDumper, width=1000)
