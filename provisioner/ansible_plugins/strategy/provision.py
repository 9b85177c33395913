"""Ansible strategy ``provision``: a base strategy (``linear``, or Mitogen's
``mitogen_linear``; environment variable ``PROVISION_STRATEGY_BASE``) with one change:
a play in which every host failed does not end the playbook.

Ansible's PlaybookExecutor stops the whole playbook when all hosts of a play's batch
failed. ``provision apply`` runs node-local plays only on the nodes that need them, so one
new node that fails (or cannot be reached) is often the only host of a play, and then the
cluster-wide plays after it (/etc/hosts, slurm.conf, exports) never run on anybody. Here
such a play ends as if by ``meta: end_play`` instead: failed hosts stay failed (later plays
skip them, the recap counts them), and the playbook goes on with its next play for
everyone else. Plays that stop on purpose (``any_errors_fatal``, ``max_fail_percentage``)
are left alone.

And the stall guard's cap: with ``PROVISION_TASK_CAP`` set (``provision apply
--stall-timeout N``), no task runs longer than N seconds on a node, also one whose role
gives it a larger ``timeout:`` of its own (a package step's 900 s): each task is queued
with the smaller of its own bound (templated with that host's variables) and N.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.loader import strategy_loader
from ansible.template import Templar

from provisioner.settings import TASK_CAP_ENV

BASE_ENV = "PROVISION_STRATEGY_BASE"
BASE_NAME = os.environ.get(BASE_ENV, "linear")
Base: Any = strategy_loader.get(BASE_NAME, class_only=True)
if Base is None:
    raise AnsibleError(f"strategy 'provision': base strategy {BASE_NAME!r} ({BASE_ENV}) was not found")


def whole_batch_failed(batch: list[str], failed: set[str], unreachable: set[str]) -> bool:
    """Every host of the play's batch failed or is unreachable (and there was one)."""
    return bool(batch) and all(h in failed or h in unreachable for h in batch)


def capped(own: int | None, cap: int | None) -> int | None:
    """The bound a task runs under: its own, never above the cap (none of its own: the cap)."""
    if not cap:
        return own
    return cap if not own or own > cap else own


def task_cap() -> int | None:
    value = os.environ.get(TASK_CAP_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


class StrategyModule(Base):  # type: ignore[misc]
    def __init__(self, tqm: Any) -> None:
        super().__init__(tqm)
        self._cap = task_cap()
        self._own_timeouts: dict[str, Any] = {}  # task uuid -> the task's timeout as written

    def _queue_task(self, host: Any, task: Any, task_vars: dict[str, Any], play_context: Any) -> Any:
        if self._cap:
            written = self._own_timeouts.setdefault(task._uuid, task.timeout)
            try:
                own = Templar(loader=self._loader, variables=task_vars).template(written)
                task.timeout = capped(int(own) if own else None, self._cap)
            except Exception:  # the worker reports a bad bound itself, naming its task
                task.timeout = written
        return super()._queue_task(host, task, task_vars, play_context)

    def run(self, iterator: Any, play_context: Any) -> Any:
        result = super().run(iterator, play_context)
        play = iterator._play
        stops_on_purpose = play.any_errors_fatal or play.max_fail_percentage is not None
        if result & self._tqm.RUN_FAILED_BREAK_PLAY or stops_on_purpose:
            return result
        batch = [h.name for h in self._inventory.get_hosts(play.hosts, order=play.order)]
        failed = set(iterator.get_failed_hosts())
        if whole_batch_failed(batch, failed, set(self._tqm._unreachable_hosts)):
            iterator.end_play = True  # TaskQueueManager raises AnsibleEndPlay: the next play runs
        return result
