"""Fault suite: endless and blocking manifests through the real `provision` CLI (issue 27).

Each case runs ``python -m provisioner.cli`` in a subprocess with a hard bound (and an
address-space limit, so a regression cannot eat the machine's memory) and asserts one clear
line and exit 1, never a hang or a traceback.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from provisioner.manifest.source import READ_TIMEOUT

MEMORY_LIMIT = 2 * 1024**3  # bytes of address space for the command under test


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def provision(*argv: str, bound: float) -> tuple[int, str, float]:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "provisioner.cli", *argv], capture_output=True, text=True,
                       timeout=bound, preexec_fn=_limit_memory, stdin=subprocess.DEVNULL, check=False)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - start


def test_validate_of_an_endless_stream_stops_at_the_cap() -> None:
    rc, said, took = provision("validate", "/dev/zero", bound=30)
    assert (rc, said) == (1, "/dev/zero: file is too large for a manifest (over 2 MiB)\n")
    assert took < 20


def test_validate_of_a_fifo_without_a_writer_ends_within_the_read_timeout(tmp_path: Path) -> None:
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    rc, said, took = provision("validate", str(fifo), bound=READ_TIMEOUT + 20)
    assert rc == 1
    assert said.startswith(f"{fifo}: no end of the file after {READ_TIMEOUT:g} s") and said.count("\n") == 1
    assert took < READ_TIMEOUT + 10


def test_validate_of_a_fifo_fed_by_a_writer_works(tmp_path: Path) -> None:
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    text = (Path(__file__).resolve().parents[2] / "examples" / "llm-200k.yaml").read_bytes()
    writer = subprocess.Popen(["sh", "-c", 'cat > "$1"', "sh", str(fifo)], stdin=subprocess.PIPE)
    try:
        assert writer.stdin is not None
        writer.stdin.write(text)
        writer.stdin.close()
        rc, said, _ = provision("validate", str(fifo), bound=60)
        assert rc == 0, said
    finally:
        writer.kill()
        writer.wait(timeout=10)
