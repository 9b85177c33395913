"""Variables for the ``backup`` role on the head node: the tool, its configuration, the
timer's schedule and where the operator's passphrase is on the control machine (a path,
never the value)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from provisioner.areas.backup.decide import (
    CONFIG_FILE,
    KEY_FILE,
    KEY_NAME,
    STAGING,
    TOOL_FILE,
    head,
    on_calendar,
    tool_config,
)
from provisioner.manifest.model import Manifest
from provisioner.manifest.nodes import Node

KEY_SOURCE = "{{ provision_state_dir }}/secrets/" + KEY_NAME


def tool_source() -> str:
    return (resources.files("provisioner.areas.backup") / "tool.py").read_text()


def cluster_vars(m: Manifest) -> dict[str, Any]:
    """Nothing without a backup section (states recorded before the area existed stay unchanged)."""
    if m.backup is None:
        return {}
    return {
        "backup_tool": {"content": tool_source()},  # file contents: the inventory writes them unsafe
        "backup_tool_file": TOOL_FILE,
        "backup_config": tool_config(m),
        "backup_config_file": CONFIG_FILE,
        "backup_key_source": KEY_SOURCE,
        "backup_key_file": KEY_FILE,
        "backup_staging": STAGING,
        "backup_on_calendar": on_calendar(m.backup) or "",
        "backup_timeout_s": m.backup.timeout_s,
    }


# The role runs in a light play (playbooks/backup.yml) on every apply: all its variables are
LIGHT_KEYS = frozenset({"backup_tool", "backup_tool_file", "backup_config", "backup_config_file", "backup_key_source",
                        "backup_key_file", "backup_staging", "backup_on_calendar", "backup_timeout_s"})


def node_vars(m: Manifest, node: Node) -> dict[str, Any]:
    return {}


def groups(m: Manifest) -> dict[str, set[str]]:
    """``backup_head``: the head node, when the manifest asks for backups."""
    return {"backup_head": {head(m).name} if m.backup is not None else set()}
