"""Defaults shared by the CLI and the runner, kept in a module that imports nothing heavy
(the CLI's start-up imports it)."""

from __future__ import annotations

# The stall guard: a task that has not finished on a node after this many seconds fails
# that node (Ansible's task timeout; the other nodes go on). Without --stall-timeout this
# bounds the tasks that have no bound of their own, and the roles' own `timeout:` (larger
# for package installs, downloads and DKMS builds) bounds the rest; --stall-timeout N bounds
# every task by N (the smaller of N and the task's own bound), through the `provision`
# strategy, which reads the cap from TASK_CAP_ENV.
DEFAULT_STALL_TIMEOUT = 900
TASK_CAP_ENV = "PROVISION_TASK_CAP"

# Ansible execution strategies `provision apply --strategy` offers: Ansible's own linear
# strategy, or Mitogen's (one persistent Python per node instead of one per task).
STRATEGIES = ("linear", "mitogen")
# Mitogen is the default: a node's first converge costs 1.26 x a bare `apt-get install` of
# the same packages under it and 2.86 x under linear (docs/benchmarks.md: each task's fresh
# Python on the node), and the molecule scenarios, the end-to-end apply and the VM lab run
# under it. `--strategy linear` (or PROVISION_STRATEGY=linear) is the fallback: Ansible's own
# strategy, for a node Mitogen cannot serve; the rolling end-to-end test keeps it proven.
DEFAULT_STRATEGY = "mitogen"
