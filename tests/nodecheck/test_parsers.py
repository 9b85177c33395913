"""provisioner.nodecheck.parsers (those several areas share) on recorded output, failures included."""

from __future__ import annotations

import pytest

from provisioner.nodecheck import parsers
from provisioner.nodecheck.parsers import ParseError

ALL_REDUCE = """\
# nThread 1 nGpus 2 minBytes 8 maxBytes 268435456 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1
#  Rank  0 Group  0 Pid  41230 on      gpu01 device  0 [0x4f] NVIDIA RTX A6000
#  Rank  1 Group  0 Pid  41230 on      gpu01 device  1 [0x52] NVIDIA RTX A6000
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
   134217728      33554432     float     sum      -1   2780.1   48.28   48.28      0   2779.6   48.29   48.29      0
   268435456      67108864     float     sum      -1   5551.9   48.35   48.35      0   5550.8   48.36   48.36      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 24.1312
#
"""
ALL_REDUCE_WRONG = ALL_REDUCE.replace("# Out of bounds values : 0 OK", "# Out of bounds values : 12 FAILED")


def test_all_reduce_summary() -> None:
    assert parsers.parse_all_reduce(ALL_REDUCE) == parsers.AllReduce(24.1312, 0)
    assert parsers.parse_all_reduce(ALL_REDUCE_WRONG).out_of_bounds == 12
    with pytest.raises(ParseError, match="Avg bus bandwidth"):
        parsers.parse_all_reduce("gpu01: Test CUDA failure common.cu:892 'no CUDA-capable device is detected'\n")


def test_context() -> None:
    assert parsers.parse_context("container=podman\ngpu_devices=0\n") == parsers.NodeContext("podman", 0)
    assert parsers.parse_context("container=none\ngpu_devices=8\n") == parsers.NodeContext("", 8)
    with pytest.raises(ParseError):
        parsers.parse_context("sh: systemd-detect-virt: not found\n")
