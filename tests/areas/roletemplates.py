"""A role's template rendered as Ansible's template module renders it (trim_blocks, strict
undefined, the trailing newline kept), and its lines without comments: shared by the areas'
role-variable tests. And a role's own module (``library/``), loaded for its pure parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2

ROOT = Path(__file__).resolve().parents[2]


def render(role: str, template: str, variables: dict[str, Any]) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / "roles" / role / "templates"),
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template(template).render(**variables)


def body(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def role_module(role: str, name: str) -> ModuleType:
    """``roles/<role>/library/<name>.py`` as a Python module (its helpers are pure)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "roles" / role / "library" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
