"""The TCG speed probe's kernel: a valid multiboot header and a loop that ends where it should."""

from __future__ import annotations

import shutil
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tcg_probe


def test_the_header_is_a_multiboot_header_with_load_addresses() -> None:
    image = tcg_probe.kernel(1000)
    magic, flags, checksum, header_addr, load, load_end, bss_end, entry = struct.unpack("<8I", image[:32])
    assert magic == 0x1BADB002
    assert (magic + flags + checksum) & 0xFFFFFFFF == 0
    assert flags & (1 << 16)  # the a.out kludge: qemu loads a flat binary by these addresses
    assert header_addr == load == tcg_probe.LOAD_ADDRESS
    assert load_end == bss_end == load + len(image)
    assert entry == load + 32  # the code right after the header


def test_the_loop_count_is_the_first_instruction_and_the_jump_closes_the_loop() -> None:
    code = tcg_probe.loop_code(123456)
    assert code[0] == 0xB9 and struct.unpack("<I", code[1:5])[0] == 123456
    jnz = code.index(b"\x75")
    body_start = 5 + 2 + 5  # after mov ecx / xor eax / mov ebx
    assert jnz + 2 + struct.unpack("<b", code[jnz + 1:jnz + 2])[0] == body_start
    assert code.endswith(b"\xef\xf4\xeb\xfd")  # out to the exit port, then halt for good


@pytest.mark.parametrize("bad", [0, -1, 2**32])
def test_an_impossible_count_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="iterations"):
        tcg_probe.kernel(bad)


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="no qemu (the test bed installs it)")
def test_qemu_runs_the_probe_to_its_exit_port() -> None:
    took = tcg_probe.probe(1_000_000)
    assert 0 < took < tcg_probe.TIMEOUT
