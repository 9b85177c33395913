"""`provision --version`: our version and the Ansible we drive, from the installed
distributions' metadata (importing ansible itself takes a second)."""

from __future__ import annotations

import platform
from importlib import metadata


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def version_line() -> str:
    """E.g. ``provision 0.1.0 (ansible-core 2.19.14, ansible 12.3.0, python 3.11.7)``."""
    parts = [f"{name} {installed(name) or 'not installed'}" for name in ("ansible-core", "ansible")]
    parts.append(f"python {platform.python_version()}")
    return f"provision {installed('provisioner') or 'unknown'} ({', '.join(parts)})"
