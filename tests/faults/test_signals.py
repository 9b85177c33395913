"""Fault suite: signals at several moments of the real CLI (issue 27 items 4 and 6).

Every case runs ``python -m provisioner.cli`` in a subprocess of its own session, bounded,
and asserts the message is one line with no traceback, the exit code is the shell's
128 + signal, and no child of the command survives it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

DELAYS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3)  # seconds after the start: imports take ~0.3-1 s


@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_at_any_moment_of_validate_is_one_line(write_cluster: Any, delay: float) -> None:
    """Ctrl-C while the command imports its modules printed a KeyboardInterrupt traceback."""
    manifest: Path = write_cluster()
    proc = subprocess.Popen([sys.executable, "-m", "provisioner.cli", "validate", str(manifest)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert "Traceback" not in err
    if proc.returncode == 0:  # it finished before the signal came
        return
    # killed before Python installed its handler (-2), or caught: one line, 130
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, err)
    if proc.returncode == 130:
        assert err == "interrupted (Ctrl-C)\n"
