"""The storage decisions the zfs role runs on the controller, through its filter plugin
(roles/zfs/filter_plugins/zfs_storage.py imports this module), so the same code decides in
unit tests and on real machines.

The storage area's logic lives by concern beside this module: ``zfs`` (layouts, ``zpool``
arguments, drift), ``disks`` (disk safety), ``nfs`` (exports, mounts), ``mergerfs``,
``units`` (systemd unit names), ``base`` (the shared error and constants).
"""

from __future__ import annotations

from provisioner.areas.storage.disks import disk_safety, probes_from_ansible
from provisioner.areas.storage.zfs import create_args, importable_pools, status_drift

__all__ = ["create_args", "disk_safety", "importable_pools", "probes_from_ansible", "status_drift"]
