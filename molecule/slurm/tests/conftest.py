"""The slurm scenario's testinfra modules share their helpers (slurmkit.py beside them),
imported as a module from this folder (pytest runs with --import-mode=importlib, which puts
no test folder on sys.path; tests/e2e/conftest.py does the same)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
