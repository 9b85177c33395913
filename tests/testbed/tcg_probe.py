"""How fast this machine runs code under qemu's software emulation (TCG), in one number.

The VM lab's guests run under TCG (no KVM on our machines), so its time follows the CPU:
scripts/test.sh prints this beside the CPU model at the start of a run and in its timing
table, and docs/testing.md keeps the stage times per machine kind with it.

The probe boots a tiny multiboot kernel (made here, 80 bytes: no file to ship or fetch)
that runs a fixed loop of loads, adds and stores through the emulated MMU and then exits
qemu through the isa-debug-exit port. It prints ``N M loops/s`` (higher is faster) and the
seconds it took, qemu's start included (~0.1 s).

    python3 tests/testbed/tcg_probe.py [ITERATIONS]
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOAD_ADDRESS = 0x100000  # where qemu's multiboot loader puts the kernel (1 MiB)
BUFFER = 0x200000  # the loop's 256 KiB of guest memory
MULTIBOOT_MAGIC = 0x1BADB002
MULTIBOOT_AOUT_KLUDGE = 1 << 16  # load addresses in the header: a flat binary, no ELF
DEBUG_EXIT_PORT = 0xF4
DEFAULT_ITERATIONS = 300_000_000  # ~2 s on an AMD EPYC (2026)
TIMEOUT = 120.0


def loop_code(iterations: int) -> bytes:
    """32-bit code: ``iterations`` rounds of load/add/store over a 256 KiB buffer, then a
    write of 0 to the debug-exit port (qemu exits with status 1)."""
    body = (
        b"\x89\xca"                        # mov edx, ecx
        b"\x81\xe2\xff\xff\x00\x00"        # and edx, 0xffff
        b"\x03\x04\x93"                    # add eax, [ebx+edx*4]
        b"\x01\xc8"                        # add eax, ecx
        b"\x89\x04\x93"                    # mov [ebx+edx*4], eax
        b"\x49"                            # dec ecx
    )
    jump_back = b"\x75" + struct.pack("<b", -(len(body) + 2))  # jnz to the start of body
    return (
        b"\xb9" + struct.pack("<I", iterations)  # mov ecx, iterations
        + b"\x31\xc0"                             # xor eax, eax
        + b"\xbb" + struct.pack("<I", BUFFER)     # mov ebx, BUFFER
        + body + jump_back
        + b"\x66\xba" + struct.pack("<H", DEBUG_EXIT_PORT)  # mov dx, port
        + b"\xb8\x00\x00\x00\x00"                 # mov eax, 0
        + b"\xef"                                 # out dx, eax
        + b"\xf4\xeb\xfd"                         # hlt; jmp hlt
    )


def kernel(iterations: int) -> bytes:
    """A multiboot (v1) kernel with the a.out kludge: header, then the code, loaded at 1 MiB."""
    if not 0 < iterations < 2**32:
        raise ValueError(f"iterations must be 1..{2**32 - 1}, not {iterations}")
    code = loop_code(iterations)
    header_size = 32
    end = LOAD_ADDRESS + header_size + len(code)
    checksum = -(MULTIBOOT_MAGIC + MULTIBOOT_AOUT_KLUDGE) & 0xFFFFFFFF
    header = struct.pack("<8I", MULTIBOOT_MAGIC, MULTIBOOT_AOUT_KLUDGE, checksum,
                         LOAD_ADDRESS, LOAD_ADDRESS, end, end, LOAD_ADDRESS + header_size)
    return header + code


def qemu_command(kernel_path: Path) -> list[str]:
    return ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "16", "-display", "none",
            "-nodefaults", "-no-reboot", "-device", f"isa-debug-exit,iobase={DEBUG_EXIT_PORT:#x},iosize=4",
            "-kernel", str(kernel_path)]


def probe(iterations: int = DEFAULT_ITERATIONS) -> float:
    """Seconds qemu took to run the loop; raises RuntimeError when it did not run to its end."""
    with tempfile.TemporaryDirectory(prefix="tcg-probe.") as tmp:
        path = Path(tmp) / "probe.bin"
        path.write_bytes(kernel(iterations))
        start = time.monotonic()
        r = subprocess.run(qemu_command(path), capture_output=True, text=True, timeout=TIMEOUT)
        took = time.monotonic() - start
    if r.returncode != 1:  # isa-debug-exit: (0 << 1) | 1
        raise RuntimeError(f"qemu exited {r.returncode}, not through the probe's exit port: {r.stderr.strip()}")
    return took


def main(argv: list[str]) -> int:
    iterations = int(argv[1]) if len(argv) > 1 else DEFAULT_ITERATIONS
    if shutil.which("qemu-system-x86_64") is None:
        print("TCG probe: no qemu-system-x86_64")
        return 1
    try:
        took = probe(iterations)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"TCG probe: failed: {exc}")
        return 1
    print(f"TCG probe: {iterations / took / 1e6:.0f} M loops/s ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
