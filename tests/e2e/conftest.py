"""The end-to-end tests share their podman and state helpers (tests/e2e/e2ekit.py), imported
as a module from this folder (pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
