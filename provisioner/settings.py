"""Defaults shared by the CLI and the runner, kept in a module that imports nothing heavy
(the CLI's start-up imports it)."""

from __future__ import annotations

# The stall guard: a task that has not finished on a node after this many seconds fails
# that node (Ansible's task timeout; the other nodes go on). Tasks that legitimately take
# longer (package installs, DKMS builds) carry their own, larger `timeout:` in the roles.
DEFAULT_STALL_TIMEOUT = 900

# Ansible execution strategies `provision apply --strategy` offers: Ansible's own linear
# strategy, or Mitogen's (one persistent Python per node instead of one per task).
STRATEGIES = ("linear", "mitogen")
