"""provisioner.manifest.ranges: host ranges, address increments."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.manifest.ranges import (
    MAX_RANGE,
    RangeError,
    add_ip,
    add_mac,
    contract,
    expand,
    expand_all,
    is_range,
    listed,
    normalize_mac,
    range_size,
)


def test_plain_name_expands_to_itself() -> None:
    assert expand("head01") == ["head01"]
    assert not is_range("head01")


def test_zero_padding_is_kept() -> None:
    assert expand("gpu[01-04]") == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert expand("n[008-011]") == ["n008", "n009", "n010", "n011"]


def test_no_padding_without_leading_zero() -> None:
    assert expand("gpu[1-3]") == ["gpu1", "gpu2", "gpu3"]
    assert expand("gpu[8-11]") == ["gpu8", "gpu9", "gpu10", "gpu11"]


def test_padding_width_comes_from_the_low_bound() -> None:
    assert expand("n[09-10]") == ["n09", "n10"]
    assert expand("n[0-2]") == ["n0", "n1", "n2"]  # a single "0" is not padding


def test_suffix_and_single_item() -> None:
    assert expand("ata-ST6000_[1-3]-part1") == ["ata-ST6000_1-part1", "ata-ST6000_2-part1", "ata-ST6000_3-part1"]
    assert expand("x[5-5]") == ["x5"]


@pytest.mark.parametrize(
    "text",
    ["gpu[01-04", "gpu01-04]", "gpu[a-b]", "gpu[1-2][3-4]", "gpu[]", "gpu[1]", "gpu[-1-2]", "gpu[1,2]", "[[1-2]]"],
)
def test_bad_ranges(text: str) -> None:
    assert is_range(text)
    with pytest.raises(RangeError, match="bad range"):
        expand(text)


def test_reversed_range() -> None:
    with pytest.raises(RangeError, match="4 is below 9"):
        expand("gpu[9-4]")


def test_too_large_range() -> None:
    assert len(expand(f"n[1-{MAX_RANGE}]")) == MAX_RANGE
    with pytest.raises(RangeError, match="too large"):
        expand(f"n[1-{MAX_RANGE + 1}]")
    with pytest.raises(RangeError, match="too large"):
        expand("n[0-99999999999999999999999]")


def test_expand_all_and_range_size() -> None:
    assert expand_all(["a", "b[1-2]", "c"]) == ["a", "b1", "b2", "c"]
    assert range_size("b[01-16]") == 16
    assert range_size("b") == 1


def test_add_ip() -> None:
    ip = ipaddress.IPv4Address("10.0.0.254")
    assert add_ip(ip, 0) == ip
    assert add_ip(ip, 1) == ipaddress.IPv4Address("10.0.0.255")
    assert add_ip(ip, 3) == ipaddress.IPv4Address("10.0.1.1")  # carries into the next octet


def test_add_ip_overflow() -> None:
    top = ipaddress.IPv4Address("255.255.255.254")
    assert add_ip(top, 1) == ipaddress.IPv4Address("255.255.255.255")
    with pytest.raises(RangeError, match="leaves the IPv4 address space"):
        add_ip(top, 2)


def test_add_mac() -> None:
    assert add_mac("52:54:00:12:34:56", 0) == "52:54:00:12:34:56"
    assert add_mac("52:54:00:12:34:56", 1) == "52:54:00:12:34:57"
    assert add_mac("52:54:00:12:34:ff", 1) == "52:54:00:12:35:00"  # carry
    assert add_mac("00:00:00:00:00:00", 255) == "00:00:00:00:00:ff"


def test_add_mac_overflow() -> None:
    assert add_mac("ff:ff:ff:ff:ff:fe", 1) == "ff:ff:ff:ff:ff:ff"
    with pytest.raises(RangeError, match="overflows"):
        add_mac("ff:ff:ff:ff:ff:ff", 1)


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("52:54:00:AB:CD:EF", "52:54:00:ab:cd:ef"),
        ("52-54-00-ab-cd-ef", "52:54:00:ab:cd:ef"),
        (" 52:54:00:00:00:01 ", "52:54:00:00:00:01"),
    ],
)
def test_normalize_mac(raw: str, norm: str) -> None:
    assert normalize_mac(raw) == norm


@pytest.mark.parametrize("raw", ["52:54:00:12:34", "52:54:00:12:34:567", "zz:54:00:12:34:56", "525400123456", ""])
def test_normalize_mac_rejects(raw: str) -> None:
    with pytest.raises(ValueError, match="not a MAC address"):
        normalize_mac(raw)


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(0, 5000), count=st.integers(1, 200), pad=st.booleans())
def test_expand_properties(lo: int, count: int, pad: bool) -> None:
    hi = lo + count - 1
    width = max(len(str(hi)), 2)
    lo_s = str(lo).zfill(width) if pad else str(lo)
    names = expand(f"n[{lo_s}-{hi}]")
    assert len(names) == count
    assert len(set(names)) == count
    assert [int(n[1:]) for n in names] == list(range(lo, hi + 1))
    if pad and lo_s.startswith("0") and len(lo_s) > 1:
        assert all(len(n) - 1 >= len(lo_s) for n in names)


def test_contract_merges_runs_of_consecutive_names() -> None:
    assert contract(["gpu01", "gpu02", "gpu03", "head"]) == ["gpu[01-03]", "head"]
    assert contract(["gpu9", "gpu10", "gpu11", "gpu13"]) == ["gpu[9-11]", "gpu13"]
    assert contract(["n1", "n02", "n3"]) == ["n1", "n02", "n3"]  # padding differs: no range expands to both
    assert contract(["a1", "b2", "b3", "b3"]) == ["a1", "b[2-3]", "b3"]
    assert contract([]) == []


def test_listed_names_are_contracted_and_capped() -> None:
    """A message naming 2,000 nodes was one line of every name (issue 27 item 13)."""
    assert listed(["gpu01", "gpu02", "head"]) == "gpu[01-02], head"
    names = [f"n{i}" for i in range(0, 4000, 2)]  # no two consecutive: no range
    assert listed(names, most=3) == "n0, n2, n4 and 1,997 more"
    assert listed(["a1", "a2", "b", "c1", "c2", "c3"], most=2) == "a[1-2], b and 3 more"
    assert listed([]) == ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu", "n", "x-", ""]), st.integers(0, 120), st.booleans()),
                max_size=40))
def test_contract_expands_back_to_the_names(parts: list[tuple[str, int, bool]]) -> None:
    names = [f"{prefix}{num:03d}" if pad else f"{prefix}{num}" for prefix, num, pad in parts]
    names = [n for n in names if n]  # a manifest has no empty names
    assert [name for item in contract(names) for name in expand(item)] == names
