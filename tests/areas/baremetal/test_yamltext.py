"""provisioner.areas.baremetal.yamltext: the text of yaml.safe_dump, faster."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.areas.baremetal import yamltext

# Strings that YAML reads as something else, need quotes, or are folded at the width.
TRICKY = ["", "null", "~", "yes", "No", "on", "0755", "1e3", "0x1f", "1_000", "12:30:00", "2024-01-01", "-",
          "- item", "key: value", "# hash", "a #b", "'q'", '"d"', "{x}", "[y]", "*star", "&amp", "!bang",
          "%pct", "@at", "`tick`", "|", ">", "?", ":", " lead", "trail ", "52:54:00:00:01:03", "10.0.0.1/24",
          "ssh-ed25519 AAAA ops@laptop", "a" * 1200, "x " * 600, "tab\there", "line\nbreak", "é", "k€y",
          "ops@läptop {{ x }}", "\u2028", "\x85"]
SCALARS = st.one_of(
    st.sampled_from(TRICKY), st.text(max_size=40), st.text(alphabet=" :#-'\"{}[]!&*?|>%@`,\\/=~.0a9", max_size=120),
    st.integers(-(10**12), 10**12), st.booleans(), st.none(), st.floats(allow_nan=False),
)
KEYS = st.one_of(st.sampled_from(TRICKY), st.text(max_size=12), st.integers(), st.booleans(), st.none())
DATA = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                     st.dictionaries(KEYS, inner, max_size=5)), max_leaves=30)


@settings(max_examples=300, deadline=None)  # 20,000 passed once, by hand
@given(data=st.one_of(st.dictionaries(KEYS, DATA, max_size=6), DATA), width=st.sampled_from([None, 40, 80, 1000]))
def test_the_text_is_safe_dumps(data: Any, width: int | None) -> None:
    expected = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=width)
    assert yamltext.dump(data, width=width) == expected


def test_a_shared_container_takes_pyyamls_path() -> None:
    shared = {"a": 1}
    data = {"x": shared, "y": shared, "z": [shared]}
    text = yamltext.dump(data)
    assert "&id001" in text
    assert text == yaml.safe_dump(data, sort_keys=False)


def test_a_seed_with_a_non_ascii_key_comment(kit: Any) -> None:
    """libyaml folds long escaped strings unlike PyYAML: those seeds take PyYAML's path."""
    key = "ssh-rsa " + "A" * 1100 + " jürgen@laptop"
    data = {"autoinstall": {"user-data": {"users": [{"name": "root", "ssh_authorized_keys": [key]}]}}}
    assert yamltext.dump(data, width=1000) == yaml.safe_dump(data, sort_keys=False, width=1000)
