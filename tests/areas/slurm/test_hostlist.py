"""provisioner.areas.slurm.hostlist: names to slurm.conf's compact form and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from provisioner.areas.slurm.hostlist import expand_hostlist, hostlist


@pytest.mark.parametrize(
    ("names", "expr"),
    [
        (["gpu01", "gpu02", "gpu03", "gpu04"], "gpu[01-04]"),
        (["gpu1", "gpu2", "gpu3"], "gpu[1-3]"),
        (["gpu1"], "gpu1"),
        (["gpu01", "gpu02", "gpu04"], "gpu[01-02,04]"),
        (["gpu9", "gpu10", "gpu11"], "gpu[9-11]"),
        (["head", "gpu01", "gpu02"], "head,gpu[01-02]"),
        (["a1", "b1", "a2"], "a[1-2],b1"),
        (["n01", "n1"], "n01,n1"),  # padded and unpadded stay apart
        # a number as wide as the padded ones continues their run (was gpu[0998-0999],gpu1000)
        (["gpu0998", "gpu0999", "gpu1000", "gpu1001"], "gpu[0998-1001]"),
        (["n09", "n10", "n11", "n100"], "n[09-11],n100"),
        (["slurm-gpu01", "slurm-gpu02"], "slurm-gpu[01-02]"),
    ],
)
def test_hostlist(names: list[str], expr: str) -> None:
    assert hostlist(names) == expr
    assert sorted(expand_hostlist(expr)) == sorted(names)


@given(
    st.lists(
        st.tuples(st.sampled_from(["gpu", "node-", "cn", "x"]), st.integers(0, 120), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_hostlist_round_trip(items: list[tuple[str, int, bool]]) -> None:
    names = list(dict.fromkeys(f"{p}{n:03d}" if pad else f"{p}{n}" for p, n, pad in items))
    assert sorted(expand_hostlist(hostlist(names))) == sorted(names)


def test_expand_hostlist_rejects_garbage() -> None:
    for bad in ("gpu[01-02", "gpu[0x-2]", "gpu01]"):
        with pytest.raises(ValueError, match="bad hostlist"):
            expand_hostlist(bad)


def test_expand_hostlist_takes_several_brackets_per_item() -> None:
    assert expand_hostlist("rack[1-2]-n[1-2],head") == ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2", "head"]
